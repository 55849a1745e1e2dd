"""The mix step's config (:class:`MixConfig`) and the recipe's ``mixture`` section
(:class:`MixtureSettings`), the part of it a recipe sets. Light on purpose (no numpy, no
pyarrow): the recipe imports it.

Weights are normalized here, once, before anything hashes them (:func:`normalized_weights`), so
``{a: 2, b: 2}`` and ``{a: 0.5, b: 0.5}`` are the same mixture with the same step id.
"""

from __future__ import annotations

import itertools
from fractions import Fraction
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, model_serializer, model_validator
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


# Weights as the step ids hash them: normalized once, by the model that parses them.
NormalizedWeights = Annotated[dict[str, Weight], AfterValidator(normalized_weights)]


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
MAX_BLOCK_SEQUENCES = 1 << 20  # a block's counts are exact; a bigger block only coarsens a stage's boundary


class MixtureStage(Strict):
    """One stage of a staged load-time mixture (``mixture.stages``): its weights, and where it ends as a
    fraction of the mixture's sequences or as a training step (the last stage names neither and runs on)."""

    weights: NormalizedWeights = Field(min_length=1, description="source name -> relative weight in this "
                                       "stage (a source left out draws nothing here); normalized to sum 1")
    until_fraction: Annotated[float, Field(gt=0.0, lt=1.0, allow_inf_nan=False)] | None = Field(
        default=None, description="the stage ends after this fraction of the mixture's sequences (rounded to "
        "whole blocks of block_sequences)")
    until_step: PositiveInt | None = Field(default=None, description="the stage ends at this training step "
                                           "(step x train.batch_size sequences, rounded to whole blocks)")

    @model_validator(mode="after")
    def _one_end(self) -> MixtureStage:
        if self.until_fraction is not None and self.until_step is not None:
            raise field_error("MixtureStage", ("until_step",), "a stage ends either at until_fraction or at "
                              "until_step, not both", self.until_step)
        return self

    @model_serializer(mode="wrap")
    def _omit_open_end(self, handler: Any) -> dict[str, Any]:
        return omit_unused(handler(self), {"until_fraction": None, "until_step": None})


class MixtureSettings(Strict):
    """Mixture weights of the training sources (normalized to sum 1 before hashing) and the size."""

    weights: NormalizedWeights = Field(
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
    load_time: bool = Field(default=False, description="true: the mix step writes an index over the tokenized "
                            "sources (mixture.json) instead of copying their tokens, and training reads each "
                            "sequence from its source (tidal/data/mixture_index.py); a weight change then "
                            "rewrites only mixture.json")
    block_sequences: PositiveInt = Field(default=1024, le=MAX_BLOCK_SEQUENCES, description="load_time only: "
                                         "positions per block; every block holds exactly its stage's count of "
                                         "each source")
    stages: list[MixtureStage] | None = Field(default=None, min_length=1, description="load_time only: the "
                                              "mixture's stages in order, each {weights, until_fraction | "
                                              "until_step}; the last names no end. Without it: one stage of "
                                              "`weights`")

    @model_validator(mode="after")
    def _one_size(self) -> MixtureSettings:
        if self.n_sequences is not None and self.size.mode != "smallest_source":
            raise field_error("MixtureSettings", ("n_sequences",), "fixes the size without repetition; with size.mode "
                              "token_budget set size.tokens instead (leave n_sequences out)", self.n_sequences)
        if not self.load_time and (self.stages is not None or self.block_sequences != 1024):
            field = "stages" if self.stages is not None else "block_sequences"
            raise field_error("MixtureSettings", (field,), "belongs to a load-time mixture: set mixture.load_time: "
                              "true (a copied mixture has one set of weights)", getattr(self, field))
        if self.stages is not None:
            self._check_stages(self.stages)
        return self

    def _check_stages(self, stages: list[MixtureStage]) -> None:
        if self.size.mode != "token_budget":
            raise field_error("MixtureSettings", ("stages",), "a staged mixture needs size.mode token_budget (its "
                              "stages are fractions of a known number of sequences)", None)
        for i, stage in enumerate(stages):
            unknown = sorted(set(stage.weights) - set(self.weights))
            if unknown:
                raise field_error("MixtureSettings", ("stages", i, "weights"), f"sources {unknown} are not in "
                                  f"mixture.weights {sorted(self.weights)} (the sources of the mixture)", unknown)
            last = i == len(stages) - 1
            ends = stage.until_fraction is not None or stage.until_step is not None
            if ends == last:
                raise field_error("MixtureSettings", ("stages", i), "every stage but the last ends (until_fraction "
                                  "or until_step); the last runs to the end and names neither", None)
        kinds = {"until_fraction" if s.until_fraction is not None else "until_step" for s in stages[:-1]}
        if len(kinds) > 1:
            raise field_error("MixtureSettings", ("stages",), "stages end all by until_fraction or all by "
                              "until_step, not a mix", None)
        ends = [s.until_fraction if s.until_fraction is not None else s.until_step for s in stages[:-1]]
        if any(b <= a for a, b in itertools.pairwise(ends)):
            raise field_error("MixtureSettings", ("stages",), f"stage ends must increase, got {ends}", ends)

    @model_serializer(mode="wrap")
    def _omit_default_size(self, handler: Any) -> dict[str, Any]:
        # the default size stays out of dumps (step configs, the recipe hash): existing ids stay
        return omit_unused(handler(self), {"size": {"mode": "smallest_source"}, "load_time": False,
                                           "block_sequences": 1024, "stages": None,
                                           "batch_size": None})  # MixConfig's field

    def size_config(self) -> dict:
        """``size`` as the planner hashes it: nothing for the default ``smallest_source`` (ids of
        recipes without ``size`` stay as they were), ``{"size": {...}}`` otherwise."""
        dump = self.model_dump()
        return {"size": dump["size"]} if "size" in dump else {}

    def load_time_config(self) -> dict:
        """The load-time fields as the planner hashes them: nothing for a copied mixture (ids unchanged)."""
        dump = self.model_dump()
        return {k: dump[k] for k in ("load_time", "block_sequences", "stages") if k in dump}

    def expected_weights(self, seq_len: int, batch_size: int | None) -> dict[str, float]:
        """The mixture's overall weights: ``weights``, or for a staged mixture each stage's weights times its
        share of the ``ceil(size.tokens / seq_len)`` sequences (an ``until_step`` end is ``step * batch_size``
        sequences, capped at the mixture's size), normalized (what the gate holds ``realized`` to)."""
        if not self.stages:
            return dict(self.weights)
        total = -(-self.size.tokens // seq_len)
        ends = [s.until_fraction if s.until_fraction is not None else min(1.0, s.until_step * (batch_size or 0) / total)
                for s in self.stages[:-1]] + [1.0]
        shares = [b - a for a, b in zip([0.0, *ends], ends)]
        mixed = {src: sum(share * stage.weights.get(src, 0.0) for share, stage in zip(shares, self.stages))
                 for src in sorted(self.weights)}
        return normalized_weights(mixed)

    def uses_steps(self) -> bool:
        """True when a stage ends at a training step (the planner then hashes ``train.batch_size``)."""
        return any(s.until_step is not None for s in self.stages or ())


class MixConfig(MixtureSettings):
    """The mix step: the recipe's mixture, the tokenize step of each weighted source, and the
    recipe seed (hashed; the step draws from its context's seed, derived from it)."""

    inputs: dict[str, str] = Field(description="source name -> its tokenize step")
    seed: Annotated[int, StrictType(), Field(ge=0)] | None = Field(
        default=None, description="the recipe seed (in the step id; the order is drawn from the step's own seed)"
    )
    batch_size: PositiveInt | None = Field(default=None, description="train.batch_size, hashed only when a stage "
                                           "ends at until_step (sequences per training step)")
