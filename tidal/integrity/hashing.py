"""Content hashes of files and directories, and the manifests that record them.

Invariant: a manifest lists every file under a directory (relative POSIX path, size in
bytes, sha256 of the content), sorted by path, and its *root hash* is the sha256 of the
manifest's canonical JSON. Two directories with the same root hash hold the same bytes
under the same names; one flipped byte anywhere changes it. Files named in ``exclude``
(the commit-protocol files themselves) are left out.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

CHUNK_BYTES = 1 << 20
from tidal.storage.layout import MANIFEST_JSON as MANIFEST_NAME


def canonical_json(obj: Any) -> str:
    """Serialize JSON data with sorted keys and no whitespace, so equal data gives equal text.

    Raises:
        TypeError: for values without a JSON form (sets, objects, NaN is refused too).
    """
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file's content, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def build_manifest(root: str | Path, exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    """Manifest of every regular file under ``root``.

    Returns:
        ``{"files": [{"path", "bytes", "sha256"}...], "total_bytes": int, "root_hash": str}``
        with files sorted by relative path.
    """
    root = Path(root)
    files = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel in exclude:
            continue
        files.append({"path": rel, "bytes": path.stat().st_size, "sha256": sha256_file(path)})
    return manifest_of(files)


def manifest_of(files: list[dict[str, Any]]) -> dict[str, Any]:
    """The manifest of ``files`` (``{"path", "bytes", "sha256"}`` each, sorted by path): the list,
    ``total_bytes`` and the ``root_hash`` over both (module docstring)."""
    body = {"files": files, "total_bytes": sum(f["bytes"] for f in files)}
    return {**body, "root_hash": sha256_bytes(canonical_json(body).encode())}


def manifest_text(manifest: dict[str, Any]) -> str:
    """``manifest.json``'s bytes as text: the same manifest always gives the same file."""
    return json.dumps(manifest, indent=1, sort_keys=True) + "\n"


def verify_manifest(root: str | Path, manifest: dict[str, Any]) -> list[str]:
    """Compare the files under ``root`` with ``manifest``.

    Returns:
        A list of human-readable mismatches (missing file, size or hash differs, root hash
        differs); empty when everything matches. Extra files not in the manifest are ignored.
    """
    root = Path(root)
    problems = []
    for entry in manifest["files"]:
        path = root / entry["path"]
        if not path.is_file():
            problems.append(f"{entry['path']}: missing")
        elif path.stat().st_size != entry["bytes"]:
            problems.append(f"{entry['path']}: {path.stat().st_size} bytes, manifest says {entry['bytes']}")
        elif sha256_file(path) != entry["sha256"]:
            problems.append(f"{entry['path']}: sha256 differs from manifest")
    body = {"files": manifest["files"], "total_bytes": manifest.get("total_bytes")}
    if sha256_bytes(canonical_json(body).encode()) != manifest.get("root_hash"):
        problems.append("root_hash does not match the manifest's file list")
    return problems


def write_manifest(root: str | Path, exclude: tuple[str, ...] = (), name: str = MANIFEST_NAME) -> dict[str, Any]:
    """Build the manifest of ``root`` and write it as ``root/name``; returns it."""
    manifest = build_manifest(root, exclude=exclude + (name,))
    (Path(root) / name).write_text(manifest_text(manifest))
    return manifest
