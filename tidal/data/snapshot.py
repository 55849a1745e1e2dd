"""The content pin of a file source: each file's sha256 and the snapshot hash of all of them,
equal to ``sha256sum`` of the files (in reader order, names escaped as GNU sha256sum does) piped
into ``sha256sum``, so a user can compute a pin with shell tools."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from tidal.data.file_list import list_files

READ_CHUNK_BYTES = 1 << 20  # bytes per read when hashing or decompressing a file


def file_sha256(path: Path) -> tuple[str, int]:
    """``(sha256 hex of the file's bytes, size in bytes)``, read in 1 MiB chunks."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as handle:
        while chunk := handle.read(READ_CHUNK_BYTES):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def snapshot_sha256(digests: list[tuple[str, str, int]]) -> str:
    """One sha256 hex digest for ``[(relative name, file sha256, size)]`` (module docstring).

    Equal to ``sha256sum`` of the files, in read order, run from the source folder and piped
    into ``sha256sum`` again (for a single-file source: that file's name alone), escapes of
    unusual names included. With ``max_documents`` fetch stops reading early, so the list, and
    the hash, covers the files up to the one holding the last document taken.
    """
    return hashlib.sha256("".join(_sha256sum_line(rel, sha) for rel, sha, _ in digests).encode(
        "utf-8", errors="surrogateescape")).hexdigest()


def _sha256sum_line(name: str, sha: str) -> str:
    r"""One line as GNU ``sha256sum`` (coreutils 9) writes it: a name holding a backslash, a
    newline or a carriage return is escaped (``\\``, ``\n``, ``\r``) and the line starts with ``\``."""
    if not any(ch in name for ch in "\\\n\r"):
        return f"{sha}  {name}\n"
    escaped = name.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    return f"\\{sha}  {escaped}\n"


_DIGESTS: dict[tuple[str, int, int, int, int], tuple[str, int]] = {}  # file identity -> (sha256, size)


def planned_snapshot(path: str | Path) -> str:
    """The snapshot sha256 of every file under a local ``path``, in read order: what a fetch of
    it without ``max_documents`` records, and the value to pin. The planner puts it into an
    unpinned file source's fetch config, so the step id follows the content.

    Each file is read once per process and identity (path, size, mtime_ns, device, inode): a
    recipe planned again (a DAG parsed again) hashes only files that changed; a pinned source
    is never hashed at plan time.

    Raises:
        FileNotFoundError: ``path`` does not exist or holds no (visible) file.
        ValueError: a symlink cycle under it (:func:`tidal.data.readers.list_files`).
    """
    digests = []
    for rel, full in list_files(path):
        info = os.stat(full)
        key = (str(Path(full).absolute()), info.st_size, info.st_mtime_ns, info.st_dev, info.st_ino)
        if key not in _DIGESTS:
            _DIGESTS[key] = file_sha256(full)
        digests.append((rel, *_DIGESTS[key]))
    return snapshot_sha256(digests)
