"""Paths of the model tests (imported as ``tests.models.paths``: two folders have a conftest.py, so importing
``conftest`` by name depends on collection order)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TINY_CONFIG = str(REPO / "configs/models/deepgen_tiny.py")
REAL_CONFIG = str(REPO / "configs/models/deepgen_sd35m_qwen25vl3b.py")
