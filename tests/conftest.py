"""Shared fixtures: paths of the repo and the tiny recipe."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ["tests.cluster.kube_fixtures"]  # kube, installed: the Kubernetes API server tests

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "recipes" / "tiny.yaml"

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture
def tiny_data() -> dict:
    """The tiny recipe as a plain dict (edit it to build variants)."""
    import yaml

    return yaml.safe_load(TINY.read_text())


def seal(out: Path) -> str:
    """Commit a step directory a test wrote by hand as a real commit would: ``manifest.json`` over its
    files, then ``_SUCCESS`` holding the root hash (steps check their inputs against both,
    tidal/core/inputs.py). Returns the root hash."""
    from tidal.integrity.hashing import write_manifest

    out = Path(out)
    manifest = write_manifest(out, exclude=("step.json", "_SUCCESS", "signature.json"))
    (out / "_SUCCESS").write_text(manifest["root_hash"] + "\n")
    return manifest["root_hash"]
