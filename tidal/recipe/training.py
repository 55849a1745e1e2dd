"""Recipe section of training: the trainer's own config models, composed, plus where it runs.

The model shape (presets, GQA, MoE), optimizer, device mesh and training loop are typed once,
beside the trainer's code (:mod:`tidal.train.flops`, :mod:`tidal.train.config`), and used here
as they are: a recipe's ``train`` section is a :class:`tidal.train.config.TrainConfig` plus
``resources`` (tidal/launch/config.py), which says where training runs and is never hashed.
Everything else is hashed into the train step's id; ``continue_from`` (a committed train step to
continue) is hashed as the planner resolves it (:mod:`tidal.core.continuation`).
"""

from __future__ import annotations

from pydantic import Field

from tidal.recipe.operations import ResourceConfig
from tidal.train.config import ContinueFrom, MeshConfig, OptimizerConfig, TrainConfig
from tidal.train.flops import ModelConfig, MoEConfig

__all__ = ["ContinueFrom", "MeshConfig", "MoEConfig", "ModelConfig", "OptimizerConfig", "TrainConfig", "TrainSection"]


class TrainSection(TrainConfig):
    """A recipe's ``train`` section: the training run (:class:`tidal.train.config.TrainConfig`)
    and ``resources``, which the planner leaves out of the step config."""

    resources: ResourceConfig = Field(
        default=ResourceConfig(), description="where training runs: launcher, accelerator, pods (not hashed)")
