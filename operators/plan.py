"""The DAG's root task: decide which steps must compute, so that committed ones cost no worker.

``plan`` is a branch (``BaseBranchOperator``) upstream of every step's entry task. It opens the
run's pipeline once, asks storage which steps are committed, writes their skip records (MLflow
nested runs with ``tidal.status=skip``, StatsD counters) itself, and follows only the steps that
must compute: not committed, or named in ``force_steps``. The scheduler marks every other entry
task skipped without a worker process (or a pod); the tasks inside a skipped step's group follow by
their trigger rules. Step entry tasks run under ``none_failed``, so a step whose inputs were skipped
(committed) still runs, and one whose input failed does not.

A task cleared later (the UI, a backfill of failed steps) runs again as before: ``plan`` is not
cleared with it, and the step task itself skips what is committed and computes what is not.
With ``dry_run`` every step is followed (each logs what it would do). Otherwise the run's step ids
are written to the bucket (``runs/<recipe>/<run key>.json``, tidal/audit/catalog.py): consumers such
as the checkpoint DAG find the recipe's committed steps from them.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk.bases.branch import BaseBranchOperator

from operators.params import run_options
from operators.run_context import export_signing_key, pipeline_for_run, run_key_of
from operators.step import emit_step_metrics
from operators.task_log import capture_log_tail

PLAN_TASK_ID = "plan"


class TidalPlanOperator(BaseBranchOperator):
    """Follow the entry tasks of the steps that must compute; record the others as skipped.

    Args:
        recipe_path: the recipe YAML the DAG was built from.
        entry_tasks: step name -> the task ids that start it (the step's task, or the roots of its
            task group).

    Returns (XCom): ``{"compute": [step names], "skipped": [step names]}``.
    """

    template_fields = ("recipe_path",)
    ui_color = "#fff2cc"

    def __init__(self, *, recipe_path: str, entry_tasks: dict[str, list[str]], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.recipe_path = recipe_path
        self.entry_tasks = entry_tasks

    def choose_branch(self, context: Any) -> list[str]:
        capture_log_tail()
        force_steps, dry_run = run_options(context.get("params") or {})
        pipe = pipeline_for_run(self.recipe_path, context)
        if dry_run:
            compute = [step.name for step in pipe.graph]
        else:
            compute = [step.name for step in pipe.graph  # one commit check per step, not its inputs' too
                       if step.name in force_steps or not pipe.storage.is_committed(step.step_id)]
        skipped = [step.name for step in pipe.graph if step.name not in compute]
        if skipped:
            export_signing_key()
        run_key = run_key_of(context)
        if not dry_run:  # the run's step ids, in the bucket: what consumers find a recipe's steps by
            _write_plan(pipe, run_key, self.log)
        for name in skipped:  # committed: its skip record, as the step's own task would write it
            result = pipe.run(name, run_key=run_key)
            emit_step_metrics(pipe, result, self.log)
        self.log.info("plan: %d of %d steps compute (%s); %d committed, skipped without a worker",
                      len(compute), len(compute) + len(skipped), ", ".join(compute) or "none", len(skipped))
        context["ti"].xcom_push(key="plan", value={"compute": compute, "skipped": skipped})
        return [task_id for name in compute for task_id in self.entry_tasks[name]]


def _write_plan(pipe: Any, run_key: str, log: Any) -> None:
    """``runs/<recipe>/<run key>.json`` (tidal/audit/catalog.py); a failure is a WARNING, not a failed plan."""
    from tidal.audit.catalog import write_run_plan

    try:
        uri = write_run_plan(pipe.storage, pipe.recipe.name, run_key, {s.name: s.step_id for s in pipe.graph},
                             pipe.overrides)
        log.info("run plan %s", uri)
    except Exception as err:  # noqa: BLE001 - the plan record serves consumers; the run goes on without it
        log.warning("run plan not written: %s", err)


__all__ = ["PLAN_TASK_ID", "TidalPlanOperator"]
