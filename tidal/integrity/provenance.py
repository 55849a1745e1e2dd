"""Provenance recorded in step.json: code version and environment. Never hashed."""

from __future__ import annotations

import importlib.metadata
import platform
import socket
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

from tidal.settings import current

KEY_PACKAGES = (
    "tidal", "apache-beam", "tokenizers", "jax", "flax", "optax", "orbax-checkpoint",
    "great-expectations", "mlflow", "apache-airflow", "pyarrow", "numpy",
)


@lru_cache(maxsize=1)
def git_sha() -> str:
    """The commit of the tidal checkout (``+dirty`` if it has uncommitted changes), else
    ``$TIDAL_GIT_SHA`` (set in the images, which carry no .git), else ``unknown``."""
    if current().git_sha:
        return current().git_sha
    repo = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=5, check=False,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return sha + ("+dirty" if dirty else "")


@lru_cache(maxsize=1)
def environment() -> dict[str, object]:
    """Python, platform, host and the versions of the packages that shape outputs."""
    versions = {}
    for name in KEY_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "host": socket.gethostname(),
        "packages": versions,
    }
