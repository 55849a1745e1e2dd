"""The repository's eval task files as data: where they are, their hashes, and each item's text.

One place for both readers: the ``eval`` step (tidal/eval/suite.py: lm-eval runs the tasks) and the
``decontaminate`` step (tidal/data/decontaminate.py: training paragraphs are checked against the
tasks' items). A task is ``tidal/eval/tasks/<name>.yaml`` and the JSONL file it names; the data
layer reads them without importing lm-eval or the eval package.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import yaml

TASKS_DIR = Path(__file__).resolve().parents[1] / "eval" / "tasks"

__all__ = ["TASKS_DIR", "item_text", "task_data_file", "task_hash", "task_texts"]


def task_data_file(name: str, tasks_dir: Path = TASKS_DIR) -> tuple[Path, dict[str, Any]]:
    """``(data file, parsed YAML)`` of task ``name``.

    Raises:
        ValueError: no such task (naming the known ones), or its YAML has no local ``data_files.test``.
    """
    path = tasks_dir / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in tasks_dir.glob("*.yaml"))
        raise ValueError(f"eval task {name!r}: no {path}; known tasks: {known}")
    config = yaml.safe_load(path.read_text())
    data = ((config.get("dataset_kwargs") or {}).get("data_files") or {}).get("test")
    if config.get("dataset_path") != "json" or not isinstance(data, str) or "://" in data:
        raise ValueError(f"{path}: dataset_path must be json with dataset_kwargs.data_files.test a local file "
                         "name (nothing is downloaded)")
    return tasks_dir / data, config


def task_hash(name: str, tasks_dir: Path = TASKS_DIR) -> str:
    """sha256 (hex) of the task's YAML bytes, a NUL byte, then its data file's bytes."""
    data, _ = task_data_file(name, tasks_dir)
    return hashlib.sha256((tasks_dir / f"{name}.yaml").read_bytes() + b"\0" + data.read_bytes()).hexdigest()


def item_text(record: dict[str, Any]) -> str:
    """The text an item shows a model when it is answered right: ``text`` (a perplexity task), else
    ``context`` followed by its ``target`` (last word) or its correct choice (``choices[label]``).

    Raises:
        ValueError: a record with none of those fields (the rule is named).
    """
    if isinstance(record.get("text"), str):
        return record["text"]
    context = record.get("context")
    if isinstance(context, str):
        if isinstance(record.get("target"), str):
            return f"{context} {record['target']}"
        choices, label = record.get("choices"), record.get("label")
        if isinstance(choices, list) and isinstance(label, int) and 0 <= label < len(choices):
            return f"{context} {choices[label]}"
        return context
    raise ValueError("an eval task item needs a text field, or a context with a target or choices and a label")


def task_texts(name: str, expected_hash: str | None = None, tasks_dir: Path = TASKS_DIR) -> list[str]:
    """Every item's text of task ``name`` (:func:`item_text`), in file order.

    Raises:
        ValueError: the task's hash is not ``expected_hash`` (edited after planning), or an item is
            not JSON or has no text; each message names the file and line.
    """
    if expected_hash is not None and task_hash(name, tasks_dir) != expected_hash:
        raise ValueError(f"eval task {name}: its definition's hash {task_hash(name, tasks_dir)} is not the "
                         f"{expected_hash} this step was planned with; plan again")
    data, _ = task_data_file(name, tasks_dir)
    texts = []
    for number, line in enumerate(data.read_text(encoding="utf-8").splitlines(), 1):
        try:
            texts.append(item_text(json.loads(line)))
        except (ValueError, AttributeError) as err:
            raise ValueError(f"{data}:{number}: {err}") from None
    return texts
