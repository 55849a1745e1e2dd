"""Where step outputs live, and the atomic commit of a step directory.

Invariant (DESIGN.md §1): a step is committed exactly when ``{root}/{step_id}/_SUCCESS``
exists, and ``_SUCCESS`` appears only after every other file is complete. Locally a
non-resumable step is written in a scratch directory under ``{root}/.scratch`` that holds
``_SUCCESS`` already and is then renamed into place: ``rename`` is atomic on one file
system, so a reader sees either nothing or the whole step. A crash at any point leaves
only scratch, which never counts as committed and is cleared on the next attempt.

Only local directories are supported in this version; ``s3://`` (boto3) comes with the
object-storage issue and refuses clearly until then.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

SUCCESS = "_SUCCESS"
SCRATCH = ".scratch"
FAILED = ".failed"


class StorageError(RuntimeError):
    """A storage root cannot be used (unsupported scheme, not writable)."""


@dataclass(frozen=True)
class LocalStorage:
    """A storage root on the local file system."""

    root: Path

    @classmethod
    def from_uri(cls, uri: str, base: Path | None = None) -> LocalStorage:
        """Open a storage root; relative paths resolve against ``base`` (default: cwd).

        Raises:
            StorageError: for ``s3://``/``gs://`` URIs (not yet supported) or other schemes.
        """
        if "://" in uri and not uri.startswith("file://"):
            raise StorageError(
                f"storage root {uri!r}: only local paths are supported so far "
                "(object storage through boto3 is the next storage milestone); use a directory"
            )
        path = Path(uri.removeprefix("file://")).expanduser()
        if not path.is_absolute():
            path = (base or Path.cwd()) / path
        return cls(path.resolve())

    def step_dir(self, step_id: str) -> Path:
        """The committed location of a step's outputs."""
        return self.root / step_id

    def is_committed(self, step_id: str) -> bool:
        """True iff the step's ``_SUCCESS`` marker exists (a single ``stat``)."""
        return (self.root / step_id / SUCCESS).is_file()

    def new_scratch(self, step_id: str) -> Path:
        """A fresh, empty scratch directory for one attempt at ``step_id``.

        Scratch left by earlier attempts of the same step whose process is gone (killed
        or crashed) is removed first; a live concurrent attempt's scratch is left alone.
        """
        for stale in (self.root / SCRATCH).glob(f"{step_id}.*.*"):
            pid = stale.name[len(step_id) + 1:].split(".")[0]
            if pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(stale, ignore_errors=True)
        path = self.root / SCRATCH / f"{step_id}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        path.mkdir(parents=True)
        return path

    def clear_uncommitted(self, step_id: str) -> None:
        """Remove a leftover, uncommitted output directory of ``step_id`` (a crashed attempt)."""
        path = self.step_dir(step_id)
        if path.exists() and not self.is_committed(step_id):
            shutil.rmtree(path)

    def commit_scratch(self, scratch: Path, step_id: str) -> bool:
        """Atomically move a scratch directory (already holding ``_SUCCESS``) into place.

        Returns:
            True if this call committed; False if another attempt committed first (the
            scratch is then discarded: both computed the same content-addressed result).
        """
        target = self.step_dir(step_id)
        self.clear_uncommitted(step_id)
        try:
            os.rename(scratch, target)
        except OSError:
            if self.is_committed(step_id):
                shutil.rmtree(scratch, ignore_errors=True)
                return False
            raise
        return True

    def keep_failed(self, scratch: Path, step_id: str) -> Path:
        """Move a failed attempt's scratch to ``{root}/.failed/{step_id}.{n}`` for inspection.

        It never counts as committed; it is removed when the step next commits.
        """
        target = self.root / FAILED / f"{step_id}.{time.strftime('%Y%m%dT%H%M%S')}.{uuid.uuid4().hex[:6]}"
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(scratch, target)
        return target

    def failed_attempts(self, step_id: str) -> list[Path]:
        """Kept failed attempts of ``step_id``, oldest first."""
        return sorted((self.root / FAILED).glob(f"{step_id}.*"))

    def clear_attempts(self, step_id: str) -> None:
        """Remove kept failed attempts and forced-aside copies of a step that has committed."""
        for path in [*self.failed_attempts(step_id), *(self.root / SCRATCH).glob(f"{step_id}.discarded.*")]:
            shutil.rmtree(path, ignore_errors=True)

    def discard(self, step_id: str) -> Path | None:
        """Move a committed step aside (for a forced rerun); returns where it went."""
        path = self.step_dir(step_id)
        if not path.exists():
            return None
        trash = self.root / SCRATCH / f"{step_id}.discarded.{uuid.uuid4().hex[:8]}"
        trash.parent.mkdir(parents=True, exist_ok=True)
        os.rename(path, trash)
        return trash


def _alive(pid: int) -> bool:
    """True if a process with ``pid`` exists (signal 0 probes without sending anything)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
