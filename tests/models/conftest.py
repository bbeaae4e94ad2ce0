"""Shared tiny-model fixtures for the model tests (CPU, offline)."""

import pytest

from deepgen_rl.models import build_model
from deepgen_rl.models.tiny import ensure_tiny_deepgen

from tests.models.paths import TINY_CONFIG


@pytest.fixture(scope="session")
def tiny_model_paths():
    """Paths of the cached tiny model (built once into tiny_dir())."""
    return ensure_tiny_deepgen()


@pytest.fixture(scope="session")
def tiny_model(tiny_model_paths):
    """The tiny DeepGen with its SFT-layout checkpoint loaded. Read-only: do not modify it in a test."""
    return build_model(TINY_CONFIG)
