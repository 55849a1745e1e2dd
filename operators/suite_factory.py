"""Build the Airflow DAG of a scaling suite: data steps, one mapped task over the grid, the fit.

Kept light for the dag-processor: reading the suite, its base recipe and planning the grid
imports pydantic and YAML only. The training runs are one dynamically mapped task
(``TidalStepOperator.partial(...).expand(step_name=[...])``), one map index per grid point;
each is a content-addressed step, so a rerun or a grown grid trains only what is missing.
"""

from __future__ import annotations

from pathlib import Path

from airflow.sdk import DAG

from operators.dag_args import pipeline_dag_args
from operators.step import TidalReportOperator, TidalStepOperator
from tidal.core.planner import build_suite_graph, train_step_names
from tidal.scaling.suite import FIT_STEP, load_suite


def build_suite_dag(suite_path: Path) -> DAG:
    """The DAG ``tidal_{suite.name}`` for a suite file (top-level ``kind: scaling_suite``).

    Tasks: one per data step of the base recipe (same dependencies), ``train`` mapped over the
    grid's train steps (after every data step it reads), ``fit`` after all of them, and ``report``
    whatever happened (it closes the MLflow parent run, FAILED when a step is missing).

    Raises:
        tidal.scaling.suite.SuiteError: the suite or its base recipe is invalid.
    """
    suite, base = load_suite(suite_path)
    graph = build_suite_graph(suite, base)
    grid = train_step_names(graph)
    with DAG(
        auto_register=False,
        **pipeline_dag_args(graph),
        dag_id=f"tidal_{suite.name}",
        description=suite.description or f"tidal scaling suite {suite.name}",
        tags=["tidal", "scaling", f"recipe:{base.name}"],
        doc_md=f"Scaling suite `{suite.name}` v{suite.version} on recipe `{base.name}`: "
               f"{len(grid)} training runs over {len(suite.budgets)} compute budgets, then the fit. "
               "Steps are content-addressed: committed runs are skipped.",
    ) as dag:
        tasks = {}
        for step in graph:
            if step.kind in ("train", "scaling_fit"):
                continue
            tasks[step.name] = TidalStepOperator(task_id=step.name, recipe_path=str(suite_path), step_name=step.name,
                                                 doc_md=f"step `{step.step_id}` ({step.kind})")
        for step in graph:
            if step.name in tasks:
                for dep in step.inputs:
                    tasks[dep.name] >> tasks[step.name]
        train = TidalStepOperator.partial(task_id="train", recipe_path=str(suite_path),
                                          doc_md="one grid point per map index").expand(step_name=grid)
        train_inputs = {dep.name for name in grid for dep in graph[name].inputs}
        for name in sorted(train_inputs):
            tasks[name] >> train
        fit = TidalStepOperator(task_id=FIT_STEP, recipe_path=str(suite_path), step_name=FIT_STEP,
                                doc_md=f"step `{graph[FIT_STEP].step_id}` (scaling_fit)")
        train >> fit
        report = TidalReportOperator(task_id="report", recipe_path=str(suite_path))
        [*tasks.values(), train, fit] >> report
    return dag
