"""One entry point for running a recipe's steps, shared by the CLI and the Airflow operators.

It loads the recipe, plans the graph, runs a step under the commit protocol and records it
in MLflow (a parent run per DAG run, found again by its ``run_key``; a nested run per step).
Tracking failures never fail a step: :class:`tidal.tracking.Tracker` buffers and warns.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from tidal.config import RecipeError
from tidal.core.branch_curve import branch_curve
from tidal.core.checkpoint_evals import evaluate_checkpoints
from tidal.core.commit import StepResult, needs_run
from tidal.core.continuation import resolve_continuation
from tidal.core.mlflow_lineage import step_lineage
from tidal.core.planner import build_graph
from tidal.core.runner import run_step
from tidal.integrity.hashing import canonical_json, sha256_bytes
from tidal.integrity.provenance import git_sha
from tidal.quality.licences import licence_tags
from tidal.recipe import Recipe, load_recipe
from tidal.settings import current as current_settings
from tidal.settings import entry_point
from tidal.steps import StepGraph
from tidal.storage import Storage, StorageError, open_storage
from tidal.storage.layout import MANIFEST_JSON, STEP_JSON, SUMMARY_JSON
from tidal.tracking import Tracker, experiment_name, is_per_machine, safe_uri, tracking_uri_for
from tidal.train import CHECKPOINT_MANIFEST

#: parent-run tag: the run's dotted overrides as JSON (``{}`` for the recipe as written)
OVERRIDES_TAG = "tidal.overrides"


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
    storage: Storage
    tracking_uri_setting: str | None = None
    #: the dotted overrides this pipeline was loaded with (a DAG run's trigger form): recorded in its
    #: run plan and parent run, so tools find the run's own step ids (:func:`tidal.core.load.load_run_pipeline`)
    overrides: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(
        cls,
        recipe_path: str | Path,
        overrides: dict[str, Any] | None = None,
        storage_root: str | None = None,
    ) -> Pipeline:
        """Load and validate a recipe (not a scaling suite: :func:`tidal.core.load.load_pipeline` takes both).

        Raises:
            tidal.recipe.RecipeError: on bad input.
        """

        path = Path(recipe_path).resolve()
        recipe = load_recipe(path, overrides)
        override = storage_root or current_settings().storage_root
        settings = recipe.storage.settings()
        if override:
            storage = open_storage(override, settings=settings)  # a StorageError names TIDAL_STORAGE_ROOT's value
        else:
            try:
                storage = open_storage(recipe.storage_root, base=path.parent, settings=settings)
            except StorageError as err:
                raise RecipeError(f"{path}: storage_root: {err}") from None
        return cls(path, recipe, storage, current_settings().tracking_uri or recipe.tracking_uri,
                   dict(sorted((overrides or {}).items())))

    @cached_property
    def tracking_uri(self) -> str:
        """MLflow URI: the setting, else the embedded SQLite store in the storage root (for an
        object-store root: in its local cache directory, per machine; set ``tracking_uri``)."""
        return self.tracking_uri_setting or tracking_uri_for(self.storage.local_dir)

    @cached_property
    def graph(self) -> StepGraph:
        """The recipe's step graph (``train.continue_from`` resolved against the storage root).

        Raises:
            RecipeError: ``train.continue_from`` names no committed train step that can be continued.
        """
        return build_graph(self.recipe, lambda train: resolve_continuation(train, self.storage, str(self.recipe_path)))

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

    @property
    def experiment(self) -> str:
        """The MLflow experiment of this recipe's runs (:func:`tidal.tracking.experiment_name`)."""
        return experiment_name(self.recipe.name)

    def tracker(self):
        """A :class:`tidal.tracking.Tracker` for this recipe's experiment; calls it cannot deliver
        are buffered under the storage root (``.tracking/pending/``) unless the store is SQLite."""
        return Tracker(self.tracking_uri, experiment=self.experiment, store=self.storage)

    def tracking_problem(self) -> str | None:
        """Why this pipeline cannot run on several machines as configured, or None.

        An object-store root (``s3://``, ``gs://``) is shared by every pod, but a tracking URI
        that is a file on one machine (``sqlite:///``, a path, ``file:``; the default for an
        object-store root is SQLite in the local cache) is not: each pod would record into
        its own store, and the report would see none of the others' runs.
        """
        if "://" not in self.storage.uri or not is_per_machine(self.tracking_uri):
            return None
        return (f"storage root {self.storage.uri} is shared by every machine, but MLflow tracking "
                f"{safe_uri(self.tracking_uri)} is a file on this one: runs on several machines need an "
                "MLflow server (set MLFLOW_TRACKING_URI, or tracking_uri in the recipe)")

    def parent_run(self, run_key: str) -> str | None:
        """The MLflow parent run for ``run_key`` (created on first use), or None if tracking is down."""
        # a URI in the recipe (tracking_uri, a source url) may carry user:password or a token: never a param
        params = {k: safe_uri(v) if isinstance(v, str) else v
                  for k, v in _flatten(self.recipe.model_dump(mode="json")).items()}
        tags = {
            "tidal.recipe": self.recipe.name,
            "tidal.recipe_version": str(self.recipe.version),
            "tidal.recipe_hash": self.recipe_hash,
            "tidal.recipe_path": str(self.recipe_path),
            OVERRIDES_TAG: json.dumps(self.overrides, sort_keys=True),
        }

        tags["tidal.git_sha"] = git_sha()
        tags |= licence_tags(self.recipe.sources, self.recipe.intended_use, self.recipe.licences)  # uses, overrides
        return self.tracker().parent_run(run_key, params=params, tags=tags)

    def final_metrics(self) -> tuple[dict[str, float], int]:
        """The DAG run's final numbers for its parent run, and the step they are logged at.

        The numbers of the committed ``train`` step's ``summary.json`` (``final_train_loss``,
        ``eval_loss``, ``eval_loss/<src>``, ``eval_bpb``, ``tokens_per_second``, ``mfu``,
        ``tokens_seen`` ...) at its last training step; for a scaling suite, the committed fit's
        numbers (``alpha``, ``beta``, ``E``, ``holdout_rel_error`` ...) at step 0; else ``({}, 0)``.
        """
        train = [s for s in self.graph if s.kind == "train"]
        fit = [s for s in self.graph if s.kind == "scaling_fit" and self.storage.is_committed(s.step_id)]
        if len(train) != 1 and fit:  # a scaling suite: the fit's numbers (alpha, beta, E, hold-out error ...)
            summary = json.loads(self.storage.read_text(fit[0].step_id, STEP_JSON)).get("summary") or {}
            return {k: v for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}, 0
        if len(train) != 1 or not self.storage.is_committed(train[0].step_id):
            return {}, 0
        summary = json.loads(self.storage.read_text(train[0].step_id, SUMMARY_JSON))
        numbers = {k: v for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        return numbers, int(summary.get("steps") or 0)

    def finish_run(self, parent_run_id: str, status: str) -> None:
        """Close the parent run ``parent_run_id`` (``FINISHED`` or ``FAILED``) with the run's
        :meth:`final_metrics`, so MLflow's runs table compares DAG runs. Never raises on a
        tracking outage (the call is buffered); a storage error reading the summary closes the
        run without metrics."""
        try:
            metrics, step = self.final_metrics()
        except (OSError, StorageError, ValueError) as err:  # the run still gets closed
            import logging

            logging.getLogger("tidal.tracking").warning("final metrics of %s not read: %s", self.recipe.name, err)
            metrics, step = {}, 0
        self.tracker().finish(parent_run_id, status, metrics=metrics, step=step)

    def run(self, name: str, run_key: str | None = None, force: bool = False) -> StepResult:
        """Run one step (or skip it if committed) and record it under ``run_key``'s parent run."""
        step = self.graph[name]
        live_run = self._open_live_run(step, run_key, force)
        try:
            with entry_point(self._live_settings(live_run)):
                result = run_step(step, self.storage, force=force)
        except Exception as err:
            if run_key is not None:
                self._track_failure(step, run_key, err, live_run)
            raise
        if run_key is not None:
            self.record(result, run_key, live_run=live_run)
        return result

    def _open_live_run(self, step, run_key: str | None, force: bool) -> str | None:
        """The nested run a training step logs into while it trains (None: record afterwards).

        Only for a ``train`` step that will compute (not committed, or forced) under a
        ``run_key``; the subprocess finds it through ``TIDAL_MLFLOW_RUN_ID``.
        """
        if run_key is None or step.kind != "train":
            return None
        if not needs_run(step, self.storage, force=force, keep_until_commit=True):
            return None
        parent = self.parent_run(run_key)
        if parent is None:
            return None
        return self.tracker().open_step_run(parent, step.name, step.step_id, step.kind)

    def step_settings(self):
        """The settings a step of this pipeline runs under outside :meth:`run` (no live MLflow run)."""
        return self._live_settings(None)

    def evaluate_checkpoints(self) -> dict[str, Any]:
        """Evaluate every permanent and the final checkpoint of the train step and log the curve
        (:func:`tidal.core.checkpoint_evals.evaluate_checkpoints`)."""
        return evaluate_checkpoints(self)

    def _live_settings(self, live_run: str | None):
        """The settings a step runs under: the recipe's ``storage.endpoint_url`` when no
        ``TIDAL_S3_ENDPOINT_URL`` is set (so inputs read in place, :mod:`tidal.files`, and a training
        subprocess reach the same endpoint as the commit), and for a live-logging training subprocess
        its MLflow run (tidal/train/metrics.py reads them; :func:`tidal.launch.local.run_entrypoint`
        hands them over explicitly)."""
        settings = current_settings()
        update: dict[str, object] = {}
        endpoint = getattr(getattr(self.recipe, "storage", None), "endpoint_url", None)
        if not settings.s3_endpoint_url and endpoint:
            update["s3_endpoint_url"] = endpoint
        if live_run is not None:
            update |= {"tracking_uri": self.tracker().uri, "mlflow_run_id": live_run}
        return settings.model_copy(update=update) if update else settings

    def _track_failure(self, step, run_key: str, err: Exception, live_run: str | None = None) -> None:
        """Record a failed step as a nested run (status ``failed``) with the kept evidence."""
        parent = self.parent_run(run_key)
        if parent is None:
            return
        attempts = self.storage.failed_attempts(step.step_id)
        with tempfile.TemporaryDirectory(prefix="tidal-evidence-") as tmp:
            evidence = (attempt_files(self.storage, attempts[-1], _ARTIFACTS.get(step.kind, ()), Path(tmp))
                        if attempts else [])
            self.tracker().log_step(
                parent, step.name, step.step_id, step.kind, "failed",
                {"error": f"{type(err).__name__}: {err}"[:4000]},
                artifacts=evidence,
                tags={"tidal.recipe_hash": self.recipe_hash, "tidal.error_type": type(err).__name__},
                run_id=live_run, lineage=self._lineage(step.name, committed=False),
            )

    def _lineage(self, name: str, summary: dict[str, Any] | None = None, committed: bool = True):
        """Step ``name``'s MLflow lineage objects (:func:`tidal.core.mlflow_lineage.step_lineage`; the
        registered model is named like the experiment), or None when the step is not in the graph."""
        try:
            step = self.graph[name]
        except KeyError:
            return None
        return step_lineage(step, self.storage, self.recipe, self.experiment, summary, committed=committed)

    def record(self, result: StepResult, run_key: str, live_run: str | None = None,
               complete_history: bool = False) -> None:
        """Record a finished or skipped step as a nested MLflow run under ``run_key``'s parent.

        ``live_run``: the nested run the training subprocess already logged its metric history
        into (:meth:`_open_live_run`); it is completed instead of creating a new one, and the
        history is not logged twice. ``complete_history``: the live run may lack rows (a GKE
        pod's undelivered rows stay in the pod): the rows of ``metrics.jsonl`` whose (metric,
        step) the run does not hold are logged (:meth:`tidal.tracking.Tracker.log_step`).
        Any step's run also gets its MLflow 3 lineage objects (:func:`tidal.core.mlflow_lineage.step_lineage`:
        input steps as datasets; a train step's checkpoints as logged models, the final one registered).
        """
        tracker = self.tracker()
        parent = self.parent_run(run_key)
        if parent is None:
            return

        tags = {"tidal.recipe_hash": self.recipe_hash, "tidal.git_sha": git_sha()}
        for key in ("tokenizer_hash", "archive_sha256", "checkpoint_root_hash", "params_sha256",
                    "continue_from", "continue_from_root_hash"):  # a continued run's parent step and checkpoint
            if isinstance(result.summary.get(key), str):
                tags[f"tidal.{key}"] = result.summary[key]
        step_json = result.out_dir / STEP_JSON
        if step_json.is_file():
            record = json.loads(step_json.read_text())
            tags["tidal.manifest_root_hash"] = record["manifest_root_hash"]
            # what the GKE launch sized the step as before booking it (tidal/train/preflight.py)
            sizing = record.get("provenance", {}).get("sizing") or {}
            tags |= {f"tidal.sizing.{key}": json.dumps(value) if isinstance(value, dict) else str(value)
                     for key, value in sizing.items()}
        artifacts = [result.out_dir / name for name in _ARTIFACTS.get(result.kind, ())]
        lineage = self._lineage(result.name, result.summary)
        history = _read_history(result.out_dir / "metrics.jsonl") if result.kind == "train" else None
        with tempfile.TemporaryDirectory(prefix="tidal-artifacts-") as tmp:
            if result.kind == "train" and result.status == "run":
                artifacts += self._train_context_files(Path(tmp))
            tracker.log_step(
                parent, result.name, result.step_id, result.kind, result.status, result.summary,
                history=history if result.status == "run" and (live_run is None or complete_history) else None,
                artifacts=[p for p in artifacts if p.exists()] if result.status == "run" else [],
                tags=tags, run_id=live_run, lineage=lineage,
            )
        try:
            step = self.graph[result.name]
            curve = branch_curve(self.graph, step, result.summary) if result.status == "run" else None
        except KeyError:  # a step of another graph (a suite's, a checkpoint eval)
            curve = None
        if curve is not None:  # a decay branch: its evals beside its trunk's curve (tidal/core/branch_curve.py)
            tracker.log_eval_curve(curve[0], curve[1], {"tidal.recipe": self.recipe.name})

    def _train_context_files(self, dest: Path) -> list[Path]:
        """What a train run's MLflow artifacts carry beside the step's own files: ``recipe.yaml``
        (the resolved recipe, every URI without user:password) and the ``tokenizer.json`` it
        trained with (from the committed tokenizer step), written into ``dest``."""
        import yaml

        from tidal.data.tokenizer import TOKENIZER_FILE

        def clean(value: Any) -> Any:
            if isinstance(value, dict):
                return {k: clean(v) for k, v in value.items()}
            if isinstance(value, list):
                return [clean(v) for v in value]
            return safe_uri(value) if isinstance(value, str) else value

        recipe = dest / "recipe.yaml"
        recipe.write_text(yaml.safe_dump(clean(self.recipe.model_dump(mode="json")), sort_keys=True))
        found = [recipe]
        for step in self.graph:
            if step.kind == "tokenizer" and self.storage.is_committed(step.step_id):
                try:
                    data = self.storage.read_text(step.step_id, TOKENIZER_FILE)
                except (FileNotFoundError, StorageError):
                    continue
                (dest / TOKENIZER_FILE).write_text(data)
                found.append(dest / TOKENIZER_FILE)
                break
        return found


_ARTIFACTS = {
    "clean": ("counts.json", STEP_JSON),
    "decontaminate": ("counts.json", STEP_JSON),
    "tokenizer": ("tokenizer_meta.json", STEP_JSON),
    "tokenize": ("meta.json",),
    "mix": ("mixture.json",),
    "stats": ("stats.json", "stats.png", STEP_JSON),
    "gate": ("gate_result.json", "gate_summary.html", "data_docs"),
    "train": (SUMMARY_JSON, CHECKPOINT_MANIFEST, STEP_JSON, MANIFEST_JSON, "metrics.jsonl", "loss_curve.png",
              "divergence.jsonl", "profile_trace"),
    "eval": ("results.json", STEP_JSON),
    "scaling_fit": ("fits.json", "runs.parquet", "params.parquet", "forecasts.parquet", "plots"),
}


def attempt_files(storage: Storage, attempt: str, names: tuple[str, ...], dest: Path) -> list[Path]:
    """The files (or directories) ``names`` of the kept failed attempt ``attempt`` as local paths.

    A local root's attempt is used in place; an object store's is downloaded into ``dest``
    (one listing, one GET per file). Names the attempt lacks are left out.
    """
    found = []
    for name in names:
        where = storage.object_uri(attempt + name)
        if "://" not in where:  # a local root: the kept attempt is a directory here
            if Path(where).exists():
                found.append(Path(where))
            continue
        rel_name = attempt + name
        rels = [r for r in storage.list_rel(rel_name) if r == rel_name or r.startswith(rel_name + "/")]
        for rel in rels:
            data = storage.read_object(rel)
            if data is not None:
                target = dest / rel[len(attempt):]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
        if rels and (dest / name).exists():
            found.append(dest / name)
    return found


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
