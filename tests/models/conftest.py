"""Shared tiny-model fixtures for the model tests (CPU, offline)."""

from pathlib import Path

import pytest

from deepgen_rl.models import build_model
from deepgen_rl.models.tiny import ensure_tiny_deepgen

REPO = Path(__file__).resolve().parents[2]
TINY_CONFIG = str(REPO / "configs/models/deepgen_tiny.py")
REAL_CONFIG = str(REPO / "configs/models/deepgen_sd35m_qwen25vl3b.py")


@pytest.fixture(scope="session")
def tiny_model_paths():
    """Paths of the cached tiny model (built once into tiny_dir())."""
    return ensure_tiny_deepgen()


@pytest.fixture(scope="session")
def tiny_model(tiny_model_paths):
    """The tiny DeepGen with its SFT-layout checkpoint loaded. Read-only: do not modify it in a test."""
    return build_model(TINY_CONFIG)
