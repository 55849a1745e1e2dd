"""Beam data steps through the Beam provider: prepare -> launch -> commit (``beam.launcher: provider``).

With ``beam.launcher: provider`` the DAG factory puts a task group named like the step in
place of the single ``TidalStepOperator`` of each Beam step (clean, tokenize):

* ``{step}.prepare`` (branch, milliseconds): :func:`tidal.core.beam_job.prepare`; a
  committed step goes straight to ``commit`` and no job starts; otherwise a scratch dir
  and the job's ``config.json`` are written and the launch runs.
* ``{step}.launch``: the Beam provider's ``BeamRunPythonPipelineOperator`` running
  ``python -m tidal.data.<kind> --runner=R --config=... --input=NAME=DIR ... --out=SCRATCH
  [--seed=N] --name=STEP`` plus ``beam.pipeline_options`` (:func:`beam_operator_kwargs`).
* ``{step}.commit``: :func:`tidal.core.beam_job.commit`: expected outputs, manifest,
  step.json, _SUCCESS, atomic rename into place, MLflow.

The launch task is an :class:`operators.remote.ProviderOperator` shell (the real operator is
built on the worker, from :mod:`operators.beam_provider`): with the Google provider installed
(needed for Dataflow) importing the Beam provider imports the Google Cloud hooks, and
without it the 6.3.1 operator cannot be constructed at all on Airflow 3.3.
"""

from __future__ import annotations

import re
import sys
from typing import Any

from airflow.sdk import TaskGroup

from operators.assets import step_alias
from operators.remote import ProviderOperator, TidalCommitOperator, TidalPrepareOperator
from operators.step import export_signing_key, pipeline_for_run, run_key_of

BEAM_OPERATOR = "operators.beam_provider:BeamRunPythonPipelineOperator"
# Runners whose launcher returns before the job ends (the provider then waits in the triggerer).
DEFERRABLE_RUNNERS = frozenset({"DataflowRunner"})


class BeamPrepareOperator(TidalPrepareOperator):
    """Branch: skip to ``commit`` when the step is committed, else write the job config and launch.

    XCom ``prepared`` = :func:`tidal.core.beam_job.prepare`'s dict (the job's arguments).
    """

    def choose_branch(self, context: Any) -> list[str]:
        from tidal.core.beam_job import prepare

        params = context.get("params") or {}
        force = self.step_name in (params.get("force_steps") or [])
        prepared = prepare(pipeline_for_run(self.recipe_path, context), self.step_name, force=force)
        context["ti"].xcom_push(key="prepared", value=prepared)
        self.log.info("%s %s -> %s", prepared["status"], prepared["step_id"], prepared.get("out", "committed"))
        if prepared["status"] == "skip":
            return [self.commit_task_id]
        return [self.launch_task_id, self.commit_task_id]


class BeamCommitOperator(TidalCommitOperator):
    """Commit the step after its Beam job succeeded (or confirm it was committed already)."""

    def __init__(self, *, runner: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.runner = runner

    def execute(self, context: Any) -> dict[str, Any]:
        from tidal.core.beam_job import commit

        export_signing_key()  # the commit signs step.json and manifest.json (tidal/integrity/signing.py)
        prepared = context["ti"].xcom_pull(task_ids=self.prepare_task_id, key="prepared")
        pipe = pipeline_for_run(self.recipe_path, context)
        result = commit(pipe, self.step_name, prepared=prepared, runner=self.runner, workload=self.workload,
                        run_key=run_key_of(context))
        self.log.info("%s %s in %.3f s -> %s", result.status, result.step_id, result.seconds, result.out_dir)
        self.announce_step(context, pipe, result, run_key_of(context))
        return {"step_id": result.step_id, "status": result.status, "seconds": round(result.seconds, 3)}


def _label(value: str) -> str:
    """A GCP label value: lower-case letters, digits, ``-`` and ``_``, at most 63 characters."""
    return re.sub(r"[^a-z0-9_-]", "-", value.lower())[:63]


def job_name(step: Any) -> str:
    """The job's name (Dataflow: ``[a-z]([-a-z0-9]*[a-z0-9])?``; the provider appends a suffix)."""
    return re.sub(r"[^a-z0-9-]", "-", f"tidal-{step.step_id}".lower())


def beam_operator_kwargs(*, step: Any, recipe: Any, prepare_task_id: str) -> dict[str, Any]:
    """``BeamRunPythonPipelineOperator`` arguments for one Beam step; templated on the prepare XCom.

    * ``py_file`` = the kind's module with ``py_options=["-m"]``: run as a module, not as the
      file ``tidal/data/clean/step.py``, whose directory on ``sys.path`` would shadow the standard
      library's ``tokenize`` with ``tidal/data/tokenize.py``.
    * ``py_interpreter``: the Python that parsed the DAG (the workers run the same image).
    * ``pipeline_options``: the job's own arguments (the provider writes each as ``--key=value``,
      a list as repeated ``--input=``); ``default_pipeline_options``: ``beam.pipeline_options``.
    * ``deferrable`` only for Dataflow: its launcher returns once the job is submitted and the
      wait is in the triggerer; a local or Flink launcher runs until the job ends, on the worker.
    * ``dataflow_config`` (Dataflow only): job name ``tidal-{step_id}``; project and region from
      the pipeline options (the provider otherwise overwrites them from the GCP connection).
    """
    from tidal.core.commit import step_seed

    beam = recipe.beam
    prepared = f'ti.xcom_pull(task_ids="{prepare_task_id}", key="prepared")'

    def pulled(*keys: str) -> str:
        return "{{ " + prepared + "".join(f'["{k}"]' for k in keys) + " }}"

    job = {
        "config": pulled("config"),
        "input": [f"{dep.name}={pulled('inputs', dep.name)}" for dep in step.inputs],
        "out": pulled("out"),
        "name": step.name,
        "labels": {"tidal-recipe": _label(recipe.name), "tidal-step": _label(step.name),
                   "tidal-step-id": _label(step.step_id)},
    }
    seed = step_seed(step)  # None for clean and tokenize (they draw no random numbers): no --seed
    if seed is not None:
        job["seed"] = seed
    kwargs: dict[str, Any] = {
        "py_file": f"tidal.data.{step.kind}",
        "py_options": ["-m"],
        "py_interpreter": sys.executable,
        "runner": beam.runner,
        "default_pipeline_options": dict(beam.pipeline_options),
        "pipeline_options": job,
        "deferrable": beam.runner in DEFERRABLE_RUNNERS,
    }
    if beam.runner == "DataflowRunner":
        options = beam.pipeline_options
        kwargs["dataflow_config"] = {
            "job_name": job_name(step),
            **({"project_id": options["project"]} if "project" in options else {}),
            **({"location": options["region"]} if "region" in options else {}),
        }
    return kwargs


def beam_step_group(*, step: Any, recipe: Any, recipe_path: str) -> TaskGroup:
    """The task group that runs one Beam ``step`` through the provider (call inside a ``DAG`` context)."""
    with TaskGroup(group_id=step.name, tooltip=f"step {step.step_id} on {recipe.beam.runner}") as group:
        prefix = f"{step.name}."
        prepare = BeamPrepareOperator(task_id="prepare", recipe_path=recipe_path, step_name=step.name,
                                      launch_task_id=f"{prefix}launch", commit_task_id=f"{prefix}commit",
                                      doc_md=f"step `{step.step_id}` ({step.kind})")
        launch = ProviderOperator(task_id="launch", provider_class=BEAM_OPERATOR,
                                  operator_kwargs=beam_operator_kwargs(step=step, recipe=recipe,
                                                                       prepare_task_id=f"{prefix}prepare"))
        commit = BeamCommitOperator(task_id="commit", recipe_path=recipe_path, step_name=step.name,
                                    prepare_task_id=f"{prefix}prepare", workload=job_name(step),
                                    runner=recipe.beam.runner, outlets=[step_alias(recipe.name, step.name)])
        prepare >> launch >> commit
        prepare >> commit
    return group


__all__ = ["BEAM_OPERATOR", "BeamCommitOperator", "BeamPrepareOperator", "beam_operator_kwargs",
           "beam_step_group", "job_name"]
