"""Open a recipe or a scaling suite as the pipeline that plans, runs and records it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tidal.core.pipeline import Pipeline
from tidal.core.suite_pipeline import SuitePipeline
from tidal.scaling.suite import is_suite_file


def load_pipeline(recipe_path: str | Path, overrides: dict[str, Any] | None = None,
                  storage_root: str | None = None) -> Pipeline:
    """A :class:`Pipeline` for a recipe file, or a :class:`~tidal.core.suite_pipeline.SuitePipeline`
    for a scaling-suite file (top-level ``kind: scaling_suite``), so ``tidal plan``/``run``/``report``
    and the DAG factory take either.

    Args:
        recipe_path: the YAML file.
        overrides: dotted-path overrides (``{"train.steps": 200}``).
        storage_root: overrides ``$TIDAL_STORAGE_ROOT`` and the recipe's ``storage_root``.

    Raises:
        tidal.recipe.RecipeError: the file is not a valid recipe or suite (names file and field).
    """
    path = Path(recipe_path).resolve()
    if is_suite_file(path):
        return SuitePipeline.load_suite(path, overrides, storage_root)
    return Pipeline.load(path, overrides, storage_root)
