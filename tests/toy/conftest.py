"""Toy-world fixtures: the pre-trained toy DeepGen, built once into its cache (deepgen_rl.toy.model.toy_dir(),
i.e. $DEEPGEN_TOY_DIR or deepgen_toy next to $DEEPGEN_TINY_DIR) and reused by every later test and session.

Building it takes 13–26 CPU-minutes (measured on 1 thread, idle vs contended), more than the suite's budget allows on a
2-core CI machine, so the tests that need the pre-trained model run only with DEEPGEN_TOY_TESTS=1 (the world, the
checker, the reward and the toy metrics are always tested). Run them with: DEEPGEN_TOY_TESTS=1 bash scripts/test.sh
tests/toy
"""

import os

import pytest

TOY_TESTS = os.environ.get("DEEPGEN_TOY_TESTS") == "1"


@pytest.fixture(scope="session")
def toy_model_paths():
    if not TOY_TESTS:
        pytest.skip("needs the pre-trained toy DeepGen (13–26 CPU-minutes to build): set DEEPGEN_TOY_TESTS=1")
    from deepgen_rl.toy.model import ensure_toy_deepgen

    return ensure_toy_deepgen(progress=False)


@pytest.fixture(scope="session")
def toy_model(toy_model_paths):
    """The toy DeepGen loaded through build_model. Read-only: do not modify it in a test."""
    from deepgen_rl.models import build_model
    from deepgen_rl.toy.rl_run import TOY_MODEL_CONFIG

    return build_model(TOY_MODEL_CONFIG)
