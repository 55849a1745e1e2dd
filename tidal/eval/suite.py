"""The eval task definitions in the repository (``tidal/eval/tasks/<task>.yaml`` + its JSONL) and their hashes.

Invariant: a task's hash is the sha256 of its YAML bytes and its data file's bytes (``task_hash``); the
eval step's config carries it, so editing a task's definition or its items gives the eval step a new id.
Nothing is downloaded: each task reads its local JSONL through ``datasets``' ``json`` builder, with the
data file's path made absolute and the ``datasets`` cache in a directory the caller owns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tidal.data.eval_tasks import TASKS_DIR, task_data_file, task_hash

__all__ = ["available_tasks", "task_definition", "task_hash", "task_specs"]


def available_tasks(tasks_dir: Path = TASKS_DIR) -> list[str]:
    """Names of the task definitions in ``tasks_dir``, sorted."""
    return sorted(p.stem for p in tasks_dir.glob("*.yaml"))


def task_definition(name: str, tasks_dir: Path = TASKS_DIR) -> dict[str, Any]:
    """The parsed YAML of task ``name`` (:func:`tidal.data.eval_tasks.task_data_file`).

    Raises:
        ValueError: no such task (naming the known ones), or its YAML has no local ``data_files.test``.
    """
    return task_data_file(name, tasks_dir)[1]


def task_specs(names: list[str], cache_dir: Path, tasks_dir: Path = TASKS_DIR) -> list[dict[str, Any]]:
    """lm-eval task configs (dicts for ``simple_evaluate(tasks=...)``) with absolute local data paths and
    ``datasets``' cache under ``cache_dir``."""
    specs = []
    for name in names:
        config = task_definition(name, tasks_dir)
        data = (tasks_dir / config["dataset_kwargs"]["data_files"]["test"]).resolve()
        config["dataset_kwargs"] = {"data_files": {"test": str(data)}, "cache_dir": str(cache_dir)}
        specs.append(config)
    return specs
