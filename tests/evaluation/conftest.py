"""Fixtures for the evaluation tests (helpers live in eval_helpers.py, a uniquely named module)."""

import os

import pytest

from eval_helpers import FakeJudge


@pytest.fixture(autouse=True)
def _no_user_judge_env(monkeypatch):
    """The user's UNIGENBENCH_* settings (e.g. an official repo or a model name) must not change what tests see."""
    for key in [k for k in os.environ if k.startswith("UNIGENBENCH_")]:
        monkeypatch.delenv(key)


@pytest.fixture
def fake_judge():
    judge = FakeJudge()
    yield judge
    judge.close()
