"""The in-distribution held-out split: which documents of a training source are kept out of training.

Invariant: a document is held out if and only if the first 8 bytes of
``sha256(f"{seed}:{document id}")``, read as a big-endian integer ``h``, satisfy
``h < fraction * 2**64`` (compared exactly, with the fraction read as the decimal it is written as).
The document id is the clean step's (the sha256 of the normalized text), so the split depends on
nothing but the recipe seed, the fraction and the text: not on shard counts, worker order or
which other documents exist. Exact duplicates share an id, and the clean step removes near
duplicates within a source, so a held-out document has no copy left in training.

The tokenizer step (mode ``train``) leaves the held-out documents out of the text it trains on, and
the tokenize step packs them apart (``heldout-tokens-*.npy``, ``heldout-meta.json``), so neither the
tokenizer nor the mixture nor the model ever sees them; the train step evaluates them as
``heldout/<source>``.
"""

from __future__ import annotations

import hashlib
from fractions import Fraction
from typing import Annotated

from pydantic import Field
from pydantic import Strict as StrictType

from tidal.config import Strict

HELDOUT_PREFIX = "heldout-"  # the tokenize step's held-out files: heldout-meta.json, heldout-tokens-*.npy
EVAL_PREFIX = "heldout/"  # eval set names of the held-out splits: heldout/<source>


class HeldoutSettings(Strict):
    """The recipe's ``evaluation.heldout``: the fraction of every training source's documents kept
    out of training (tokenizer and mixture) and evaluated in distribution as ``heldout/<source>``."""

    fraction: Annotated[float, Field(gt=0.0, le=0.5)] = Field(
        description="share of each training source's documents held out (by a hash of the document id "
                    "with the recipe seed), e.g. 0.01"
    )


class HeldoutSplit(HeldoutSettings):
    """The split as a step config carries it: the recipe's fraction and seed (both hashed)."""

    seed: Annotated[int, StrictType(), Field(ge=0)] = Field(description="the recipe seed")


def is_heldout(doc_id: str, split: HeldoutSplit) -> bool:
    """Whether document ``doc_id`` is in the held-out split (module docstring for the rule).

    Args:
        doc_id: the clean step's document id (any string; tidal's are 64 hex characters).

    Returns:
        True for a held-out document: about ``split.fraction`` of all ids, independently each.
    """
    digest = hashlib.sha256(f"{split.seed}:{doc_id}".encode()).digest()
    share = Fraction(repr(float(split.fraction)))
    return int.from_bytes(digest[:8], "big") * share.denominator < share.numerator * (1 << 64)


def split_config(fraction: float | None, seed: int) -> dict[str, float | int] | None:
    """The ``heldout`` entry of a tokenizer or tokenize step config: ``{"fraction", "seed"}``, or
    None when the recipe holds nothing out (the entry is then left out, so ids stay as they were)."""
    return None if fraction is None else HeldoutSplit(fraction=fraction, seed=seed).model_dump()
