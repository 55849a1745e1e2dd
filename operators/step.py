"""Airflow operators for tidal steps: thin shells that delegate to :mod:`tidal.core.pipeline`.

Nothing heavy is imported at module level, so DAG files that use these parse fast; the
step's own libraries (Beam, JAX, GX) load inside ``execute`` on the worker.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperator

from operators.openlineage_facets import StepLineageMixin
from operators.params import overrides_from_params, run_options
from operators.run_context import SIGNING_CONN_ID, export_signing_key, pipeline_for_run, run_key_of
from operators.task_log import capture_log_tail
from tidal.recipe import load_recipe
from tidal.settings import current
from tidal.steps import CommittedStep
from tidal.train import CHECKPOINT_MANIFEST  # light: no JAX (see tidal/train/__init__.py)

__all__ = ["SIGNING_CONN_ID", "BrokenRecipeOperator", "InjectedFault", "TidalReportOperator", "TidalStepOperator",
           "check_fault", "emit_step_metrics", "export_signing_key", "pipeline_for_run", "run_key_of"]


class InjectedFault(RuntimeError):
    """A fault drill: ``$TIDAL_FAULT_DIR/<step name>`` exists, so the step fails on purpose."""


def check_fault(step_name: str) -> None:
    """Fail ``step_name`` if a fault file for it exists in ``$TIDAL_FAULT_DIR`` (drills and tests).

    Lets an operator rehearse the on-call path (catalog, alert, clear and rerun) without
    changing the recipe, so step ids stay the same. Unset variable: no effect.

    Raises:
        InjectedFault: with the file's text.
    """
    from pathlib import Path

    fault_dir = current().fault_dir
    if fault_dir and (Path(fault_dir) / step_name).is_file():
        text = (Path(fault_dir) / step_name).read_text().strip()
        raise InjectedFault(f"injected fault for step {step_name!r}: {text or '(no text)'}")


def emit_step_metrics(pipe: Any, result: Any, log: Any) -> None:
    """StatsD: steps run/skipped, step duration, training throughput (tidal/tracking/statsd.py).
    Never raises: a metrics failure is a WARNING on ``log``, not a failed step."""
    try:
        _emit_step_metrics(pipe, result)
    except Exception as err:  # noqa: BLE001 - metrics never fail a step
        log.warning("metrics not sent: %s", err)


def _emit_step_metrics(pipe: Any, result: Any) -> None:
    from tidal.tracking import statsd as m

    client = m.StatsdClient.from_env()
    if not client.enabled:
        return
    tags = {"recipe": pipe.recipe.name, "step": result.name, "kind": result.kind}
    client.incr(m.STEP_RUN if result.status == "run" else m.STEP_SKIPPED, tags=tags)
    client.timing(m.STEP_DURATION, result.seconds, tags=tags)
    tps = result.summary.get("tokens_per_second") if result.status == "run" else None
    if isinstance(tps, int | float):
        client.gauge(m.TOKENS_PER_SECOND, float(tps), tags={"recipe": pipe.recipe.name})
    goodput = result.summary.get("goodput") if result.status == "run" else None
    if isinstance(goodput, int | float):
        client.gauge(m.GOODPUT, float(goodput), tags={"recipe": pipe.recipe.name})
    client.close()


class TidalStepOperator(StepLineageMixin, BaseOperator):
    """Run one content-addressed step of a recipe; a committed step is skipped in milliseconds.

    Args:
        recipe_path: the recipe YAML the DAG was built from.
        step_name: the step's name in the recipe's graph (also the task id).

    Trigger-time params read (operators/params.py): the recipe overrides (``seed``,
    ``train_steps``, ``launcher``, ``resource_profile``), ``force_steps`` (step names to
    recompute) and ``dry_run`` (log run/skip/blocked, compute nothing). Step ids come from the
    run's params, at run time. A fault file ``$TIDAL_FAULT_DIR/<step name>`` fails the step
    (drills; :func:`check_fault`).

    Returns (XCom): ``{"step_id", "status" ("run"|"skip"|"dry-run:<run|skip|blocked>"), "seconds"}``.
    OpenLineage (when a transport is configured): inputs and output as step URIs and the
    ``tidal_step`` run facet (operators/openlineage_facets.py).
    """

    template_fields = ("recipe_path",)
    ui_color = "#cfe8ff"

    def __init__(self, *, recipe_path: str, step_name: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.recipe_path = recipe_path
        self.step_name = step_name

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowFailException

        capture_log_tail()
        force_steps, dry_run = run_options(context.get("params") or {})
        pipe = pipeline_for_run(self.recipe_path, context)
        step = pipe.graph[self.step_name]
        if dry_run:
            status = pipe.status(self.step_name)
            self.log.info("dry run: %s would %s (%s)", step.step_id, "recompute" if self.step_name in force_steps
                          else status, step.kind)
            return {"step_id": step.step_id, "status": f"dry-run:{status}", "seconds": 0.0}
        launcher = pipe.recipe.train.resources.launcher

        if step.kind == "train" and launcher != "local" and not isinstance(step, CommittedStep):
            raise AirflowFailException(
                f"this run asks for launcher {launcher!r}, but the DAG's train task was built for the recipe's "
                "local launcher; set train.resources.launcher in the recipe to get the GKE task group")
        check_fault(self.step_name)
        export_signing_key()
        result = pipe.run(self.step_name, run_key=run_key_of(context), force=self.step_name in force_steps)
        self.log.info("%s %s in %.3f s -> %s", result.status, result.step_id, result.seconds, result.out_dir)
        emit_step_metrics(pipe, result, self.log)
        self.announce_step(context, pipe, result, run_key_of(context))
        return {"step_id": result.step_id, "status": result.status, "seconds": round(result.seconds, 3)}


class TidalReportOperator(BaseOperator):
    """Close the DAG run's MLflow parent run and log a summary; runs whatever happened.

    The parent run ends FINISHED with the run's final metrics
    (:meth:`tidal.core.pipeline.Pipeline.finish_run`), or FAILED when this task fails.

    It fails (so the DAG run is marked failed) when any step of the recipe is not
    committed at the end, naming those steps, or when the recipe has a ``baseline`` and the
    run (without overrides) differs from it beyond tolerance (tidal/quality/baseline.py): the error
    lists each metric with expected, got and tolerance. It also sends the checkpoint-age
    StatsD gauges.

    Returns (XCom): ``steps_run``, ``steps_skipped``, ``tokens_seen`` and ``baseline``: None (the
    recipe has none), ``"within tolerance"`` or ``"not compared: overrides"``.
    """

    template_fields = ("recipe_path",)
    ui_color = "#e8e8e8"

    def __init__(self, *, recipe_path: str, **kwargs: Any) -> None:
        kwargs.setdefault("trigger_rule", "all_done")
        super().__init__(**kwargs)
        self.recipe_path = recipe_path

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowFailException

        from tidal.core.report import build_report, format_report

        capture_log_tail()
        _, dry_run = run_options(context.get("params") or {})
        pipe = pipeline_for_run(self.recipe_path, context)
        if dry_run:
            for step in pipe.graph:
                self.log.info("dry run: %-24s %-8s %s", step.name, pipe.status(step.name), step.step_id)
            return {"dry_run": True, "missing": [s.name for s in pipe.graph if pipe.status(s.name) != "skip"]}
        report = build_report(pipe, run_key_of(context))
        for line in format_report(report).splitlines():
            self.log.info("%s", line)
        _emit_checkpoint_metrics(pipe)
        status = "FAILED"  # what the MLflow parent run ends as unless every check below passes
        try:
            if report["missing"]:
                err = AirflowFailException(f"steps not committed: {report['missing']}")
                # derived: each missing step's own task failed (and was recorded) or never ran because one did
                err.tidal_derived = True  # type: ignore[attr-defined]
                raise err
            baseline = None
            if getattr(pipe, "suite", None) is None and getattr(pipe.recipe, "baseline", None) is not None:
                overrides = overrides_from_params(load_recipe(self.recipe_path), dict(context.get("params") or {}))
                if overrides:
                    self.log.info("baseline not compared: this run overrides %s", sorted(overrides))
                    baseline = "not compared: overrides"
                else:
                    _compare_baseline(pipe, self.log)
                    baseline = "within tolerance"
            status = "FINISHED"
        finally:  # closed with the run's final metrics, FAILED when the DAG run fails here
            if report.get("mlflow_run_id"):
                pipe.finish_run(report["mlflow_run_id"], status)
        summary = {k: v for k, v in report.items() if k in ("steps_run", "steps_skipped", "tokens_seen")}
        return {**summary, "baseline": baseline}


def _compare_baseline(pipe: Any, log: Any) -> None:
    """Fail the task with a readable difference when the run differs from the recipe's baseline."""
    from airflow.sdk.exceptions import AirflowFailException

    from tidal.quality.baseline import (
        BaselineError,
        BaselineMismatch,
        baseline_path,
        check_pipeline,
    )
    from tidal.tracking import statsd as m

    client = m.StatsdClient.from_env()
    try:
        check_pipeline(pipe)
    except BaselineMismatch as err:
        client.gauge(m.BASELINE_DIFFERENCES, len(err.differences), tags={"recipe": pipe.recipe.name})
        raise AirflowFailException(str(err)) from None
    except BaselineError as err:
        raise AirflowFailException(str(err)) from None
    client.gauge(m.BASELINE_DIFFERENCES, 0, tags={"recipe": pipe.recipe.name})
    log.info("baseline %s: every metric within tolerance", baseline_path(pipe))


def _emit_checkpoint_metrics(pipe: Any) -> None:
    """StatsD gauges: unix time and age (s) of the latest committed checkpoint of the train step."""
    import time

    from tidal.tracking import statsd as m

    client = m.StatsdClient.from_env()
    if not client.enabled or "train" not in pipe.graph.by_name:
        return
    manifest = pipe.storage.step_dir(pipe.graph["train"].step_id) / CHECKPOINT_MANIFEST
    if manifest.is_file():
        written = manifest.stat().st_mtime
        client.gauge(m.CHECKPOINT_TIME, written, tags={"recipe": pipe.recipe.name})
        client.gauge(m.CHECKPOINT_AGE, time.time() - written, tags={"recipe": pipe.recipe.name})
    client.close()


class BrokenRecipeOperator(BaseOperator):
    """The only task of a broken recipe's DAG: fails with the validation error."""

    ui_color = "#ffb3b3"

    def __init__(self, *, error: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.error = error

    def execute(self, context: Any) -> None:
        from airflow.sdk.exceptions import AirflowFailException

        raise AirflowFailException(self.error)
