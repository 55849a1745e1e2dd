"""The commit protocol around a Beam data step that runs as a job command (``beam.launcher: provider``).

Invariant: the job is exactly the standalone face of the step kind (:mod:`tidal.data.jobcli`),
``python -m tidal.data.<kind> --config FILE --input NAME=DIR ... --out SCRATCH
--name STEP [--runner=R --pipeline_option=V ...]`` (clean and tokenize draw no random numbers:
no ``--seed``), run by the Beam provider's
``BeamRunPythonPipelineOperator`` (operators/beam.py); the commit protocol stays with the
caller, in two halves that each take milliseconds on the Airflow worker:

1. :func:`prepare`: a committed step is reported as such (no job starts); inputs must be
   committed (else :class:`tidal.core.runner.StepBlocked`); a fresh scratch directory is made
   (the job's ``--out``) and the step's config model (parsed at plan time) is written as its JSON
   next to it, in ``{scratch}.job/config.json`` (outside the step's outputs, so the manifest is the
   same): the config's one serialized form, parsed once by the job (:mod:`tidal.data.jobcli`).
2. the operator runs the job; the runner's workers write into the scratch directory.
3. :func:`commit`: the kind's expected outputs must exist and pass the kind's own checks
   (``expected_outputs`` / ``check_outputs`` beside its ``summarize``); the summary is read back
   from them by ``summarize`` (what its ``run`` returns in-process), then the one commit path
   (:func:`tidal.core.commit.commit_step`: ``manifest.json``, ``step.json``, ``_SUCCESS``, the
   atomic rename of the scratch directory into place, or on an object store the upload with
   the marker last), exactly as :func:`tidal.core.runner.run_step` does; then MLflow.

On an object-store root (docs/architecture.md §0) every argument is a location in the bucket: ``out`` is the
attempt's staging location (:mod:`tidal.storage.staging`), ``config`` its ``….job/config.json``,
``inputs`` the committed steps' URIs (read in place). The job computes in a local scratch on its
own machine, seals the outputs (the kind's checks, ``manifest.json``), stages them and writes
``….job/summary.json`` (what ``run`` returned); commit reads only that, the manifest and the
listing (:func:`tidal.core.commit.commit_staged`). No task downloads step data to commit.

The summary comes from the outputs, not from the job's stdout: with ``DataflowRunner`` the
provider stops following the launcher process as soon as it has the Dataflow job id and
waits on the job itself. So the bytes, the manifest root hash and the step id are the same
as in-process, whatever runner ran the job; a failed or killed job leaves only scratch.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidal.context import is_uri
from tidal.core.commit import (
    OutputsIncomplete,
    StepResult,
    commit_staged,
    commit_step,
    make_context,
    needs_run,
    now,
    skip_result,
)
from tidal.kinds import BEAM_KINDS, kind_spec
from tidal.storage import staging, uris

log = logging.getLogger("tidal.runner")

JOB_SUFFIX = staging.JOB_SUFFIX
CONFIG_FILE = staging.CONFIG_FILE

if TYPE_CHECKING:
    from tidal.core.pipeline import Pipeline


class JobIncomplete(OutputsIncomplete):
    """The Beam job reported success but an expected output is missing from its directory."""


def job_dir(work_dir: Path) -> Path:
    """Where the job's own files (its config) live: next to the scratch dir, never inside it."""
    return work_dir.with_name(work_dir.name + JOB_SUFFIX)


def prepare(pipe: Pipeline, name: str, *, force: bool = False) -> dict[str, Any]:
    """Get Beam step ``name`` ready for a job run.

    Returns:
        ``{"step_id", "status", "started_at"}``; ``status`` is ``"skip"`` when the step is
        committed (nothing written). With ``"run"`` also the job's arguments: ``out`` (the
        scratch dir), ``config`` (the JSON file), ``inputs`` (name -> committed dir), ``seed``
        (None: the kind draws no random numbers).

    Raises:
        StepBlocked: an input step is not committed.
        ValueError: the step's kind is not a Beam job.
    """
    step = pipe.graph[name]
    if step.kind not in BEAM_KINDS:
        raise ValueError(f"step {name} is a {step.kind} step; Beam kinds: {sorted(BEAM_KINDS)}")
    storage = pipe.storage
    base = {"step_id": step.step_id, "started_at": now()}
    if not needs_run(step, storage, force=force):
        return {**base, "status": "skip"}
    storage.clear_uncommitted(step.step_id)
    if is_uri(storage.uri):
        out = staging.new_staging(storage, step.step_id)
        ctx = make_context(step, storage, Path("/nonexistent-job-local-dir"))
        config_uri = uris.join(staging.job_location(out), CONFIG_FILE)
        uris.write_bytes(config_uri, kind_spec(step.kind).config_json(ctx.config).encode())
        return {**base, "status": "run", "out": out, "config": config_uri,
                "inputs": {n: str(p) for n, p in ctx.inputs.items()}, "seed": ctx.seed}
    work_dir = storage.new_scratch(step.step_id)  # also removes stale scratch and job dirs
    ctx = make_context(step, storage, work_dir)
    config_path = job_dir(work_dir) / CONFIG_FILE
    config_path.parent.mkdir()
    config_path.write_text(kind_spec(step.kind).config_json(ctx.config))
    return {**base, "status": "run", "out": str(work_dir), "config": str(config_path),
            "inputs": {n: str(p) for n, p in ctx.inputs.items()}, "seed": ctx.seed}


def commit(pipe: Pipeline, name: str, *, prepared: dict[str, Any], runner: str,
           workload: str | None = None, run_key: str | None = None) -> StepResult:
    """Commit Beam step ``name`` after its job finished; a committed step is a no-op skip.

    Args:
        prepared: what :func:`prepare` returned (scratch dir, start time).
        runner: the Beam runner, recorded in provenance with ``workload`` (e.g. the job name).
        run_key: MLflow parent-run key; None records nothing.

    Raises:
        JobIncomplete: an expected output is missing (the job did not finish).
        ValueError: the kind's output checks refused the outputs (names the file and both numbers).
    """
    tick = time.perf_counter()
    step = pipe.graph[name]
    storage = pipe.storage
    if is_uri(storage.uri):
        result = _commit_staged(pipe, step, prepared, runner, workload, tick)
        if run_key is not None:
            pipe.record(result, run_key)
        return result
    work_dir = Path(prepared["out"]) if prepared.get("status") == "run" else None
    if storage.is_committed(step.step_id):
        result = skip_result(step, storage, time.perf_counter() - tick)
        if work_dir is not None:  # committed meanwhile by another attempt: same content address
            shutil.rmtree(work_dir, ignore_errors=True)
    else:
        if work_dir is None:
            raise JobIncomplete(f"step {step.step_id} is not committed and its prepare reported "
                                f"{prepared.get('status')!r}; rerun the step's prepare task")
        config = step.typed_config  # the job's config model; no input is read to commit
        seconds = (datetime.now(UTC) - datetime.fromisoformat(prepared["started_at"])).total_seconds()
        try:
            result = commit_step(step, storage, work_dir,
                                 lambda: kind_spec(step.kind).load().summarize(config, work_dir),
                                 started_at=prepared["started_at"], seconds=seconds, where=f"the {runner} job",
                                 provenance={"launcher": "beam-provider", "runner": runner, "workload": workload})
        except OutputsIncomplete as err:
            raise JobIncomplete(f"{err}; rerun the step's task group") from None
        except ValueError:  # the kind's checks refused the outputs: keep them for inspection
            if work_dir.exists():
                log.error("step %s: the %s job's outputs were refused; kept at %s (never counts as committed)",
                          step.step_id, runner, storage.keep_failed(work_dir, step.step_id))
            shutil.rmtree(job_dir(work_dir), ignore_errors=True)
            raise
    if work_dir is not None:
        shutil.rmtree(job_dir(work_dir), ignore_errors=True)
    if run_key is not None:
        pipe.record(result, run_key)
    return result


def _commit_staged(pipe: Pipeline, step: Any, prepared: dict[str, Any], runner: str, workload: str | None,
                   tick: float) -> StepResult:
    """Object-store root: commit the outputs the job staged, reading only its summary and manifest."""
    storage = pipe.storage
    if storage.is_committed(step.step_id):
        if prepared.get("status") == "run":  # committed meanwhile by another attempt: same content address
            uris.delete_dir(prepared["out"])
            uris.delete_dir(staging.job_location(prepared["out"]))
        return skip_result(step, storage, time.perf_counter() - tick)
    if prepared.get("status") != "run":
        raise JobIncomplete(f"step {step.step_id} is not committed and its prepare reported "
                            f"{prepared.get('status')!r}; rerun the step's prepare task")
    out = prepared["out"]
    try:
        summary = json.loads(uris.read_bytes(uris.join(staging.job_location(out), staging.SUMMARY_FILE)))
    except FileNotFoundError:
        raise JobIncomplete(f"{out}: the {runner} job of {step.step_id} staged no {staging.SUMMARY_FILE} (it did "
                            "not finish); nothing was committed; rerun the step's task group") from None
    seconds = (datetime.now(UTC) - datetime.fromisoformat(prepared["started_at"])).total_seconds()
    try:
        return commit_staged(step, storage, out, summary, started_at=prepared["started_at"], seconds=seconds,
                             where=f"the {runner} job",
                             provenance={"launcher": "beam-provider", "runner": runner, "workload": workload})
    except OutputsIncomplete as err:
        raise JobIncomplete(f"{err}; rerun the step's task group") from None


__all__ = ["BEAM_KINDS", "JobIncomplete", "commit", "job_dir", "prepare"]
