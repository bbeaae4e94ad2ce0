"""Where the real public data lives in CI (``../shared/data`` beside the checkout) and the skip marker for it.

A user's clone has no ``../shared``: every test that reads it uses ``needs_shared_data`` (or a ``skipif`` on
``SHARED_DATA.is_dir()``) and is skipped with the reason below (``bash scripts/download_data.sh`` fetches the same
public files into assets/ instead). This module is the one place that spells that path (tests/test_fresh_clone.py
checks it); ``DEEPGEN_SHARED_DATA`` points it elsewhere (that test sets a missing folder to play a fresh clone).
"""

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("DEEPGEN_SHARED_DATA") or ROOT.parent / "shared" / "data")

needs_shared_data = pytest.mark.skipif(
    not SHARED_DATA.is_dir(), reason=f"{SHARED_DATA} not present (real public data; only CI has it beside the checkout)")
