"""The clean step's config: one model per part, used by the recipe and by the step alike.

Invariant: the recipe validates these models and the planner hashes their ``model_dump``, parsed
once into :class:`CleanConfig` at plan time (:func:`tidal.core.plans.plan_clean`); the step runs with
that model, handed over unchanged (a job command reads its JSON once), so a rule or a default
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

from pydantic import Field
from pydantic import Strict as StrictType

from tidal.config import MAX_SHARDS  # documents-SSSSS-of-NNNNN.parquet: five digits
from tidal.data.filters import QualityFilters
from tidal.data.langid import LANGUAGE_RULES, LanguageFilter
from tidal.data.neardup_config import NearDupConfig
from tidal.data.normalize import FILTER_RULES, FilterThresholds


class CleanSettings(FilterThresholds):
    """Normalization and first quality filters, applied to every source: the recipe's ``clean``
    section, and the part of every clean step config that is the same for each source."""

    normalization: Literal["NFC", "NFKC"] = Field(default="NFC", description="Unicode form")
    shards: Annotated[int, StrictType(), Field(ge=1, le=MAX_SHARDS)] = Field(
        default=1, description=f"output shard count (fixed for determinism); at most {MAX_SHARDS:,} (shard files "
        "are numbered with five digits)"
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
