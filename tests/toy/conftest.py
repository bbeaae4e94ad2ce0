"""Toy-world fixtures: the pre-trained toy DeepGen, built once into its cache (deepgen_rl.toy.model.toy_dir(),
i.e. $DEEPGEN_TOY_DIR or deepgen_toy next to $DEEPGEN_TINY_DIR) and reused by every later test and session."""

import pytest


@pytest.fixture(scope="session")
def toy_model_paths():
    from deepgen_rl.toy.model import ensure_toy_deepgen

    return ensure_toy_deepgen(progress=False)


@pytest.fixture(scope="session")
def toy_model(toy_model_paths):
    """The toy DeepGen loaded through build_model. Read-only: do not modify it in a test."""
    from deepgen_rl.models import build_model
    from deepgen_rl.toy.rl_run import TOY_MODEL_CONFIG

    return build_model(TOY_MODEL_CONFIG)
