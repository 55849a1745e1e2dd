"""Checkpoints in the bucket: each finished orbax checkpoint uploaded under the step's resume prefix.

A training step on an object-store root trains in a local work directory of its own process
(emptied at start: nothing of an earlier process on this machine is trusted, docs/architecture.md §0) and
mirrors every checkpoint to the step's staging location, which is the same for every attempt
(:func:`tidal.storage.staging.resumable_staging`)::

    {staging}/checkpoints/<step>/...               the orbax checkpoint's files, as written
    {staging}/checkpoint_manifests/<step>.json      its manifest (sizes, sha256), uploaded LAST
    {staging}/metrics.jsonl, mlflow_run.json        sidecars as of that checkpoint, uploaded before it

A checkpoint counts only once its manifest object exists: the manifest is computed from the
files orbax wrote (sha256 of each, :func:`tidal.integrity.hashing.build_manifest`), the files are
uploaded (multipart, parallel: :func:`tidal.storage.uris.upload_dir`), then the manifest. A process
killed in between leaves files without a manifest, which nobody restores and the next save or the
commit replaces. Restore (:meth:`CheckpointMirror.fetch`) downloads a checkpoint's files and checks
every size and sha256 against its manifest before orbax reads a byte. Retention is applied in the
bucket too (:meth:`CheckpointMirror.prune`: manifest deleted first, so a half-deleted checkpoint
never counts), and the commit does not upload what is already there
(:func:`tidal.storage.staging.stage` skips files the listing has at the same size).

Why a local write then an upload, not orbax writing ``s3://`` itself: orbax finalises a checkpoint
by renaming its tmp directory (``etils.epath``), which an S3 bucket has no operation for (a
rename is a copy of every object), and orbax's ``s3://`` paths need fsspec's s3fs, which the lock
does not carry; TensorStore's s3 kvstore reads and writes arrays fine but not orbax's directory
steps. The upload goes through the same boto3 transfer configuration as every step output, so
it runs at the rate of a raw upload of the same bytes (``bench/node_loss.py``:
``ckpt_upload_vs_raw_put``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tidal.integrity.hashing import manifest_text, verify_manifest
from tidal.storage import uris
from tidal.storage.layout import atomic_write_text

CHECKPOINT_DIR = "checkpoints"
MANIFEST_DIR = "checkpoint_manifests"


def write_json_atomic(path: Path, data: Any) -> None:
    """``data`` as indented, key-sorted JSON at ``path``, replaced atomically (a manifest's local copy)."""
    atomic_write_text(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


class CheckpointMirror:
    """The bucket side of a :class:`tidal.train.checkpoints.Checkpointer` (one training step).

    Args:
        location: the step's staging location (``s3://…/.staging/{step_id}/`` or ``gs://…``).
        log: logger for skipped and deleted checkpoints (WARNING).
        fence: called before every upload that makes a checkpoint count (its files, sidecars and
            manifest) and before retention deletes any; raises when this process may no longer write
            here (:meth:`tidal.train.fence.Fence.check`). None: no check.

    Attributes:
        uploads: ``(step, bytes, seconds)`` of every checkpoint uploaded by this process.
    """

    def __init__(self, location: str, log: logging.Logger | None = None,
                 fence: Callable[[], None] | None = None):
        self.location = location.rstrip("/") + "/"
        self.log = log or logging.getLogger("tidal.train.checkpoints")
        self.fence = fence
        self.uploads: list[tuple[int, int, float]] = []

    def check_fence(self) -> None:
        """Call the fence (if any): raises when this process may no longer write checkpoints here."""
        if self.fence is not None:
            self.fence()

    def _checkpoint(self, step: int) -> str:
        return uris.join(self.location, CHECKPOINT_DIR, str(step))

    def _manifest(self, step: int) -> str:
        return uris.join(self.location, MANIFEST_DIR, f"{step}.json")

    def steps(self) -> list[int]:
        """Steps whose checkpoint counts (its manifest object exists), ascending."""
        names = uris.list_sizes(uris.join(self.location, MANIFEST_DIR))
        return sorted(int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit())

    def upload(self, step: int, local_dir: Path, manifest: dict[str, Any], sidecars: dict[str, bytes]) -> None:
        """Upload checkpoint ``step`` (the files of ``manifest`` under ``local_dir``), then ``sidecars``
        (name -> bytes, beside the checkpoints), then the manifest: from then on it counts.

        Raises:
            StorageError / StorageUnreachable: an upload failed (the checkpoint does not count).
        """
        self.check_fence()
        start = time.perf_counter()
        sent = uris.upload_dir(local_dir, self._checkpoint(step), [e["path"] for e in manifest["files"]])
        for name, data in sidecars.items():
            uris.write_bytes(uris.join(self.location, name), data)
        self.check_fence()  # the upload took a while: still this process's step?
        uris.write_bytes(self._manifest(step), manifest_text(manifest).encode())
        self.uploads.append((step, sent, time.perf_counter() - start))

    def fetch(self, step: int, local_dir: Path) -> dict[str, Any] | None:
        """Download checkpoint ``step`` into ``local_dir`` and verify it against its manifest.

        Returns:
            The manifest, or None when it does not verify (missing or unreadable manifest, a file
            missing or of another size or sha256): logged at WARNING, ``local_dir`` removed.
        """
        import shutil

        try:
            manifest = json.loads(uris.read_bytes(self._manifest(step)))
            uris.download_dir(self._checkpoint(step), local_dir, [e["path"] for e in manifest["files"]])
            problems = verify_manifest(local_dir, manifest)
        except FileNotFoundError as err:
            problems = [f"missing in the bucket: {err}"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            problems = [f"{self._manifest(step)}: unreadable manifest ({err})"]
        if problems:
            self.log.warning("checkpoint %s in the bucket failed verification, skipped: %s",
                             self._checkpoint(step), "; ".join(problems[:5]))
            shutil.rmtree(local_dir, ignore_errors=True)
            return None
        return manifest

    def fetch_sidecars(self, local_dir: Path, names: tuple[str, ...]) -> list[str]:
        """Download the sidecars there are (a fresh process resuming); returns the names fetched."""
        fetched = []
        for name in names:
            try:
                data = uris.read_bytes(uris.join(self.location, name))
            except FileNotFoundError:
                continue
            atomic_write_text(local_dir / name, data.decode())
            fetched.append(name)
        return fetched

    def delete(self, step: int) -> None:
        """Remove checkpoint ``step`` from the bucket, its manifest first (it stops counting at once)."""
        self._delete_object(self._manifest(step))
        uris.delete_dir(self._checkpoint(step))

    def _delete_object(self, location: str) -> None:
        uris.delete_object(location)

    def prune(self, retain: Callable[[list[int]], set[int]]) -> list[int]:
        """Apply retention in the bucket: delete every counted checkpoint not in ``retain(steps)``, where
        ``steps`` are all the checkpoints that count there (an earlier process's too; the caller adds the
        ones orbax keeps locally: :func:`tidal.train.checkpoints.retained`). Returns the steps deleted."""
        self.check_fence()
        there = self.steps()
        kept = retain(there)
        gone = [step for step in there if step not in kept]
        for step in gone:
            self.delete(step)
        return gone


def retained(steps: set[int] | list[int], keep: int, permanent_every: int | None) -> set[int]:
    """The checkpoints that retention keeps of ``steps``: the newest ``keep``, and every one whose step
    is a multiple of ``permanent_every`` (None: none). The rule of the Checkpointer's orbax preservation
    policy, applied in the bucket through :meth:`CheckpointMirror.prune`."""
    ordered = sorted(set(steps))
    kept = set(ordered[-keep:]) if keep > 0 else set()
    if permanent_every:
        kept |= {step for step in ordered if step % permanent_every == 0}
    return kept


__all__ = ["CHECKPOINT_DIR", "MANIFEST_DIR", "CheckpointMirror", "retained", "write_json_atomic"]
