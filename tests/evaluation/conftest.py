"""Fixtures for the evaluation tests (helpers live in eval_helpers.py, a uniquely named module)."""

import pytest

from eval_helpers import FakeJudge


@pytest.fixture
def fake_judge():
    judge = FakeJudge()
    yield judge
    judge.close()
