"""Reading a recipe: YAML (duplicate keys refused), dotted-path overrides, validation, and
errors that name the file, the dotted field and the rule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tidal.config import RecipeError, problems
from tidal.recipe.schema import Recipe
from tidal.recipe.yaml_file import MAX_RECIPE_BYTES, read_yaml

__all__ = ["MAX_RECIPE_BYTES", "load_recipe", "parse_recipe", "read_yaml"]


def _format_errors(path: str, err: ValidationError) -> str:
    lines = problems(err, unknown="unknown field (check the spelling; see `tidal recipe-schema`)", yaml_hints=True)
    return "\n".join([f"{path}: {err.error_count()} problem(s) in the recipe:", *(f"  {line}" for line in lines)])


def parse_recipe(data: Any, path: str = "<recipe>", overrides: dict[str, Any] | None = None,
                 recipe_dir: Path | None = None) -> Recipe:
    """Validate recipe data (already parsed YAML), optionally with dotted-path overrides.

    Args:
        data: the mapping from YAML.
        path: file name used in error messages.
        overrides: ``{"train.steps": 10, "seed": 3}`` applied before validation.
        recipe_dir: the recipe file's directory, which relative file names in it (``licences:``) are
            resolved against; None for a recipe given as data.

    Raises:
        RecipeError: listing every invalid field as ``path: dotted.field: reason (got value)``.
    """
    if data is None:
        raise RecipeError(f"{path}: the recipe is empty")
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a recipe must be a YAML mapping, got {type(data).__name__}")
    data = _apply_overrides(data, overrides or {}, path)
    try:
        return Recipe.model_validate(data, context={"recipe_dir": recipe_dir})
    except ValidationError as err:
        raise RecipeError(_format_errors(path, err)) from None


def _apply_overrides(data: dict, overrides: dict[str, Any], path: str) -> dict:
    import copy

    data = copy.deepcopy(data)
    for dotted, value in overrides.items():
        node = data
        parts = dotted.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise RecipeError(f"{path}: override {dotted!r}: {part!r} is not a section")
            node = child
        node[parts[-1]] = value
    return data


def load_recipe(path: str | Path, overrides: dict[str, Any] | None = None) -> Recipe:
    """Read and validate a recipe YAML file.

    Raises:
        RecipeError: file missing, YAML syntax error (with line and column), or invalid fields.
    """
    return parse_recipe(read_yaml(path), str(path), overrides, recipe_dir=Path(path).parent)
