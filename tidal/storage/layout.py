"""The step contract's file names and the one atomic-write helper.

Every step directory ``{storage_root}/{step_id}/`` holds the kind's own outputs plus these files
(docs/contracts.md): ``manifest.json`` (every output file with size and sha256), ``step.json``
(what was hashed, input ids, summary, provenance), ``signature.json`` (with a signing key) and
``_SUCCESS``, written last; a training step also ``spec.json`` (what the entrypoint runs) and
``summary.json`` (what it returned). The names live here once so that a reader, a writer and a
check cannot disagree. This module imports nothing of tidal's: it is the bottom of the import layers
(pyproject.toml), below tidal.files and tidal.integrity, which name a step's files through it.

Invariant of :func:`atomic_write_bytes`: a reader sees the old file or the whole new one, never
part of one, and two writers of the same path never share a temporary file (each attempt gets
its own name, so a concurrent attempt of one bundle cannot install half of another's bytes).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

STEP_JSON = "step.json"
MANIFEST_JSON = "manifest.json"
SIGNATURE_JSON = "signature.json"
SUCCESS = "_SUCCESS"
SPEC_JSON = "spec.json"
SUMMARY_JSON = "summary.json"
COMMIT_FILES = (MANIFEST_JSON, STEP_JSON, SIGNATURE_JSON, SUCCESS)  # written by the commit, not the kind


def temporary_name(path: Path) -> Path:
    """A hidden, unique sibling of ``path`` to write before renaming into place
    (``.{name}.{pid}.{random}.tmp``: same directory, so the rename is atomic on POSIX)."""
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp")


def atomic_write_bytes(path: str | Path, data: bytes, *, durable: bool = False) -> Path:
    """Write ``data`` to ``path`` atomically: a unique temporary sibling, then ``os.replace``.

    Args:
        durable: ``fsync`` the file before the rename (markers such as ``_SUCCESS`` that must
            survive a crash of the machine, not only of the process).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        OSError: the directory is missing or not writable (the temporary file is removed).
    """
    path = Path(path)
    tmp = temporary_name(path)
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | Path, text: str, *, durable: bool = False) -> Path:
    """:func:`atomic_write_bytes` of ``text`` encoded as UTF-8."""
    return atomic_write_bytes(path, text.encode("utf-8"), durable=durable)


__all__ = ["COMMIT_FILES", "MANIFEST_JSON", "SIGNATURE_JSON", "SPEC_JSON", "STEP_JSON", "SUCCESS", "SUMMARY_JSON",
           "atomic_write_bytes", "atomic_write_text", "temporary_name"]
