"""Toy-world fixtures: the pre-trained toy DeepGen, built once into its cache (deepgen_rl.toy.model.toy_dir(),
i.e. $DEEPGEN_TOY_DIR or deepgen_toy next to $DEEPGEN_TINY_DIR) and reused by every later test and session.

Building it (toy-v3) takes ~5–6 CPU-minutes on one thread, so a clean clone's suite builds it once: the tests that need
it are moved to the front of the run (below), so that under pytest-xdist one worker builds while the other runs the
rest. DEEPGEN_TOY_TESTS=0 skips them (a quick local run); the world, checker, reward and toy metrics are always
tested.
"""

import os

import pytest

TOY_TESTS = os.environ.get("DEEPGEN_TOY_TESTS", "1") != "0"


def pytest_collection_modifyitems(config, items):
    """Tests that use the pre-trained toy model first (stable order otherwise): the build is the longest single
    task of a clean clone's suite, and started last it would run alone at the end."""
    items.sort(key=lambda item: "toy_model_paths" not in getattr(item, "fixturenames", ()))


@pytest.fixture(scope="session")
def toy_model_paths():
    if not TOY_TESTS:
        pytest.skip("DEEPGEN_TOY_TESTS=0: the tests that need the pre-trained toy DeepGen are skipped")
    from deepgen_rl.toy.model import ensure_toy_deepgen

    return ensure_toy_deepgen(progress=False)


@pytest.fixture(scope="session")
def toy_model(toy_model_paths):
    """The toy DeepGen loaded through build_model. Read-only: do not modify it in a test."""
    from deepgen_rl.models import build_model
    from deepgen_rl.toy.rl_run import TOY_MODEL_CONFIG

    return build_model(TOY_MODEL_CONFIG)
