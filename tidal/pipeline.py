"""One entry point for running a recipe's steps, shared by the CLI and the Airflow operators.

It loads the recipe, plans the graph, runs a step under the commit protocol and records it
in MLflow (a parent run per DAG run, found again by its ``run_key``; a nested run per step).
Tracking failures never fail a step: :class:`tidal.tracking.Tracker` buffers and warns.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from tidal.hashing import canonical_json, sha256_bytes
from tidal.planner import build_graph
from tidal.recipe import Recipe, load_recipe
from tidal.runner import StepResult, run_step
from tidal.steps import StepGraph
from tidal.storage import LocalStorage


@dataclass(frozen=True)
class Pipeline:
    """A loaded recipe with its graph, storage root and tracking URI.

    ``storage_root`` and ``tracking_uri`` come, in order of precedence, from the arguments,
    the environment (``TIDAL_STORAGE_ROOT``, ``MLFLOW_TRACKING_URI``) and the recipe.
    A relative storage root resolves against the directory of the recipe file (so
    ``recipes/tiny.yaml`` says ``../.tidal``); ``TIDAL_STORAGE_ROOT`` against the cwd.
    """

    recipe_path: Path
    recipe: Recipe
    storage: LocalStorage
    tracking_uri_setting: str | None = None

    @classmethod
    def load(
        cls,
        recipe_path: str | Path,
        overrides: dict[str, Any] | None = None,
        storage_root: str | None = None,
    ) -> Pipeline:
        """Load and validate a recipe. Raises :class:`tidal.recipe.RecipeError` on bad input."""
        import os

        path = Path(recipe_path).resolve()
        from tidal.scaling.suite import is_suite_file

        if cls is Pipeline and is_suite_file(path):  # a scaling suite (tidal/scaling/pipeline.py)
            from tidal.scaling.pipeline import SuitePipeline

            return SuitePipeline.load_suite(path, overrides, storage_root)
        recipe = load_recipe(path, overrides)
        override = storage_root or os.environ.get("TIDAL_STORAGE_ROOT")
        storage = (
            LocalStorage.from_uri(override)
            if override
            else LocalStorage.from_uri(recipe.storage_root, base=path.parent)
        )
        return cls(path, recipe, storage, os.environ.get("MLFLOW_TRACKING_URI") or recipe.tracking_uri)

    @cached_property
    def tracking_uri(self) -> str:
        """MLflow URI: the setting, else the embedded SQLite store in the storage root."""
        from tidal.tracking import tracking_uri_for

        return self.tracking_uri_setting or tracking_uri_for(self.storage.root)

    @cached_property
    def graph(self) -> StepGraph:
        """The recipe's step graph."""
        return build_graph(self.recipe)

    @cached_property
    def recipe_hash(self) -> str:
        """sha256 of the recipe's canonical JSON (what it computes and where)."""
        return sha256_bytes(canonical_json(self.recipe.model_dump(mode="json")).encode())

    def status(self, name: str) -> str:
        """``skip`` (committed), ``run`` (inputs committed) or ``blocked`` (waits on inputs)."""
        step = self.graph[name]
        if self.storage.is_committed(step.step_id):
            return "skip"
        if all(self.storage.is_committed(dep.step_id) for dep in step.inputs):
            return "run"
        return "blocked"

    def tracker(self):
        """A :class:`tidal.tracking.Tracker` for this recipe's experiment."""
        from tidal.tracking import Tracker

        return Tracker(self.tracking_uri, experiment=f"tidal-{self.recipe.name}")

    def parent_run(self, run_key: str) -> str | None:
        """The MLflow parent run for ``run_key`` (created on first use), or None if tracking is down."""
        params = _flatten(self.recipe.model_dump(mode="json"))
        tags = {
            "tidal.recipe": self.recipe.name,
            "tidal.recipe_version": str(self.recipe.version),
            "tidal.recipe_hash": self.recipe_hash,
            "tidal.recipe_path": str(self.recipe_path),
        }
        from tidal.provenance import git_sha

        tags["tidal.git_sha"] = git_sha()
        return self.tracker().parent_run(run_key, params=params, tags=tags)

    def run(self, name: str, run_key: str | None = None, force: bool = False) -> StepResult:
        """Run one step (or skip it if committed) and record it under ``run_key``'s parent run."""
        step = self.graph[name]
        try:
            result = run_step(step, self.storage, force=force)
        except Exception as err:
            if run_key is not None:
                self._track_failure(step, run_key, err)
            raise
        if run_key is not None:
            self.record(result, run_key)
        return result

    def _track_failure(self, step, run_key: str, err: Exception) -> None:
        """Record a failed step as a nested run (status ``failed``) with the kept evidence."""
        parent = self.parent_run(run_key)
        if parent is None:
            return
        attempts = self.storage.failed_attempts(step.step_id)
        evidence = [attempts[-1] / n for n in _ARTIFACTS.get(step.kind, ())] if attempts else []
        self.tracker().log_step(
            parent, step.name, step.step_id, step.kind, "failed",
            {"error": f"{type(err).__name__}: {err}"[:4000]},
            artifacts=[p for p in evidence if p.exists()],
            tags={"tidal.recipe_hash": self.recipe_hash, "tidal.error_type": type(err).__name__},
        )

    def record(self, result: StepResult, run_key: str) -> None:
        """Record a finished or skipped step as a nested MLflow run under ``run_key``'s parent."""
        tracker = self.tracker()
        parent = self.parent_run(run_key)
        if parent is None:
            return
        from tidal.provenance import git_sha

        tags = {"tidal.recipe_hash": self.recipe_hash, "tidal.git_sha": git_sha()}
        for key in ("tokenizer_hash", "archive_sha256", "checkpoint_root_hash", "params_sha256"):
            if isinstance(result.summary.get(key), str):
                tags[f"tidal.{key}"] = result.summary[key]
        step_json = result.out_dir / "step.json"
        if step_json.is_file():
            tags["tidal.manifest_root_hash"] = json.loads(step_json.read_text())["manifest_root_hash"]
        artifacts = [result.out_dir / name for name in _ARTIFACTS.get(result.kind, ())]
        history = _read_history(result.out_dir / "metrics.jsonl") if result.kind == "train" else None
        tracker.log_step(
            parent, result.name, result.step_id, result.kind, result.status, result.summary,
            history=history if result.status == "run" else None,
            artifacts=[p for p in artifacts if p.exists()] if result.status == "run" else [],
            tags=tags,
        )


_ARTIFACTS = {
    "clean": ("counts.json", "step.json"),
    "tokenizer": ("tokenizer_meta.json", "step.json"),
    "tokenize": ("meta.json",),
    "mix": ("mixture.json",),
    "stats": ("stats.json", "step.json"),
    "gate": ("gate_result.json", "data_docs"),
    "train": ("summary.json", "checkpoint_manifest.json", "step.json", "manifest.json"),
    "scaling_fit": ("fits.json", "runs.parquet", "params.parquet", "forecasts.parquet", "plots"),
}


def _read_history(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _flatten(data: Any, prefix: str = "") -> dict[str, str]:
    if isinstance(data, dict):
        out: dict[str, str] = {}
        for key, value in data.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): json.dumps(data) if not isinstance(data, str) else data}
