"""The mix step's config (:class:`MixConfig`) and the recipe's ``mixture`` section
(:class:`MixtureSettings`), the part of it a recipe sets. Light on purpose (no numpy, no
pyarrow): the recipe imports it."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field
from pydantic import Strict as StrictType

from tidal.config import PositiveInt, Strict

Weight = Annotated[float, Field(gt=0.0, allow_inf_nan=False)]


class MixtureSettings(Strict):
    """Mixture weights of the training sources (normalized to sum 1)."""

    weights: dict[str, Weight] = Field(min_length=1, description="source name -> relative weight")
    n_sequences: PositiveInt | None = Field(
        default=None, description="total sequences; default: the most without repeating any"
    )
    shards: PositiveInt = Field(default=1, description="mixture shard count")


class MixConfig(MixtureSettings):
    """The mix step: the recipe's mixture, the tokenize step of each weighted source, and the
    recipe seed (hashed; the step draws from its context's seed, derived from it)."""

    inputs: dict[str, str] = Field(description="source name -> its tokenize step")
    seed: Annotated[int, StrictType(), Field(ge=0)] | None = Field(
        default=None, description="the recipe seed (in the step id; the order is drawn from the step's own seed)"
    )
