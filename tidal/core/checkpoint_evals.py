"""Evaluation of every permanent checkpoint of a recipe's train step, and the curve it draws.

The recipe's ``eval`` step (:func:`tidal.core.planner.eval_step`) evaluates the train step's final
checkpoint. A train step with ``checkpoint_permanent_every`` also keeps checkpoints forever; each one
gets an eval step of its own: the recipe's eval step with ``checkpoint_step`` set (so its id names the
checkpoint), named ``eval-ckpt-<n>``, with the same inputs. They are found from the bucket (the train
step's ``checkpoint_manifests/``, through :func:`tidal.core.mlflow_lineage.checkpoint_models`, the
same list MLflow's logged models come from), never from a local disk, so any node can run them.

:func:`curve_points` reads their committed ``results.json`` back into one row per checkpoint step
(``{"step": n, "<task>/<metric>": value}``), which tidal/tracking logs into one MLflow run per train
step (:meth:`tidal.tracking.tracker.Tracker.log_eval_curve`): task accuracy over training steps.
"""

from __future__ import annotations

import json
from typing import Any

from tidal.core.mlflow_lineage import checkpoint_models
from tidal.core.runner import run_step
from tidal.eval.step import RESULTS_JSON
from tidal.settings import entry_point
from tidal.steps import Step, StepGraph
from tidal.storage import Storage
from tidal.storage.layout import SUMMARY_JSON

__all__ = ["checkpoint_eval_steps", "curve_points", "eval_step_of"]


def eval_step_of(graph: StepGraph) -> Step | None:
    """The graph's downstream ``eval`` step (the recipe's ``evaluation.downstream``), or None."""
    found = [step for step in graph if step.kind == "eval" and "checkpoint_step" not in step.config]
    return found[0] if found else None


def checkpoint_eval_steps(graph: StepGraph, storage: Storage) -> list[Step]:
    """One eval step per permanent checkpoint of the committed train step the graph's eval step reads,
    and the graph's eval step itself for the final checkpoint; ascending by checkpoint step.

    Returns:
        ``[]`` when the graph has no eval step or its train step is not committed yet.

    Raises:
        OSError, botocore.exceptions.ClientError: the train step's ``summary.json`` cannot be read.
        ValueError: its ``summary.json`` is not JSON.
    """
    final_eval = eval_step_of(graph)
    if final_eval is None:
        return []
    train = next(step for step in final_eval.inputs if step.name == final_eval.config["train"])
    if not storage.is_committed(train.step_id):
        return []
    summary = json.loads(storage.read_text(train.step_id, SUMMARY_JSON))
    steps = []
    for model in checkpoint_models(train, storage, summary):
        if model.final:
            steps.append(final_eval)
        else:
            steps.append(Step(f"{final_eval.name}-ckpt-{model.checkpoint_step}", "eval",
                              {**final_eval.config, "checkpoint_step": model.checkpoint_step},
                              inputs=final_eval.inputs))
    return steps


def curve_points(steps: list[Step], storage: Storage) -> list[dict[str, Any]]:
    """The committed ``results.json`` of ``steps`` as curve rows, ascending by checkpoint step.

    Returns:
        ``[{"step": checkpoint step, "<task>/<metric>": value, ...}]``; a step not committed is left
        out, a metric lm-eval gave no finite value (None in ``results.json``) too.

    Raises:
        OSError, botocore.exceptions.ClientError, ValueError: a committed ``results.json`` unreadable.
    """
    rows = []
    for step in steps:
        if not storage.is_committed(step.step_id):
            continue
        results = json.loads(storage.read_text(step.step_id, RESULTS_JSON))
        row: dict[str, Any] = {"step": int(results["checkpoint_step"])}
        for task, entry in sorted(results["tasks"].items()):
            row |= {f"{task}/{metric}": value for metric, value in sorted(entry["metrics"].items())
                    if value is not None}
        rows.append(row)
    return sorted(rows, key=lambda r: r["step"])


def evaluate_checkpoints(pipe: Any, log: Any = None) -> dict[str, Any]:
    """Run (or skip, when committed) the eval step of every permanent and the final checkpoint of
    ``pipe``'s train step (a :class:`tidal.core.pipeline.Pipeline`), then log the curve to MLflow.

    Each eval step goes through the one commit path (:func:`tidal.core.runner.run_step`) under the
    pipeline's step settings, so a rerun computes only checkpoints kept since the last one.

    Returns:
        ``{"train": train step id or None, "evaluated": [step ids computed now], "skipped": [committed
        already], "points": [checkpoint steps on the curve], "curve_run": MLflow run id or None}``.

    Raises:
        whatever an eval step raises (a checkpoint failing verification: ConfigError naming it).
    """
    import logging

    log = log or logging.getLogger("tidal.eval")
    steps = checkpoint_eval_steps(pipe.graph, pipe.storage)
    out: dict[str, Any] = {"train": None, "evaluated": [], "skipped": [], "points": [], "curve_run": None}
    if not steps:
        log.info("no checkpoint to evaluate (no eval step in the recipe, or its train step is not committed)")
        return out
    final_eval = eval_step_of(pipe.graph)
    train_id = next(s.step_id for s in final_eval.inputs if s.name == final_eval.config["train"])
    out["train"] = train_id
    for number, step in enumerate(steps, 1):
        with entry_point(pipe.step_settings()):
            result = run_step(step, pipe.storage)
        out["skipped" if result.status == "skip" else "evaluated"].append(step.step_id)
        log.info("checkpoint eval %d/%d %s: %s (%.1f s)", number, len(steps), step.step_id, result.status,
                 result.seconds)
    rows = curve_points(steps, pipe.storage)
    out["points"] = [row["step"] for row in rows]
    out["curve_run"] = pipe.tracker().log_eval_curve(train_id, rows, {"tidal.recipe": pipe.recipe.name})
    return out
