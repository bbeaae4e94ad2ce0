"""The standalone UniGenBench judge (``python -m deepgen_rl.evaluation.unigenbench``) and the one HTTP retry policy
it shares with the reward clients load without torch (evaluation/__init__.py promises it; the judge runs on CPU
machines next to a vLLM server)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.trainer.helpers import ROOT, subprocess_env


@pytest.mark.parametrize("module", ["deepgen_rl.evaluation.unigenbench", "deepgen_rl.utils.http"])
def test_importing_the_judge_does_not_import_torch(module):
    code = f"import sys, {module}; print(sorted(m for m in ('torch', 'transformers', 'diffusers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=subprocess_env(), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"{module} imports {out.stdout.strip()}"


def test_the_judge_uses_the_shared_retry_policy():
    from deepgen_rl.evaluation import unigenbench
    from deepgen_rl.utils import http

    assert unigenbench.post_json_with_retries is http.post_json_with_retries
    assert unigenbench.RequestFailed is http.RequestFailed
