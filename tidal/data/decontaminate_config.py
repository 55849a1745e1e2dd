"""The decontaminate step's config: the recipe's ``decontamination`` section and one step's config.

Light on purpose (pydantic only): the recipe imports it. The rule itself is in
:mod:`tidal.data.decontaminate`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_serializer

from tidal.config import Fraction, Strict, omit_unused
from tidal.data.heldout import HeldoutSplit

# GPT-3 (Brown et al. 2020, "Language Models are Few-Shot Learners", appendix C): 13-gram overlap.
DEFAULT_N = 13


class DecontaminationSettings(Strict):
    """The recipe's ``decontamination``: remove training text that contains an eval source's n-grams.

    A paragraph (a line of the document) is contaminated when it has at least one of the eval index's
    n-grams and the share of its n-grams found is at least ``threshold``; ``remove`` says whether the
    paragraph or its whole document is removed.
    """

    n: Annotated[int, Field(ge=1, le=64)] = Field(
        default=DEFAULT_N, description="words per n-gram (folded words; a CJK character is a word); 13 is GPT-3's "
        "(Brown et al. 2020, appendix C) and datatrove's decontamination default")
    threshold: Fraction = Field(
        default=0.5, description="share of a paragraph's n-grams found in the eval index that marks it "
        "contaminated (0: any one n-gram)")
    remove: Literal["paragraph", "document"] = Field(
        default="paragraph", description="what a contaminated paragraph removes: itself, or its whole document")


class DecontaminateConfig(DecontaminationSettings):
    """One ``decontaminate-{src}`` step: the settings, the training source's clean step, and every eval
    source's clean step (the index)."""

    source: str = Field(min_length=1, description="the training source, e.g. brown")
    input: str = Field(min_length=1, description="its clean step, e.g. clean-brown")
    eval: dict[str, str] = Field(min_length=1, description="eval source -> its clean step, e.g. {udhr: clean-udhr}")
    eval_tasks: dict[str, str] = Field(
        default_factory=dict, description="downstream eval task -> its definition's sha256 "
        "(tidal/data/eval_tasks.py): their items are indexed too, as eval source task:<name>")
    heldout: HeldoutSplit | None = Field(
        default=None, description="the recipe's held-out split: its documents are never training text, so they "
        "pass unchecked (a downstream task's items come from them)")

    @model_serializer(mode="wrap")
    def _omit_unset(self, handler: Any) -> dict[str, Any]:
        # a recipe without downstream tasks keeps the decontaminate ids it had before eval_tasks existed
        return omit_unused(handler(self), {"eval_tasks": {}, "heldout": None})
