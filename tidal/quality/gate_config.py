"""The recipe's ``gate`` section (:class:`GateSettings`) and the gate step's config
(:class:`GateConfig`). Light on purpose (no Great Expectations, no pandas): the recipe and the
planner import it; :mod:`tidal.quality.gates` runs the step."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, model_serializer, model_validator

from tidal.config import Fraction, PositiveInt, Strict, omit_unused


class GateSettings(Strict):
    """Great Expectations thresholds over the stats that must hold before training: the recipe's
    ``gate`` section (its defaults are the only ones; the planner writes every field)."""

    min_total_tokens: PositiveInt = Field(description="fewest tokens in the mixture")
    mixture_tolerance: Annotated[float, Field(gt=0.0, lt=1.0)] = Field(
        default=0.02, description="allowed |realized - requested| mixture weight"
    )
    max_quarantine_rate: Fraction = Field(default=0.05, description="over all cleaned sources")
    max_duplicate_rate: Fraction | None = Field(default=None, description="per source, if set")
    max_unused_token_fraction: Fraction | None = Field(
        default=None, description="most of the training sources' tokens the mixture may leave unused, if set "
        "(stats row all/mixture_unused_token_fraction; `tidal plan` shows the mixture table)")
    max_contaminated_fraction: Fraction | None = Field(
        default=None, description="most of a training source's documents (and of all) that may hold a paragraph "
        "contaminated by an eval source, if set (stats rows contaminated_rate; needs decontamination)")

    @model_serializer(mode="wrap")
    def _omit_unset(self, handler: Any) -> dict[str, Any]:
        # an unset bound stays out of the step config (and the recipe hash), like train's options
        return omit_unused(handler(self), {"max_unused_token_fraction": None, "max_contaminated_fraction": None})


class GateConfig(GateSettings):
    """The gate step: the recipe's thresholds, the stats step to read and the mixture weights."""

    stats: str = Field(default="stats", min_length=1, description="the stats step whose stats.parquet to read")
    weights: dict[str, Annotated[float, Field(ge=0.0, allow_inf_nan=False)]] = Field(
        min_length=1, description="source -> requested mixture weight (normalized here to sum 1)"
    )

    @model_validator(mode="after")
    def _weights_sum(self) -> GateConfig:
        total = sum(self.weights.values())
        if total <= 0:
            raise ValueError(f"weights sum to {total}; need > 0")
        return self

    @property
    def requested(self) -> dict[str, float]:
        """The weights normalized to sum 1, in sorted source order."""
        total = sum(self.weights.values())
        return {src: w / total for src, w in sorted(self.weights.items())}


__all__ = ["GateConfig", "GateSettings"]
