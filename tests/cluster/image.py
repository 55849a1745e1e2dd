"""The test cluster's "image": what a node runs, as a pod runs what its container image holds.

Built once per test process under ``$TMPDIR/tidal-image-<pid>``: a copy of the checkout's files that git
tracks or would track (``git ls-files --cached --others --exclude-standard``: a module not yet added is
there, build outputs, ``test-artifacts/`` and the like are not) with the ``.pyc`` of its modules where
compiled, and its ``.venv`` as hard links (a few seconds for the venv's ~100k files; a copy where the
filesystem refuses links). Each node boot binds the image read-only over the checkout's path, so the venv's
absolute paths hold and the node sees the image, never the launcher's working tree. The commit is recorded
for provenance as ``TIDAL_GIT_SHA``, as the production images do (they carry no ``.git``).

The code is copied, not linked, because editors write some files in place (vim does for a file with
several links): the image stays the tree as it was when the session started. The venv's files are hard
links: nothing edits them during a session.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

_lock = threading.Lock()
_built: dict[Path, Image] = {}


@dataclass(frozen=True)
class Image:
    """A built image: its folder and the commit it was built from (``<sha>[+dirty]`` or ``unknown``)."""

    path: Path
    git_sha: str


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_symlink():
        dst.symlink_to(os.readlink(src))
    else:
        shutil.copy2(src, dst)


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"`git {' '.join(args)}` in {repo} failed: {done.stderr.strip()}")
    return done.stdout


def image_of(repo: Path) -> Image:
    """The image of checkout ``repo`` for this process, built on first use (thread-safe), removed at exit.

    Raises:
        RuntimeError: ``repo`` is not a git checkout, or has no ``.venv``.
    """
    repo = repo.resolve()
    with _lock:
        if repo in _built:
            return _built[repo]
        venv = repo / ".venv"
        if not venv.is_dir():
            raise RuntimeError(f"no virtual environment at {venv}: run `make venv`")
        files = [f for f in _git(repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0") if f]
        dest = Path(os.environ.get("TMPDIR", "/tmp")) / f"tidal-image-{os.getpid()}"
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        atexit.register(shutil.rmtree, dest, True)
        tag = sys.implementation.cache_tag
        for rel in files:
            src = repo / rel
            if src.is_file() or src.is_symlink():  # listed but deleted in the working tree: not in the image
                _copy(src, dest / rel)
                # and its bytecode where `make bytecode` wrote it: no node may write one (read-only image),
                # and compiling tidal again in every node process costs CPU (a stale one is ignored by Python)
                pyc = Path(rel).parent / "__pycache__" / f"{Path(rel).stem}.{tag}.pyc"
                if rel.endswith(".py") and (repo / pyc).is_file():
                    _copy(repo / pyc, dest / pyc)
        cp = subprocess.run(["cp", "-al", str(venv), str(dest / ".venv")], capture_output=True, text=True, check=False)
        if cp.returncode != 0:
            shutil.rmtree(dest / ".venv", ignore_errors=True)
            shutil.copytree(venv, dest / ".venv", symlinks=True)
        sha = _git(repo, "rev-parse", "HEAD").strip()
        dirty = _git(repo, "status", "--porcelain", "--untracked-files=no").strip()
        image = Image(dest, sha + ("+dirty" if dirty else ""))
        _built[repo] = image
        return image
