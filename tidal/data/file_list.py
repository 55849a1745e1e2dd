"""The files of a local file source, in read order: a file, or a folder walked recursively
(hidden names skipped, symlinks followed under the names they have in the folder, cycles and
broken links refused); see :mod:`tidal.data.readers` for the rules and the refs they give."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from tidal.data.sources import ref_sort_key

__all__ = ["list_files"]


def list_files(path: str | Path) -> list[tuple[str, Path]]:
    """``(relative name, path)`` of the files to read, in natural order (module docstring).

    Symlinked folders and files are followed; a file's relative name and path are as seen
    under ``path`` (through the link), not its target's.

    Raises:
        ValueError: for a URI (``s3://`` is read by :func:`read_path`, not listed here), or a
            symlink that loops back into a folder already being walked (names the link and
            that folder), or a symlink chain that never ends (``ELOOP``).
        FileNotFoundError: if ``path`` does not exist or is a folder with no (visible) file;
            for a broken symlink (its target is missing), naming the link.
        OSError: a folder that cannot be listed (e.g. ``PermissionError``): never skipped.
    """
    text = str(path)
    if "://" in text:
        scheme = text.split("://", 1)[0]
        raise ValueError(f"{text}: {scheme}:// source paths are not supported (local paths and s3:// only); "
                         "copy the files to a local or mounted path")
    root = Path(path)
    top = _stat_entry(root, os.path.islink(root)) if os.path.lexists(root) else None
    if top is None:
        raise FileNotFoundError(f"source path {root} does not exist")
    if not stat.S_ISDIR(top.st_mode):
        return [(root.name, root)]
    found: list[tuple[str, Path]] = []
    # (folder as seen, its relative prefix, {(st_dev, st_ino): folder as seen} of it and its ancestors)
    pending = [(root, "", {(top.st_dev, top.st_ino): root})]
    while pending:
        folder, prefix, walking = pending.pop()
        with os.scandir(folder) as entries:
            names = [(entry.name, entry.is_symlink()) for entry in entries if not entry.name.startswith(".")]
        for name, link in names:
            full = folder / name
            info = _stat_entry(full, link)
            if not stat.S_ISDIR(info.st_mode):
                found.append((prefix + name, full))
                continue
            key = (info.st_dev, info.st_ino)
            if key in walking:  # name the link that closes the loop: this entry, or the last one above it
                via = full if link else next((p for p in reversed(walking.values())
                                              if p != root and p.is_symlink()), None)
                raise ValueError(f"source path {root}: {f'symlink {via} -> {os.readlink(via)}' if via else 'folder'} "
                                 f"loops back to {walking[key]}, a folder already being walked (as {full}); "
                                 "remove the link or point the source at a folder without the cycle")
            pending.append((full, f"{prefix}{name}/", {**walking, key: full}))
    if not found:  # as an empty s3:// prefix: a source that reads nothing is a mistake
        raise FileNotFoundError(f"source path {root} has no file (hidden files and folders are skipped)")
    return sorted(found, key=lambda item: ref_sort_key(item[0] + ":"))


def _stat_entry(full: Path, link: bool) -> os.stat_result:
    """``os.stat`` of ``full`` through symlinks, with errors that name a bad link.

    Raises:
        FileNotFoundError: ``full`` is a broken symlink (names it and its target).
        ValueError: ``full`` is a symlink chain that loops on itself (``ELOOP``).
    """
    try:
        return os.stat(full)
    except FileNotFoundError:
        if not link:
            raise
        raise FileNotFoundError(f"broken symlink {full} -> {os.readlink(full)}: its target does not exist; "
                                "fix or remove the link") from None
    except OSError as err:
        if err.errno != errno.ELOOP:
            raise
        raise ValueError(f"symlink {full} -> {os.readlink(full)} loops on itself "
                         f"({os.strerror(errno.ELOOP)}); fix or remove the link") from None
