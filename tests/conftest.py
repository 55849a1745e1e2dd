"""Shared fixtures: paths of the repo and the tiny recipe."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "recipes" / "tiny.yaml"

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture
def tiny_data() -> dict:
    """The tiny recipe as a plain dict (edit it to build variants)."""
    import yaml

    return yaml.safe_load(TINY.read_text())
