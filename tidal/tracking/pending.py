"""Where the tracker's buffered MLflow calls wait (:mod:`tidal.tracking.tracker`, its docstring
says which store is used when): the storage root's objects or a local directory, behind one
four-method protocol, so tracking never imports storage."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from tidal.storage.layout import atomic_write_bytes


class PendingStore(Protocol):
    """Where buffered calls live: a storage root's objects (:class:`tidal.storage.Storage` has these
    methods; tracking does not import storage) or a local directory (:class:`PendingDir`)."""

    def write_object(self, rel: str, data: bytes) -> str:
        """Write one object atomically; its URI."""

    def read_object(self, rel: str) -> bytes | None:
        """One object's bytes, or None."""

    def list_rel(self, prefix: str) -> list[str]:
        """Names of the objects starting with ``prefix``, sorted."""

    def delete_rel(self, rels: Iterable[str]) -> None:
        """Delete objects; missing ones are no error."""


class PendingDir:
    """A local directory as a :class:`PendingStore` (flat: names are file names in it)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def write_object(self, rel: str, data: bytes) -> str:
        """Write ``{path}/{rel}`` atomically (temporary file, then rename); its path."""
        self.path.mkdir(parents=True, exist_ok=True)
        return str(atomic_write_bytes(self.path / rel, data))

    def read_object(self, rel: str) -> bytes | None:
        """The file's bytes, or None if it is gone."""
        try:
            return (self.path / rel).read_bytes()
        except FileNotFoundError:
            return None

    def list_rel(self, prefix: str) -> list[str]:
        """The ``*.json`` file names in the directory starting with ``prefix``, sorted."""
        if not self.path.is_dir():
            return []
        return sorted(p.name for p in self.path.glob("*.json") if p.name.startswith(prefix))

    def delete_rel(self, rels: Iterable[str]) -> None:
        """Remove these files (missing ones are no error)."""
        for rel in rels:
            (self.path / rel).unlink(missing_ok=True)


__all__ = ["PendingDir", "PendingStore"]
