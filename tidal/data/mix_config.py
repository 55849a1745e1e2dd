"""The mix step's config (:class:`MixConfig`) and the recipe's ``mixture`` section
(:class:`MixtureSettings`), the part of it a recipe sets. Light on purpose (no numpy, no
pyarrow): the recipe imports it.

Weights are normalized here, once, before anything hashes them (:func:`normalized_weights`), so
``{a: 2, b: 2}`` and ``{a: 0.5, b: 0.5}`` are the same mixture with the same step id.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_serializer, model_validator
from pydantic import Strict as StrictType

from tidal.config import MAX_SHARDS, PositiveInt, Strict, field_error, omit_unused

# Upper bounds (issue 43): far above any mixture this pipeline is for, so only a typo or a hostile value
# meets them; a runaway size would up-sample or plan without end.
MAX_TOKENS = 10**14  # 100 T tokens: ~7x the largest published training sets (~15 T)
MAX_SEQUENCES = 10**12  # a trillion sequences: 8 T tokens at the shortest seq_len (8), 128 T at the default

Weight = Annotated[float, Field(gt=0.0, allow_inf_nan=False)]

# Weights whose decimal sum is within this of 1 are kept as written (recipes that already sum to 1,
# e.g. 0.4/0.3/0.3, keep their ids); others are divided by their sum and rounded to this many
# significant digits, whose sum is then within n * 5e-13 of 1: normalizing again changes nothing.
SUM_TOLERANCE = Fraction(1, 10**9)
WEIGHT_DIGITS = 12


def normalized_weights(weights: dict[str, float]) -> dict[str, float]:
    """``weights`` scaled to sum 1, the form that is hashed (idempotent).

    The sum is exact: each weight is read as the decimal it is written as (``Fraction(repr(w))``).
    Within :data:`SUM_TOLERANCE` of 1 the weights are returned as given; otherwise each is
    ``w / sum`` rounded to :data:`WEIGHT_DIGITS` significant digits (Python's correctly rounded
    formatting, the same on every machine). Rounding, not exact fractions, because step configs
    are JSON floats; the mix step then divides the hashed values by their exact sum again
    (:func:`tidal.data.mix_sizing.normalize_weights`), so what it computes is what the id says.
    """
    exact = {src: Fraction(repr(float(w))) for src, w in weights.items()}
    total = sum(exact.values())
    if total <= 0 or abs(total - 1) <= SUM_TOLERANCE:
        return dict(weights)
    return {src: float(format(float(w / total), f".{WEIGHT_DIGITS}g")) for src, w in exact.items()}


class SmallestSource(Strict):
    """``size: {mode: smallest_source}``: the largest mixture that repeats no sequence (or exactly
    ``n_sequences``): the source with the fewest tokens for its weight sets the size, the other
    sources' remaining tokens go unused (``tidal plan`` shows how many)."""

    mode: Literal["smallest_source"] = "smallest_source"


class TokenBudget(Strict):
    """``size: {mode: token_budget, tokens: N, max_epochs: E}``: ``ceil(N / seq_len)`` sequences,
    each source ``weight`` of them; a source with fewer is repeated (up-sampled: whole passes of
    its sequences, then a seeded subset) up to ``E`` passes, and refused beyond."""

    mode: Literal["token_budget"]
    tokens: PositiveInt = Field(le=MAX_TOKENS, description="training tokens in the mixture (rounded up to whole "
                                f"sequences); at most {MAX_TOKENS:,} (100 T: ~7x the largest published training "
                                "sets, so a larger value is a typo)")
    max_epochs: Annotated[float, Field(ge=1.0, allow_inf_nan=False)] = Field(
        default=1.0, description="most passes over any one source's sequences (1: never repeat; 2.5: each "
        "sequence at most 3 times, 2.5 x its sequences in all)")


MixtureSize = Annotated[SmallestSource | TokenBudget, Field(discriminator="mode")]


class MixtureSettings(Strict):
    """Mixture weights of the training sources (normalized to sum 1 before hashing) and the size."""

    weights: dict[str, Weight] = Field(
        min_length=1, description="source name -> relative weight (normalized to sum 1, then hashed)")
    size: MixtureSize = Field(
        default_factory=SmallestSource,
        description="how big the mixture is: {mode: smallest_source} (default: the largest without "
        "repeating a sequence) or {mode: token_budget, tokens: N, max_epochs: E} (up-samples small sources)")
    n_sequences: PositiveInt | None = Field(
        default=None, le=MAX_SEQUENCES, description="total sequences, never repeated (smallest_source only); "
        f"default: the most without repeating any; at most {MAX_SEQUENCES:,} (a trillion: more than any "
        "corpus this pipeline is for, so a larger value is a typo)"
    )
    shards: PositiveInt = Field(default=1, le=MAX_SHARDS, description=f"mixture shard count; at most {MAX_SHARDS:,} "
                                "(shard files are numbered with five digits)")

    @field_validator("weights")
    @classmethod
    def _normalize(cls, weights: dict[str, float]) -> dict[str, float]:
        return normalized_weights(weights)

    @model_validator(mode="after")
    def _one_size(self) -> MixtureSettings:
        if self.n_sequences is not None and self.size.mode != "smallest_source":
            raise field_error("MixtureSettings", ("n_sequences",), "fixes the size without repetition; with size.mode "
                              "token_budget set size.tokens instead (leave n_sequences out)", self.n_sequences)
        return self

    @model_serializer(mode="wrap")
    def _omit_default_size(self, handler: Any) -> dict[str, Any]:
        # the default size stays out of dumps (step configs, the recipe hash): existing ids stay
        return omit_unused(handler(self), {"size": {"mode": "smallest_source"}})

    def size_config(self) -> dict:
        """``size`` as the planner hashes it: nothing for the default ``smallest_source`` (ids of
        recipes without ``size`` stay as they were), ``{"size": {...}}`` otherwise."""
        dump = self.model_dump()
        return {"size": dump["size"]} if "size" in dump else {}


class MixConfig(MixtureSettings):
    """The mix step: the recipe's mixture, the tokenize step of each weighted source, and the
    recipe seed (hashed; the step draws from its context's seed, derived from it)."""

    inputs: dict[str, str] = Field(description="source name -> its tokenize step")
    seed: Annotated[int, StrictType(), Field(ge=0)] | None = Field(
        default=None, description="the recipe seed (in the step id; the order is drawn from the step's own seed)"
    )
