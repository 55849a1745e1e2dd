"""Recipes: the versioned YAML that says what a pretraining run computes.

Invariant: a recipe is validated completely before anything runs. Unknown fields and bad
values are refused with the file, the dotted path of the field and the reason, so that a
typo never silently falls back to a default. Fields that only say *where* or *how fast*
(``storage_root``, ``storage``, ``tracking_uri``, ``train.resources``, ``beam``) are kept apart from what is
computed: the planner never puts them into a step config, so they never change a step id.

The package has one module per concern; import every name from ``tidal.recipe``:

* :mod:`tidal.config`: constrained types, the strict base model, :class:`RecipeError`;
* :mod:`tidal.recipe.data`: sources and the data-step sections (clean, tokenizer, mixture, gate);
* :mod:`tidal.recipe.training`: model, optimizer, mesh and training loop;
* :mod:`tidal.recipe.operations`: the sections that are never hashed (resources, Beam,
  storage, schedule, baseline);
* :mod:`tidal.recipe.schema`: the whole :class:`Recipe` and its cross-section rules;
* :mod:`tidal.recipe.loader`: YAML, overrides and error messages (:func:`load_recipe`).
"""

from tidal.config import Fraction, PositiveInt, RecipeError, Sha256, Strict
from tidal.recipe.data import (
    Archive,
    CleanConfig,
    EvaluationConfig,
    FilterSections,
    GateConfig,
    LanguageConfig,
    LicenceOverride,
    MixtureConfig,
    NearDedupConfig,
    Source,
    TokenizeConfig,
    TokenizerConfig,
)
from tidal.recipe.loader import load_recipe, parse_recipe
from tidal.recipe.operations import (
    BEAM_JOB_ARGS,
    BEAM_RUNNERS,
    SCHEDULE_PRESETS,
    AcceleratorConfig,
    BaselineConfig,
    BeamConfig,
    ResourceConfig,
    StorageConfig,
)
from tidal.recipe.schema import Recipe
from tidal.recipe.training import MeshConfig, ModelConfig, MoEConfig, OptimizerConfig, TrainConfig

__all__ = [
    "BEAM_JOB_ARGS",
    "BEAM_RUNNERS",
    "SCHEDULE_PRESETS",
    "AcceleratorConfig",
    "Archive",
    "BaselineConfig",
    "BeamConfig",
    "CleanConfig",
    "EvaluationConfig",
    "FilterSections",
    "Fraction",
    "GateConfig",
    "LanguageConfig",
    "LicenceOverride",
    "MeshConfig",
    "MixtureConfig",
    "MoEConfig",
    "ModelConfig",
    "NearDedupConfig",
    "OptimizerConfig",
    "PositiveInt",
    "Recipe",
    "RecipeError",
    "ResourceConfig",
    "Sha256",
    "Source",
    "StorageConfig",
    "Strict",
    "TokenizeConfig",
    "TokenizerConfig",
    "TrainConfig",
    "load_recipe",
    "parse_recipe",
]
