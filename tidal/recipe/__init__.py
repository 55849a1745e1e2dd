"""Recipes: the versioned YAML that says what a pretraining run computes.

Invariant: a recipe is validated completely before anything runs. Unknown fields and bad
values are refused with the file, the dotted path of the field and the reason, so that a
typo never silently falls back to a default. Fields that only say *where* or *how fast*
(``storage_root``, ``storage``, ``tracking_uri``, ``train.resources``, ``beam``) are kept apart from what is
computed: the planner never puts them into a step config, so they never change a step id.

The package has one module per concern; import every name from ``tidal.recipe``:

* :mod:`tidal.config`: constrained types, the strict base model, :class:`RecipeError`;
* :mod:`tidal.recipe.data`: sources and the data-step sections, composed of the data kinds' own
  config models (:mod:`tidal.data.clean.config`, :mod:`tidal.data.fetch_config` ...);
* :mod:`tidal.recipe.training`: the ``train`` section, composed of the trainer's own config models
  (model, optimizer, mesh, training loop; :mod:`tidal.train.config`) and ``resources``;
* :mod:`tidal.recipe.operations`: the sections that are never hashed (resources, Beam,
  storage, schedule, baseline);
* :mod:`tidal.recipe.schema`: the whole :class:`Recipe` and its cross-section rules;
* :mod:`tidal.recipe.loader`: overrides, validation and error messages (:func:`load_recipe`);
* :mod:`tidal.recipe.yaml_file`: reading the YAML of a recipe, suite or licences file safely.
"""

from tidal.config import Fraction, PositiveInt, RecipeError, Sha256, Strict
from tidal.data.archives import Archive
from tidal.data.clean.config import CleanSettings
from tidal.data.fetch_config import FetchSettings
from tidal.data.filters import QualityFilters
from tidal.data.langid import LanguageFilter
from tidal.data.mix_config import MixtureSettings
from tidal.data.neardup_config import NearDupConfig
from tidal.data.tokenize_config import TokenizeSettings
from tidal.data.tokenizer_config import TokenizerSettings
from tidal.quality.gate_config import GateSettings
from tidal.recipe.data import EvaluationConfig, LicenceDeclaration, LicenceOverride, Source
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
from tidal.recipe.training import (
    MeshConfig,
    ModelConfig,
    MoEConfig,
    OptimizerConfig,
    TrainConfig,
    TrainSection,
)

__all__ = [
    "BEAM_JOB_ARGS",
    "BEAM_RUNNERS",
    "SCHEDULE_PRESETS",
    "AcceleratorConfig",
    "Archive",
    "BaselineConfig",
    "BeamConfig",
    "CleanSettings",
    "EvaluationConfig",
    "FetchSettings",
    "Fraction",
    "GateSettings",
    "LanguageFilter",
    "LicenceDeclaration",
    "LicenceOverride",
    "MeshConfig",
    "MixtureSettings",
    "MoEConfig",
    "ModelConfig",
    "NearDupConfig",
    "OptimizerConfig",
    "PositiveInt",
    "QualityFilters",
    "Recipe",
    "RecipeError",
    "ResourceConfig",
    "Sha256",
    "Source",
    "StorageConfig",
    "Strict",
    "TokenizeSettings",
    "TokenizerSettings",
    "TrainConfig",
    "TrainSection",
    "load_recipe",
    "parse_recipe",
]
