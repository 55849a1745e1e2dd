"""The eval task definitions in the repository (``tidal/eval/tasks/<task>.yaml`` + its JSONL) and their hashes.

Invariant: a task's hash is the sha256 of its YAML bytes and its data file's bytes (``task_hash``); the
eval step's config carries it, so editing a task's definition or its items gives the eval step a new id.
Nothing is downloaded: each task reads its local JSONL through ``datasets``' ``json`` builder, with the
data file's path made absolute and the ``datasets`` cache in a directory the caller owns.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import yaml

from tidal.eval.build_tasks import TASKS_DIR


def available_tasks(tasks_dir: Path = TASKS_DIR) -> list[str]:
    """Names of the task definitions in ``tasks_dir``, sorted."""
    return sorted(p.stem for p in tasks_dir.glob("*.yaml"))


def task_definition(name: str, tasks_dir: Path = TASKS_DIR) -> dict[str, Any]:
    """The parsed YAML of task ``name``.

    Raises:
        ValueError: no such task (naming the known ones), or its YAML has no local ``data_files.test``.
    """
    path = tasks_dir / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"eval task {name!r}: no {path}; known tasks: {available_tasks(tasks_dir)}")
    config = yaml.safe_load(path.read_text())
    data = ((config.get("dataset_kwargs") or {}).get("data_files") or {}).get("test")
    if config.get("dataset_path") != "json" or not isinstance(data, str) or "://" in data:
        raise ValueError(f"{path}: dataset_path must be json with dataset_kwargs.data_files.test a local file "
                         "name (nothing is downloaded)")
    return config


def task_hash(name: str, tasks_dir: Path = TASKS_DIR) -> str:
    """sha256 (hex) of the task's YAML bytes, a NUL byte, then its data file's bytes."""
    config = task_definition(name, tasks_dir)
    data = tasks_dir / config["dataset_kwargs"]["data_files"]["test"]
    return hashlib.sha256((tasks_dir / f"{name}.yaml").read_bytes() + b"\0" + data.read_bytes()).hexdigest()


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
