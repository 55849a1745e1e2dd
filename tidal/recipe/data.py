"""Recipe sections of the data steps. Each is, or is composed of, the config model of the step kind
that reads it, defined beside that kind's code, so a rule or default is typed once:

* a source (:class:`Source`): where its corpus comes from (:class:`tidal.data.fetch_config.FetchSettings`,
  with :class:`tidal.data.archives.Archive`), its own quality filters
  (:class:`tidal.data.filters.QualityFilters`) and languages (:class:`tidal.data.langid.LanguageFilter`),
  and its licence (recipe-only);
* ``clean``: :class:`tidal.data.clean.config.CleanSettings` (with its filters and
  :class:`tidal.data.clean.config.NearDupConfig`);
* ``tokenizer``, ``tokenize``, ``mixture``: :mod:`tidal.data.tokenizer_config`,
  :mod:`tidal.data.tokenize_config`, :mod:`tidal.data.mix_config`;
* ``gate``: :class:`tidal.quality.gates.GateSettings`;
* ``evaluation`` (:class:`EvaluationConfig`, recipe-only).

Every field here is hashed into the ids of the steps that read it (tidal/core/planner.py), except
a source's licence fields.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from tidal.config import Strict
from tidal.data.fetch_config import FetchSettings
from tidal.data.filters import QualityFilters
from tidal.data.heldout import HeldoutSettings
from tidal.data.langid import LanguageFilter
from tidal.quality.licences import Use


class LicenceOverride(Strict):
    """Uses a source's rights holder granted beyond its licence (recorded in MLflow and lineage)."""

    uses: list[Use] = Field(min_length=1, description="uses granted beyond the licence's table row")
    reason: str = Field(min_length=10, description="who granted it and where it is written, e.g. a contract ref")


class Source(FetchSettings):
    """One corpus: where its archive or files come from and how to read them (the fetch step's
    settings), its own filters and languages (the clean step's), and its licence."""

    filters: QualityFilters | None = Field(
        default=None, description="per-source quality filters: each section given here replaces clean.filters'"
    )
    language: LanguageFilter = Field(
        default_factory=LanguageFilter, description="allowed languages of this source (langid)"
    )
    licence: str = Field(min_length=1, description="SPDX identifier of the text's licence (tidal/quality/licences.py)")
    permitted_uses: list[Use] | None = Field(
        default=None, description="narrow the licence's uses (never widen; default: all the licence permits)"
    )
    licence_override: LicenceOverride | None = Field(
        default=None, description="widen the uses of a known licence, with a reason (not hashed)"
    )

    def clean_overrides(self, defaults: QualityFilters) -> dict[str, Any]:
        """The per-source part of the clean step config: merged ``filters`` and ``language``."""
        return {"filters": defaults.overridden_by(self.filters).model_dump(), "language": self.language.model_dump()}


class EvaluationConfig(Strict):
    """What the train step evaluates: whole sources kept out of the mixture (out of distribution, e.g.
    UDHR) and an in-distribution held-out split of every training source (``heldout/<source>``)."""

    sources: list[str] = Field(default_factory=list, description="source names used only for eval loss")
    heldout: HeldoutSettings | None = Field(
        default=None, description="hold out a fraction of every training source's documents (tidal/data/heldout.py)"
    )

    @model_validator(mode="after")
    def _something_to_evaluate(self) -> EvaluationConfig:
        if not self.sources and self.heldout is None:
            raise ValueError("evaluation needs `sources` (held-out sources), `heldout` (a split of the "
                             "training sources) or both")
        return self
