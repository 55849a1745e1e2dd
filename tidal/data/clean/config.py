"""The clean step's config, validated once per process (:class:`CleanConfig`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tidal.data.filters import QualityFilters
from tidal.data.langid import LANGUAGE_RULES, LanguageFilter
from tidal.data.neardup import NearDupConfig
from tidal.data.normalize import (
    FILTER_RULES,
    SPECIAL_TOKEN_POLICIES,
    UTF8_POLICIES,
    FilterThresholds,
    check_form,
)

CONFIG_KEYS = {"source", "input", "normalization", "min_chars", "max_chars", "min_letter_fraction", "shards",
               "invalid_utf8", "special_tokens", "filters", "language", "near_dedup"}


@dataclass(frozen=True)
class CleanConfig:
    """A validated clean step config.

    Attributes:
        source: source name (``"brown"``).
        input: the fetch step whose ``raw.parquet`` to read (``"fetch-brown"``).
        normalization: ``"NFC"`` (default) or ``"NFKC"``.
        thresholds: basic filter thresholds (defaults and sources in :class:`FilterThresholds`).
        shards: number of document shard files, >= 1 (default 1).
        invalid_utf8: ``"quarantine"`` (default) or ``"repair"``.
        special_tokens: ``"text"`` (default), ``"strip"`` or ``"quarantine"``.
        filters: the source's quality filters (:class:`tidal.data.filters.QualityFilters`).
        language: allowed languages and minimum confidence (:class:`LanguageFilter`).
        near_dedup: near-duplicate settings (:class:`tidal.data.neardup.NearDupConfig`).
    """

    source: str
    input: str
    normalization: str
    thresholds: FilterThresholds
    shards: int
    invalid_utf8: str = "quarantine"
    special_tokens: str = "text"
    filters: QualityFilters = field(default_factory=QualityFilters)
    language: LanguageFilter = field(default_factory=LanguageFilter)
    near_dedup: NearDupConfig = field(default_factory=NearDupConfig)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> CleanConfig:
        """Validate a step config.

        Raises:
            ValueError: naming an unknown or missing key, or a bad value.
        """
        unknown = sorted(set(config) - CONFIG_KEYS)
        if unknown:
            raise ValueError(f"clean config has unknown key(s) {unknown}; known {sorted(CONFIG_KEYS)}")
        for key in ("source", "input"):
            if not isinstance(config.get(key), str) or not config[key]:
                raise ValueError(f"clean config {key!r} must be a non-empty string, got {config.get(key)!r}")
        shards = config.get("shards", 1)
        if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= 99999:
            raise ValueError(f"clean config 'shards' must be an integer in [1, 99999], got {shards!r}")
        invalid_utf8 = config.get("invalid_utf8", "quarantine")
        if invalid_utf8 not in UTF8_POLICIES:
            raise ValueError(f"clean config 'invalid_utf8' must be one of {UTF8_POLICIES}, got {invalid_utf8!r}")
        special = config.get("special_tokens", "text")
        if special not in SPECIAL_TOKEN_POLICIES:
            raise ValueError(f"clean config 'special_tokens' must be one of {SPECIAL_TOKEN_POLICIES}, got {special!r}")
        return cls(
            source=config["source"],
            input=config["input"],
            normalization=check_form(config.get("normalization", "NFC")),
            thresholds=FilterThresholds.from_config(config),
            shards=shards,
            invalid_utf8=invalid_utf8,
            special_tokens=special,
            filters=QualityFilters.from_config(config.get("filters")),
            language=LanguageFilter.from_config(config.get("language")),
            near_dedup=NearDupConfig.from_config(config.get("near_dedup")),
        )

    def rule_names(self) -> list[str]:
        """Every filter rule this config can report, in check order."""
        return [*FILTER_RULES, *self.filters.rule_names(), *(f"language.{r}" for r in LANGUAGE_RULES)]
