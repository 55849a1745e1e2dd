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

__all__ = ["RUNS_DIR", "committed_steps", "recipe_plans", "write_run_plan"]

RUNS_DIR = "runs"
_KEY = re.compile(r"[^A-Za-z0-9._-]")
#: files of a committed step whose fields a catalog entry copies: file -> {field: entry key}
_RECORDS = (("step.json", {"manifest_root_hash": "manifest_root_hash"}),
            ("checkpoint_manifest.json", {"step": "checkpoint_step", "root_hash": "checkpoint_root_hash"}))


def _plan_rel(recipe_name: str, run_key: str) -> str:
    return f"{RUNS_DIR}/{recipe_name}/{_KEY.sub('_', run_key)}.json"


def write_run_plan(storage: Any, recipe_name: str, run_key: str, step_ids: dict[str, str]) -> str:
    """Record that run ``run_key`` of ``recipe_name`` planned ``step_ids`` (step name -> step id).

    One small object per run, written atomically (a rerun of the same run key writes the same
    ids: the run's params fix them). Characters outside ``[A-Za-z0-9._-]`` in the run key become
    ``_``. Returns the object's URI.
    """
    doc = {"recipe": recipe_name, "run_key": run_key, "steps": dict(sorted(step_ids.items()))}
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
    from tidal.audit.verify import verify_step

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
