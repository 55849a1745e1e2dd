"""The commit protocol around a training step that runs elsewhere (a pod, a JobSet).

Invariant: the pod runs only the entrypoint, ``python -m tidal.train STEP_URI``, exactly as
the local launcher does; the commit protocol stays with the caller, in two halves that each
take milliseconds on the Airflow worker:

1. :func:`prepare`: a committed step is reported as such (no pod is ever started for it);
   inputs must be committed (else :class:`tidal.core.runner.StepBlocked`); ``spec.json`` is
   written into the step directory, which is kept across attempts (training resumes from
   its checkpoints there, as the ``train`` kind is resumable).
2. the launcher runs the entrypoint; it writes checkpoints, metrics and ``summary.json``.
3. :func:`commit`: ``summary.json`` must exist; then the one commit path
   (:func:`tidal.core.commit.commit_step`: the kind's output checks, ``manifest.json``,
   ``step.json``, ``_SUCCESS`` last) exactly as an in-process run, and the step is recorded in MLflow.

So a pod that dies, is preempted or is deleted leaves an uncommitted directory whose next
attempt resumes; only a finished run is ever marked done. ``spec.json`` holds what the
local runner writes (:func:`tidal.train.write_spec`), so the entrypoint cannot tell the two
apart.

On an object-store root nothing a pod needs is on the Airflow worker's disk (docs/architecture.md §0):
``step_uri`` is the step's staging location in the bucket
(:func:`tidal.storage.staging.resumable_staging`); prepare writes ``spec.json`` there, the pod
downloads it, trains in its own local directory, seals its outputs (manifest) and stages them
there; commit reads ``summary.json`` and ``manifest.json`` only and publishes
(:func:`tidal.core.commit.commit_staged`). Neither prepare nor commit downloads step data.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tidal.context import is_uri
from tidal.core.commit import StepResult, commit_staged, commit_step, make_context, needs_run, now, skip_result
from tidal.core.pipeline import Pipeline
from tidal.storage import staging, uris
from tidal.storage.layout import SPEC_JSON
from tidal.storage.layout import SUMMARY_JSON as SUMMARY
from tidal.train import spec_of, spec_text, write_spec  # light: no JAX (see tidal/train/__init__.py)
from tidal.train.preflight import preflight, sizing_record


class RemoteRunIncomplete(RuntimeError):
    """The launcher reported success but the step directory lacks ``summary.json``."""


def prepare(pipe: Pipeline, name: str, *, force: bool = False) -> dict[str, Any]:
    """Get step ``name`` ready for a remote run.

    Returns:
        ``{"step_id", "step_uri", "status", "started_at"}``; ``status`` is ``"skip"`` when the
        step is committed (nothing written) and ``"run"`` when ``spec.json`` was written. A train step on a
        TPU or GPU that will run also has ``"sizing"`` (:func:`tidal.train.preflight.sizing_record`), for
        :func:`commit` to record.

    Raises:
        StepBlocked: an input step is not committed.
        tidal.train.preflight.SizingRefused: a train step that does not fit its accelerator (checked before
            anything is written, so no pod starts: one line saying what to change).
    """
    step = pipe.graph[name]
    storage = pipe.storage
    base = {"step_id": step.step_id, "step_uri": storage.step_uri(step.step_id), "started_at": now()}
    if not needs_run(step, storage, force=force):
        return {**base, "status": "skip"}
    if step.kind == "train" and (sizing := preflight(step, pipe.recipe)) is not None:
        base["sizing"] = sizing_record(sizing)

    if is_uri(storage.uri):  # the pod reads spec.json from the bucket, never from this worker's disk
        location = staging.resumable_staging(storage, step.step_id)
        spec = spec_of(make_context(step, storage, Path("/nonexistent-pod-local-dir")))
        uris.write_bytes(uris.join(location, SPEC_JSON), spec_text(spec).encode())
        return {**base, "step_uri": location, "status": "run"}
    work_dir = storage.resumable_dir(step.step_id)  # local root: the step dir itself
    write_spec(make_context(step, storage, work_dir))
    return {**base, "step_uri": str(work_dir), "status": "run"}


def commit(pipe: Pipeline, name: str, *, started_at: str, launcher: str,
           workload: str | None = None, run_key: str | None = None, sizing: dict[str, Any] | None = None) -> StepResult:
    """Commit step ``name`` after its remote run finished; a committed step is a no-op skip.

    Args:
        started_at: ISO time :func:`prepare` returned (recorded in ``step.json``).
        launcher: ``"gke"``; recorded in provenance with ``workload`` (Pod / JobSet name).
        run_key: MLflow parent-run key; None records nothing.
        sizing: what :func:`prepare` sized the step as (its ``"sizing"``); ``provenance.sizing`` of ``step.json``.

    Raises:
        RemoteRunIncomplete: ``summary.json`` is missing (the pod did not finish training).
    """
    tick = time.perf_counter()
    step = pipe.graph[name]
    storage = pipe.storage
    provenance = {"launcher": launcher, "workload": workload} | ({"sizing": sizing} if sizing else {})
    if storage.is_committed(step.step_id):
        result = skip_result(step, storage, time.perf_counter() - tick)
    elif is_uri(storage.uri):
        location = staging.resumable_staging(storage, step.step_id)
        try:
            summary = json.loads(uris.read_bytes(uris.join(location, SUMMARY)))
        except FileNotFoundError:
            raise RemoteRunIncomplete(f"{location}{SUMMARY} is missing: the {launcher} run of {step.step_id} did "
                                      "not finish; rerun the launch task (training resumes from checkpoints)") from None
        seconds = (datetime.now(UTC) - datetime.fromisoformat(started_at)).total_seconds()
        result = commit_staged(step, storage, location, summary, started_at=started_at, seconds=seconds,
                               provenance=provenance, where=f"the {launcher} run")
    else:
        work_dir = storage.resumable_dir(step.step_id)
        if not (work_dir / SUMMARY).is_file():
            raise RemoteRunIncomplete(f"{work_dir}/{SUMMARY} is missing: the {launcher} run of {step.step_id} "
                                      "did not finish; rerun the launch task (training resumes from checkpoints)")
        summary = json.loads((work_dir / SUMMARY).read_text())
        seconds = (datetime.now(UTC) - datetime.fromisoformat(started_at)).total_seconds()
        result = commit_step(step, storage, work_dir, summary, started_at=started_at, seconds=seconds,
                             provenance=provenance, where=f"the {launcher} run")
    if run_key is not None:
        pipe.record(result, run_key)
    return result
