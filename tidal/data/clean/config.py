"""The clean step's config: one model per part, used by the recipe and by the step alike.

Invariant: the recipe validates these models and the planner hashes their ``model_dump``; the
step reads the same dict back with :meth:`CleanConfig.model_validate`, so a rule or a default
lives in exactly one place and the dict a step id hashes is what the step runs with.

* :class:`CleanSettings`: the recipe's ``clean`` section (every source): basic thresholds
  (:class:`tidal.data.normalize.FilterThresholds`), normalization form, UTF-8 and special-token
  policies, shard count, quality filters (:class:`tidal.data.filters.QualityFilters`) and
  near-dedup (:class:`NearDupConfig`);
* :class:`CleanConfig`: one clean step: the settings, the source and its fetch step, the
  source's merged ``filters`` and its ``language`` (:class:`tidal.data.langid.LanguageFilter`).

Light on purpose (pydantic and the filter modules, no Beam): the recipe imports it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator
from pydantic import Strict as StrictType

from tidal.config import PositiveInt, Strict
from tidal.data.filters import QualityFilters
from tidal.data.langid import LANGUAGE_RULES, LanguageFilter
from tidal.data.normalize import FILTER_RULES, FilterThresholds

# Most MinHash permutations (bands * rows) a recipe may ask for. Time and memory are linear in
# it: each permutation is an affine map over every shingle of every document, and
# tidal/data/minhash.py holds a chunk of 4,096 shingles x permutations uint32 values at once
# (1.8 MB at 112 permutations, 17 MB at 1024, 13 GB at `bands: 100000` x 8); each of the
# `bands` bands is one bucket record per document in the LSH shuffle. FineWeb (Penedo et al.
# 2024, §3.3) and datatrove's MinhashConfig default use 14 bands x 8 rows = 112; 1024 leaves
# 9x that for stricter S-curves while refusing settings that cannot run.
MAX_MINHASH_PERMUTATIONS = 1024
# Shard files are named documents-SSSSS-of-NNNNN.parquet (tidal.data.clean.fns.shard_name).
MAX_SHARDS = 99_999


class NearDupConfig(Strict):
    """MinHash + LSH near-duplicate removal with exact Jaccard verification (:mod:`tidal.data.neardup`;
    defaults: FineWeb, see that module's docstring).

    ``bands * rows`` (the MinHash permutations) is at most :data:`MAX_MINHASH_PERMUTATIONS`.
    """

    enabled: bool = Field(default=False, description="exact dedup always runs; this adds near-duplicates")
    shingle_size: PositiveInt = Field(default=5, description="words per shingle (characters for CJK)")
    bands: PositiveInt = Field(default=14, description="LSH bands")
    rows: PositiveInt = Field(default=8, description="MinHash values per band (permutations = bands * rows)")
    jaccard_threshold: Annotated[float, Field(gt=0.0, le=1.0)] = Field(
        default=0.75, description="verified Jaccard similarity at or above which documents are duplicates"
    )
    seed: Annotated[int, StrictType(), Field(ge=0)] = Field(
        default=1, description="MinHash permutation seed (datasketch MinHash(seed=...))"
    )
    max_bucket_size: PositiveInt = Field(default=64, description="larger LSH buckets give a star of pairs")

    @model_validator(mode="after")
    def _permutations_bounded(self) -> NearDupConfig:
        permutations = self.bands * self.rows
        if permutations > MAX_MINHASH_PERMUTATIONS:
            raise ValueError(
                f"bands * rows = {self.bands} * {self.rows} = {permutations} MinHash permutations exceeds "
                f"{MAX_MINHASH_PERMUTATIONS}: every permutation is hashed over every shingle of every document "
                "and every band adds one bucket record per document to the shuffle; FineWeb and datatrove "
                "use 14 x 8 = 112")
        return self

    @property
    def num_perm(self) -> int:
        """MinHash permutations: ``bands * rows``."""
        return self.bands * self.rows


class CleanSettings(FilterThresholds):
    """Normalization and first quality filters, applied to every source: the recipe's ``clean``
    section, and the part of every clean step config that is the same for each source."""

    normalization: Literal["NFC", "NFKC"] = Field(default="NFC", description="Unicode form")
    shards: Annotated[int, StrictType(), Field(ge=1, le=MAX_SHARDS)] = Field(
        default=1, description="output shard count (fixed for determinism)"
    )
    invalid_utf8: Literal["quarantine", "repair"] = Field(
        default="quarantine", description="bytes that are not UTF-8 (or lone surrogates): quarantine the "
        "record, or repair with U+FFFD; counted either way"
    )
    special_tokens: Literal["text", "strip", "quarantine"] = Field(
        default="text", description="a literal <|endoftext|> in a document: keep as text (encoded as ordinary "
        "text), strip it, or quarantine the record"
    )
    filters: QualityFilters = Field(
        default_factory=QualityFilters, description="quality filters of every source (tidal/data/filters.py)"
    )
    near_dedup: NearDupConfig = Field(
        default_factory=NearDupConfig, description="MinHash-LSH near-duplicate removal (tidal/data/neardup.py)"
    )


class CleanConfig(CleanSettings):
    """One clean step: the recipe's ``clean`` settings for one source, with the source's own
    ``filters`` merged in (:meth:`QualityFilters.overridden_by`) and its ``language``."""

    source: str = Field(min_length=1, description="source name, e.g. brown")
    input: str = Field(min_length=1, description="the fetch step whose raw.parquet to read, e.g. fetch-brown")
    language: LanguageFilter = Field(
        default_factory=LanguageFilter, description="allowed languages of the source (tidal/data/langid.py)"
    )

    def rule_names(self) -> list[str]:
        """Every filter rule this config can report, in check order."""
        return [*FILTER_RULES, *self.filters.rule_names(), *(f"language.{r}" for r in LANGUAGE_RULES)]
