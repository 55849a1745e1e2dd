"""The tokenize step's config (:class:`TokenizeConfig`) and the recipe's ``tokenize`` section
(:class:`TokenizeSettings`), the part of it a recipe sets. Light on purpose (no Beam, no
``tokenizers``): the recipe imports it."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, model_serializer
from pydantic import Strict as StrictType

from tidal.config import MAX_SHARDS, PositiveInt, Strict, omit_unused
from tidal.data.heldout import HeldoutSplit


class TokenizeSettings(Strict):
    """Encoding and packing into fixed-length sequences."""

    seq_len: Annotated[int, StrictType(), Field(ge=8, le=65536)] = Field(
        default=128, description="tokens per packed sequence; 8 to 65,536 (at most 64 k: the attention's memory "
        "grows with its square)"
    )
    shards: PositiveInt = Field(default=1, le=MAX_SHARDS, description=f"token shard count per source; at most "
                                f"{MAX_SHARDS:,} (shard files are numbered with five digits)")


class TokenizeConfig(TokenizeSettings):
    """One tokenize step: the recipe's settings, the source, its clean step and the tokenizer step."""

    source: str = Field(min_length=1, description="source name, e.g. brown")
    input: str = Field(min_length=1, description="the clean step whose document shards to encode")
    tokenizer: str = Field(default="tokenizer", min_length=1, description="the tokenizer step to encode with")
    heldout: HeldoutSplit | None = Field(
        default=None, description="documents packed apart as the held-out split (heldout-*), not into the "
        "training shards (tidal/data/heldout.py); None: every document is training data")

    @model_serializer(mode="wrap")
    def _omit_unset_split(self, handler: Any) -> dict[str, Any]:
        # no split: the key stays out of the step config, so recipes without one keep their step ids
        return omit_unused(handler(self), {"heldout": None})
