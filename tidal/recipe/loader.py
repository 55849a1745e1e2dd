"""Reading a recipe: YAML (duplicate keys refused), dotted-path overrides, validation, and
errors that name the file, the dotted field and the rule.

A file source's relative ``path`` is read from the recipe file's directory (as ``storage_root``
and ``baseline.file``), whatever the current directory: :func:`load_recipe` writes it out
absolute, and a local path that does not exist is a :class:`RecipeError` naming the recipe file
and ``sources.<name>.path``. URIs (``s3://...``) are left as they are."""

from __future__ import annotations

import copy
import os
import re
import stat
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tidal.config import RecipeError, problems
from tidal.recipe.schema import Recipe
from tidal.recipe.yaml_file import MAX_RECIPE_BYTES, file_kind, read_yaml

__all__ = ["MAX_RECIPE_BYTES", "load_recipe", "parse_recipe", "read_yaml"]


def _format_errors(path: str, err: ValidationError, overrides: dict[str, Any] | None = None) -> str:
    """Every problem as ``dotted.field: rule (got value)``; a problem in a field an override set names the flag
    (``--set FIELD=VALUE``), and when every problem is one, the header names the flags, not the file."""
    lines = problems(err, unknown="unknown field (check the spelling; see `tidal recipe-schema`)", yaml_hints=True)
    flagged = []
    for line in lines:
        field = line.split(":", 1)[0]
        flag = next((k for k in overrides or {}
                     if field == k or field.startswith(k + ".") or k.startswith(field + ".")), None)
        flagged.append((f"--set {flag}={overrides[flag]!r}: {line}" if flag else line, flag is not None))
    if flagged and all(from_flag for _, from_flag in flagged):
        head = f"--set: {err.error_count()} problem(s) in the overrides of {path}:"
    else:
        head = f"{path}: {err.error_count()} problem(s) in the recipe:"
    return "\n".join([head, *(f"  {line}" for line, _ in flagged)])


def parse_recipe(data: Any, path: str = "<recipe>", overrides: dict[str, Any] | None = None,
                 base: Path | None = None) -> Recipe:
    """Validate recipe data (already parsed YAML), optionally with dotted-path overrides.

    Args:
        data: the mapping from YAML.
        path: file name used in error messages.
        overrides: ``{"train.steps": 10, "seed": 3}`` applied before validation.
        base: the recipe file's directory: relative source paths are made absolute against it
            and local ones must exist (module docstring), and relative file names in it
            (``licences:``) are resolved against it; ``None`` (a recipe given as data) leaves them.

    Raises:
        RecipeError: listing every invalid field as ``path: dotted.field: reason (got value)``;
            with ``base``, a local source path that does not exist.
    """
    if data is None:
        raise RecipeError(f"{path}: the recipe is empty")
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a recipe must be a YAML mapping, got {type(data).__name__}")
    data = _apply_overrides(data, overrides or {}, path)
    if base is not None:
        data = _resolve_source_paths(data, base)
    try:
        recipe = Recipe.model_validate(data, context={"recipe_dir": base})
    except ValidationError as err:
        raise RecipeError(_format_errors(path, err, overrides)) from None
    if base is not None:
        _check_source_paths(recipe, path, base)
    return recipe


def _resolve_source_paths(data: dict, base: Path) -> dict:
    """``data`` with each source's relative local ``path`` joined to ``base`` (a copy where changed)."""
    sources = data.get("sources")
    if not isinstance(sources, dict):
        return data
    resolved = {}
    for name, source in sources.items():
        where = source.get("path") if isinstance(source, dict) else None
        if isinstance(where, str) and where and "://" not in where and not Path(where).is_absolute():
            source = {**source, "path": str(base / where)}
        resolved[name] = source
    return {**data, "sources": resolved}


def _check_source_paths(recipe: Recipe, path: str, base: Path) -> None:
    """Every local source path must exist and be a regular file or a directory (never a device or FIFO:
    the fetch would read without end or block), and a URI must be one the fetch step reads (``s3://``).

    Raises:
        RecipeError: naming the recipe file, ``sources.<name>.path`` and the resolved path or the scheme;
            every source with the first kind of problem found (schemes, then missing paths, then the rest).
    """
    found: dict[int, list[str]] = {}
    for name, source in sorted(recipe.sources.items()):
        problem = None if source.path is None else _source_path_problem(source.path, base)
        if problem is not None:
            rank, why = problem
            found.setdefault(rank, []).append(f"{path}: sources.{name}.path: {why}")
    if found:
        raise RecipeError("\n".join(found[min(found)]))


def _source_path_problem(where: str, base: Path) -> tuple[int, str] | None:
    """What is wrong with one source path, ranked (0: a scheme the fetch cannot read, 1: missing, 2: not
    a regular file or directory), or None."""
    if "://" in where:
        if where.startswith("s3://"):
            return None
        return 0, (f"{where}: {where.split('://', 1)[0]}:// source paths are not supported (local paths and "
                   "s3:// only; for a GCS bucket use its S3-compatible XML API through s3:// with "
                   "TIDAL_S3_ENDPOINT_URL=https://storage.googleapis.com, or copy the files to a local or "
                   "mounted path)")
    if not os.path.lexists(where):
        return 1, f"{where} does not exist (a relative path is read from the recipe file's directory, {base})"
    rule = "(rule: a local source path is a regular file or a directory)"
    try:
        mode = os.stat(where).st_mode
    except OSError as err:  # a dangling symlink, a loop, no permission
        return 2, f"{where} cannot be read ({err.strerror or err}) {rule}"
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):  # a FIFO blocks the fetch, a device never ends
        return 2, f"{where} is a {file_kind(mode)}, not a regular file or directory {rule}"
    return None


def _apply_overrides(data: dict, overrides: dict[str, Any], path: str) -> dict:
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
    return parse_recipe(read_yaml(path), str(path), overrides, base=Path(path).resolve().parent)


_TOP_NAME = re.compile(r"""^name:[ \t]*(?:"([^"\n]*)"|'([^'\n]*)'|([^\s#'"][^#\n]*?))[ \t]*(?:#.*)?$""", re.MULTILINE)


def recipe_name(path: str | Path) -> str | None:
    """The top-level ``name`` of a YAML file, or None when it has none or cannot be read as YAML.

    A plain ``name: x`` line at column 0 is read without parsing the file (the DAG folder's scan reads every
    file before it builds a DAG, and a full parse costs more than the rest of that scan); anything else is
    parsed.
    """
    try:
        text = Path(path).read_text(errors="replace")[:MAX_RECIPE_BYTES]
    except OSError:
        return None
    found = _TOP_NAME.findall(text)
    if len(found) == 1:
        return next((part for part in found[0] if part), None)  # name: "" is no name
    try:
        data = read_yaml(path)
    except RecipeError:
        return None
    name = data.get("name") if isinstance(data, dict) else None
    return name if isinstance(name, str) else None


def namesakes(path: str | Path) -> list[Path]:
    """The other ``*.yaml`` files in ``path``'s folder whose top-level ``name`` is ``path``'s, sorted (the DAG
    folder's rule: a name is one DAG, ``tidal_<name>``, and one MLflow experiment)."""
    path = Path(path).resolve()
    name = recipe_name(path)
    if name is None:
        return []
    return sorted(p for p in path.parent.glob("*.yaml") if p.resolve() != path and recipe_name(p) == name)


def one_owner_error(name: str, paths: list[Path]) -> str:
    """The one line that refuses recipe files sharing ``name``."""
    return (f"recipe name {name!r} is claimed by {len(paths)} files: {', '.join(str(p) for p in sorted(paths))}; "
            f"rule: one recipe file per name in a folder (the name is the DAG tidal_{name} and its MLflow "
            "experiment): rename all but one")


def one_owner_warning(path: str | Path) -> str | None:
    """The ``warning:`` line for a recipe whose ``name`` another ``*.yaml`` file of its folder also has (as a DAG
    folder, that folder refuses both: one broken DAG ``tidal_<name>``), or None. The command line only says so:
    a run of one file is still that file's run."""
    others = namesakes(path)
    if not others:
        return None
    return (f"warning: {one_owner_error(str(recipe_name(path)), [Path(path).resolve(), *others])}; served as a DAG "
            "folder, neither becomes a DAG")
