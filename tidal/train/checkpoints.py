"""Orbax checkpoints of the training state, each verified by a manifest of content hashes.

Layout under the step directory::

    checkpoints/<step>/...                 orbax CheckpointManager, one directory per step
    checkpoint_manifests/<step>.json       tidal.hashing.build_manifest(checkpoints/<step>) + "step"
    checkpoint_manifest.json               the same, for the latest saved checkpoint

Invariant (docs/contracts.md, "Checkpoints"): a checkpoint is loaded only if its manifest
exists and every file's size and sha256 match. A save is complete when its manifest is
written (after orbax has finished writing), so a checkpoint without a manifest is one whose
save was cut short and is skipped like a corrupted one. Skipped checkpoints newer than the
one restored are deleted, so the re-done steps can save again under the same numbers.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import orbax.checkpoint as ocp

from tidal.hashing import build_manifest, verify_manifest

CHECKPOINT_DIR = "checkpoints"
MANIFEST_DIR = "checkpoint_manifests"
LATEST_MANIFEST = "checkpoint_manifest.json"


def _write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


class Checkpointer:
    """Saves and restores ``{"params", "opt_state"}`` pytrees under ``step_dir``.

    Args:
        step_dir: the training step's output directory.
        keep: how many of the newest checkpoints to keep (``keep_checkpoints``), >= 1.
        log: logger for skipped/deleted checkpoints.
    """

    def __init__(self, step_dir: str | Path, keep: int, log: logging.Logger | None = None):
        if keep < 1:
            raise ValueError(f"keep_checkpoints must be >= 1, got {keep}")
        self.step_dir = Path(step_dir).absolute()
        self.log = log or logging.getLogger("tidal.train.checkpoints")
        (self.step_dir / MANIFEST_DIR).mkdir(parents=True, exist_ok=True)
        # synchronous saves (the manifest needs finished files); leftover tmp dirs of a save cut
        # short by a crash are removed on start
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=False,
                                               create=True, cleanup_tmp_directories=True)
        self.manager = ocp.CheckpointManager(self.step_dir / CHECKPOINT_DIR, options=options)

    def path(self, step: int) -> Path:
        """Directory of the checkpoint at ``step``."""
        return self.step_dir / CHECKPOINT_DIR / str(step)

    def _manifest_path(self, step: int) -> Path:
        return self.step_dir / MANIFEST_DIR / f"{step}.json"

    def steps(self) -> list[int]:
        """Steps with a finished orbax checkpoint, ascending."""
        self.manager.reload()
        return sorted(self.manager.all_steps())

    def save(self, step: int, state: Any) -> dict[str, Any]:
        """Save ``state`` as the checkpoint of ``step`` (completed optimizer steps), wait for it,
        write its manifest, and drop manifests of checkpoints orbax has pruned.

        Returns:
            The manifest: ``{"files", "total_bytes", "root_hash", "step"}``.
        """
        self.manager.save(step, args=ocp.args.StandardSave(state), force=True)
        self.manager.wait_until_finished()
        manifest = {**build_manifest(self.path(step)), "step": step}
        _write_json_atomic(self._manifest_path(step), manifest)
        _write_json_atomic(self.step_dir / LATEST_MANIFEST, manifest)
        live = set(self.steps())
        for path in (self.step_dir / MANIFEST_DIR).glob("*.json"):
            if path.stem.isdigit() and int(path.stem) not in live:
                path.unlink()
        return manifest

    def problems(self, step: int) -> list[str]:
        """Why the checkpoint at ``step`` may not be loaded; empty when its manifest matches."""
        mpath = self._manifest_path(step)
        if not mpath.is_file():
            return [f"{mpath}: no manifest (save did not finish)"]
        try:
            manifest = json.loads(mpath.read_text())
        except json.JSONDecodeError as err:
            return [f"{mpath}: unreadable manifest ({err})"]
        return verify_manifest(self.path(step), manifest)

    def restore_latest(self, abstract_state: Any) -> tuple[int, Any, dict[str, Any]] | None:
        """Restore the newest checkpoint whose manifest verifies.

        Args:
            abstract_state: pytree of ``jax.ShapeDtypeStruct`` with the state's structure.

        Returns:
            ``(step, state, manifest)``, or None when no checkpoint verifies (start fresh).
            Checkpoints newer than the restored one are logged and deleted.
        """
        rejected: list[int] = []
        chosen = None
        for step in reversed(self.steps()):
            problems = self.problems(step)
            if not problems:
                chosen = step
                break
            self.log.warning("checkpoint %s failed verification, skipped: %s",
                             self.path(step), "; ".join(problems[:5]))
            rejected.append(step)
        for step in rejected:
            self.manager.delete(step)
            self._manifest_path(step).unlink(missing_ok=True)
        if chosen is None:
            (self.step_dir / LATEST_MANIFEST).unlink(missing_ok=True)
            return None
        state = self.manager.restore(chosen, args=ocp.args.StandardRestore(abstract_state))
        manifest = json.loads(self._manifest_path(chosen).read_text())
        _write_json_atomic(self.step_dir / LATEST_MANIFEST, manifest)
        return chosen, state, manifest

    def close(self) -> None:
        """Wait for pending work and release orbax resources."""
        self.manager.wait_until_finished()
        self.manager.close()


def tree_sha256(tree: Any) -> str:
    """Content hash of a pytree of arrays, independent of how a checkpoint lays it out on disk.

    orbax/OCDBT file names and ``_CHECKPOINT_METADATA`` timestamps differ between identical
    runs, so the checkpoint manifest's root hash does too; this hash does not. It covers,
    for every leaf in tree order, its key path, dtype, shape and raw bytes (host copy).
    """
    import hashlib

    import jax
    import numpy as np

    digest = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        array = np.asarray(jax.device_get(leaf))
        digest.update(f"{jax.tree_util.keystr(path)}|{array.dtype.str}|{array.shape}\n".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()
