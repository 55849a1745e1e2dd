"""Which committed steps belong to a recipe, found from storage (the bucket), not from Airflow.

Steps are content-addressed and shared: a committed ``train-<hash>`` step belongs to every recipe
(and every run's overrides) that plans that id. So each DAG run's planning task writes the step
ids it planned to ``runs/<recipe>/<run key>.json`` in the storage root (:func:`write_run_plan`);
a consumer (the recipe's checkpoint DAG, scheduled on its train asset alias) reads every plan of
the recipe, keeps the planned ids that are committed and verifies each
(:func:`tidal.audit.verify.verify_step`). Asset events of tasks that finish together may be merged
or lost; these records are not.
"""

from __future__ import annotations

import json
import re
from typing import Any

from tidal.audit.verify import verify_step
from tidal.core.load import load_pipeline
from tidal.core.pipeline import OVERRIDES_TAG
from tidal.tracking import TrackingUnavailable, parent_run, store_exists

__all__ = ["RUNS_DIR", "committed_steps", "recipe_plans", "run_plan", "run_progress", "write_run_plan"]

RUNS_DIR = "runs"
_KEY = re.compile(r"[^A-Za-z0-9._-]")
#: files of a committed step whose fields a catalog entry copies: file -> {field: entry key}
_RECORDS = (("step.json", {"manifest_root_hash": "manifest_root_hash"}),
            ("checkpoint_manifest.json", {"step": "checkpoint_step", "root_hash": "checkpoint_root_hash"}))


def _plan_rel(recipe_name: str, run_key: str) -> str:
    return f"{RUNS_DIR}/{recipe_name}/{_KEY.sub('_', run_key)}.json"


def write_run_plan(storage: Any, recipe_name: str, run_key: str, step_ids: dict[str, str],
                   overrides: dict[str, Any] | None = None) -> str:
    """Record that run ``run_key`` of ``recipe_name`` planned ``step_ids`` (step name -> step id)
    with the dotted recipe ``overrides`` of its trigger form (``{}``: the recipe as written).

    One small object per run, written atomically (a rerun of the same run key writes the same
    ids: the run's params fix them). Characters outside ``[A-Za-z0-9._-]`` in the run key become
    ``_``. Returns the object's URI.
    """
    doc = {"recipe": recipe_name, "run_key": run_key, "steps": dict(sorted(step_ids.items())),
           "overrides": dict(sorted((overrides or {}).items()))}
    return storage.write_object(_plan_rel(recipe_name, run_key), (json.dumps(doc, sort_keys=True) + "\n").encode())


def recipe_plans(storage: Any, recipe_name: str) -> list[dict[str, Any]]:
    """Every run plan of ``recipe_name`` in ``storage`` (sorted by object name); unreadable ones skipped."""
    plans = []
    for rel in storage.list_rel(f"{RUNS_DIR}/{recipe_name}/"):
        raw = storage.read_object(rel) if rel.endswith(".json") else None
        try:
            doc = json.loads(raw) if raw is not None else None
        except ValueError:
            doc = None
        if isinstance(doc, dict) and isinstance(doc.get("steps"), dict):
            plans.append(doc)
    return plans


def run_plan(storage: Any, recipe_name: str, run_key: str) -> dict[str, Any] | None:
    """The plan :func:`write_run_plan` recorded for ``run_key`` of ``recipe_name``, or None
    (no such run, or a plan that does not parse). Plans written before overrides were recorded
    have no ``overrides`` key."""
    raw = storage.read_object(_plan_rel(recipe_name, run_key))
    try:
        doc = json.loads(raw) if raw is not None else None
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("steps"), dict) else None


def run_progress(storage: Any, recipe_name: str, run_key: str) -> dict[str, Any] | None:
    """How far run ``run_key`` got, from its own plan: ``planned`` and ``committed`` (step counts),
    ``missing`` (names not committed, in plan order) and ``overrides``; None without a plan."""
    plan = run_plan(storage, recipe_name, run_key)
    if plan is None:
        return None
    missing = [name for name, step_id in plan["steps"].items() if not storage.is_committed(step_id)]
    return {"planned": len(plan["steps"]), "committed": len(plan["steps"]) - len(missing), "missing": missing,
            "overrides": plan.get("overrides") or {}}


def committed_steps(storage: Any, recipe_name: str, step_name: str = "train", *, key: Any = None,
                    verify: bool = True) -> list[dict[str, Any]]:
    """The committed steps named ``step_name`` that some run of ``recipe_name`` planned, verified.

    Args:
        storage: the run's :class:`tidal.storage.Storage`.
        key: the signing key, if configured (a foreign signature is then a mismatch).
        verify: re-hash every file against the step's manifest (:func:`tidal.audit.verify.verify_step`).

    Returns:
        One dict per committed step id, sorted by id: ``step_id``, ``uri``, ``run_keys`` (the runs that
        planned it), ``manifest_root_hash``; for a train step also ``checkpoint_step`` and
        ``checkpoint_root_hash`` (its ``checkpoint_manifest.json``); with ``verify``, ``verified``
        (bool) and ``mismatches`` (the first 5, as text).
    """
    runs: dict[str, list[str]] = {}
    for plan in recipe_plans(storage, recipe_name):
        step_id = plan["steps"].get(step_name)
        if isinstance(step_id, str):
            runs.setdefault(step_id, []).append(str(plan.get("run_key")))
    found = []
    for step_id in sorted(runs):
        if not storage.is_committed(step_id):
            continue
        entry: dict[str, Any] = {"step_id": step_id, "uri": storage.step_uri(step_id),
                                 "run_keys": sorted(runs[step_id])}
        for name, fields in _RECORDS:
            try:
                doc = json.loads(storage.read_text(step_id, name))
            except (OSError, ValueError):
                continue
            entry.update({out: doc.get(field) for field, out in fields.items()})
        if verify:
            result = verify_step(storage.step_uri(step_id), step_id, key=key)
            entry["verified"] = result.ok
            entry["mismatches"] = [str(m) for m in result.mismatches[:5]]
        found.append(entry)
    return found


def pipeline_of_run(recipe_path: Any, run_key: str | None, storage_root: str | None = None) -> Any:
    """The pipeline run ``run_key`` of ``recipe_path`` ran: the recipe with that run's own overrides.

    A DAG run whose trigger form overrode ``train_steps`` (or the seed, or resources) planned other
    step ids than the recipe as written; ``tidal report --run-key``, ``verify``, ``lineage`` and the
    on-call page must show those. The overrides are read from the run's plan in the storage root
    (:func:`write_run_plan`), else from its MLflow parent run (tag ``tidal.overrides``); a run
    found in neither, or ``run_key`` None, gives the recipe as written.

    Raises:
        tidal.recipe.RecipeError: the recipe, or the overrides the run recorded, no longer load.
    """
    pipe = load_pipeline(recipe_path, storage_root=storage_root)
    if run_key is None or getattr(pipe, "suite", None) is not None:
        return pipe
    overrides = recorded_overrides(pipe, run_key)
    return load_pipeline(recipe_path, overrides, storage_root) if overrides else pipe


def recorded_overrides(pipe: Any, run_key: str) -> dict[str, Any]:
    """The overrides run ``run_key`` of ``pipe``'s recipe recorded (plan first, then MLflow); ``{}``
    when neither has them (tracking errors included: the plan in the bucket is the durable record)."""
    plan = run_plan(pipe.storage, pipe.recipe.name, run_key)
    if plan is not None and isinstance(plan.get("overrides"), dict):
        return dict(plan["overrides"])

    if not store_exists(pipe.tracking_uri):  # never create an empty SQLite store just to look
        return {}
    try:
        run = parent_run(pipe.tracking_uri, pipe.experiment, run_key)
    except (TrackingUnavailable, ValueError):
        return {}
    return tag_overrides(run.tags) if run is not None else {}


def tag_overrides(tags: dict[str, str]) -> dict[str, Any]:
    """The overrides a parent run's tags record (``tidal.overrides``, JSON); ``{}`` if none or unreadable."""
    try:
        found = json.loads(tags.get(OVERRIDES_TAG) or "{}")
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}
