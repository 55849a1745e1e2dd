"""Recipe section of training: the trainer's own config models, composed, plus where it runs.

The model shape (presets, GQA, MoE), optimizer, device mesh and training loop are typed once,
beside the trainer's code (:mod:`tidal.train.flops`, :mod:`tidal.train.config`), and used here
as they are: a recipe's ``train`` section is a :class:`tidal.train.config.TrainConfig` plus
``resources`` (tidal/launch/config.py), which says where training runs and is never hashed.
Everything else is hashed into the train step's id; ``continue_from`` (a committed train step to
continue) is hashed as the planner resolves it (:mod:`tidal.core.continuation`).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from tidal.config import PositiveInt, Strict, field_error
from tidal.recipe.operations import ResourceConfig
from tidal.train.config import ContinueFrom, MeshConfig, OptimizerConfig, TrainConfig
from tidal.train.flops import ModelConfig, MoEConfig

__all__ = ["ContinueFrom", "DecayBranch", "MeshConfig", "MoEConfig", "ModelConfig", "OptimizerConfig", "TrainConfig",
           "TrainSection"]


class DecayBranch(Strict):
    """One decay branch ("cooldown") of the recipe's WSD trunk: at a permanent checkpoint of the trunk, decay
    over ``steps`` new updates (a train step of its own, ``train-decay-<at>-<steps>``)."""

    at_step: PositiveInt | None = Field(default=None, description="the trunk's checkpoint to branch from (a "
                                        "multiple of checkpoint_permanent_every, below train.steps)")
    at_fraction: Annotated[float, Field(gt=0.0, lt=1.0, allow_inf_nan=False)] | None = Field(
        default=None, description="or the checkpoint at this fraction of train.steps (rounded to a step)")
    steps: PositiveInt = Field(description="updates of the decay")

    @model_validator(mode="after")
    def _one_place(self) -> DecayBranch:
        if (self.at_step is None) == (self.at_fraction is None):
            raise field_error("DecayBranch", ("at_step",), "a branch starts at at_step or at at_fraction (one of "
                              "them)", self.at_step)
        return self


class TrainSection(TrainConfig):
    """A recipe's ``train`` section: the training run (:class:`tidal.train.config.TrainConfig`)
    and ``resources``, which the planner leaves out of the step config, and ``decay_branches``, which
    the planner turns into train steps of their own (the trunk's id does not depend on them)."""

    resources: ResourceConfig = Field(
        default=ResourceConfig(), description="where training runs: launcher, accelerator, pods (not hashed)")
    decay_branches: list[DecayBranch] | None = Field(
        default=None, min_length=1, description="decay branches of this WSD run (Delphi's cooldowns): each "
        "{at_step | at_fraction, steps} is a train step that restores the trunk's permanent checkpoint and "
        "decays over `steps` updates (bitwise the WSD run that decays there); needs optimizer.schedule wsd and "
        "checkpoint_permanent_every")

    @model_validator(mode="after")
    def _branches_start_at_kept_checkpoints(self) -> TrainSection:
        if not self.decay_branches:
            return self
        if self.optimizer.schedule != "wsd" or self.checkpoint_permanent_every is None:
            raise field_error("TrainSection", ("decay_branches",), "branches decay a WSD trunk from its permanent "
                              "checkpoints: set optimizer.schedule: wsd and checkpoint_permanent_every", None)
        seen = set()
        for i, (at, steps) in enumerate(self.branch_points()):
            if at >= self.steps or at % self.checkpoint_permanent_every:
                raise field_error("TrainSection", ("decay_branches", i), f"starts at step {at}; rule: a branch "
                                  f"starts at a permanent checkpoint of the trunk (a multiple of "
                                  f"checkpoint_permanent_every = {self.checkpoint_permanent_every}, below steps = "
                                  f"{self.steps})", at)
            if (at, steps) in seen:
                raise field_error("TrainSection", ("decay_branches", i), f"branch at {at} over {steps} steps is "
                                  "listed twice", at)
            seen.add((at, steps))
        return self

    def branch_points(self) -> list[tuple[int, int]]:
        """``(checkpoint step, decay steps)`` of each decay branch, in the recipe's order."""
        return [(b.at_step if b.at_step is not None else round(b.at_fraction * self.steps), b.steps)
                for b in self.decay_branches or ()]
