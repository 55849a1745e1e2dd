"""The recipe's ``evaluation.tasks`` section (:class:`DownstreamSettings`) and the eval step's config
(:class:`EvalStepConfig`). Light on purpose (no lm-eval, no JAX): the recipe imports it."""

from __future__ import annotations

import importlib.metadata
from typing import Annotated, Any

from pydantic import Field, field_validator, model_serializer
from pydantic import Strict as StrictType

from tidal.config import Strict, omit_unused
from tidal.eval.suite import available_tasks


def lm_eval_version() -> str:
    """The installed lm-eval's version string (e.g. ``0.4.13``), read from its package metadata
    (importing no lm-eval): hashed into the eval step's config at plan time."""
    return importlib.metadata.version("lm-eval")


class DownstreamSettings(Strict):
    """Downstream tasks run through lm-evaluation-harness on the train step's final checkpoint."""

    tasks: list[str] = Field(min_length=1, description="task names defined in tidal/eval/tasks/<name>.yaml "
                             "(regenerate with python -m tidal.eval.build_tasks)")
    batch_size: Annotated[int, StrictType(), Field(ge=1, le=1024)] = Field(
        default=8, description="sequences per forward pass (scores do not depend on it; recorded)")
    num_fewshot: Annotated[int, StrictType(), Field(ge=0, le=0)] = Field(
        default=0, description="in-context examples per item (0: the local tasks have no few-shot split)")

    @field_validator("tasks")
    @classmethod
    def _known(cls, tasks: list[str]) -> list[str]:
        known = available_tasks()
        unknown = sorted(set(tasks) - set(known))
        if unknown:
            raise ValueError(f"unknown eval tasks {unknown}; defined in tidal/eval/tasks/: {known}")
        if len(set(tasks)) != len(tasks):
            raise ValueError("a task is listed twice")
        return sorted(tasks)


class EvalStepConfig(DownstreamSettings):
    """One eval step: the recipe's settings, each task's definition hash, its inputs and lm-eval's version."""

    task_hashes: dict[str, str] = Field(description="task -> sha256 of its YAML and data (tidal/eval/suite.py)")
    train: str = Field(min_length=1, description="the train step whose final checkpoint is evaluated")
    tokenizer: str = Field(min_length=1, description="the tokenizer step")
    lm_eval_version: str = Field(min_length=1, description="lm-eval's version (results depend on it)")
    seq_len: Annotated[int, StrictType(), Field(ge=8)] = Field(
        description="tokens per packed training sequence (tokenize.seq_len); the model's context is seq_len - 1")
    checkpoint_step: Annotated[int, StrictType(), Field(ge=0)] | None = Field(
        default=None, description="the kept checkpoint evaluated (a permanent one, tidal/eval/checkpoints.py); "
        "None: the train step's final checkpoint")

    @model_serializer(mode="wrap")
    def _omit_unset(self, handler: Any) -> dict[str, Any]:
        # the final checkpoint's eval step keeps the id it had before checkpoint_step existed
        return omit_unused(handler(self), {"checkpoint_step": None})
