"""Run one step in this process under the commit protocol: skip if committed, else compute under
the step's lease and commit through :mod:`tidal.core.commit` (the one commit path).

Invariant: a committed step is never recomputed unless forced, and checking that costs one
``stat``, so rerunning a whole DAG, clearing a task or backfilling redoes exactly the missing
work. ``_SUCCESS`` is written last (:func:`tidal.core.commit.commit_step`).
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

from tidal.core.commit import (
    StepBlocked,
    StepResult,
    commit_step,
    make_context,
    needs_run,
    now,
    skip_result,
)
from tidal.kinds import kind_spec
from tidal.logs import quiet_libraries
from tidal.steps import Step
from tidal.storage import Storage
from tidal.storage.disk import disk_full_error, is_disk_full
from tidal.storage.lease import Lease, LeaseLost

LEASE_ROUNDS = 3  # lease acquisitions per run_step before giving up on a step whose lease keeps moving
log = logging.getLogger("tidal.runner")
__all__ = ["StepBlocked", "StepResult", "run_step"]


def run_step(step: Step, storage: Storage, *, force: bool = False) -> StepResult:
    """Run ``step`` unless it is committed; commit its output atomically.

    The computation runs under the step's lease (:mod:`tidal.storage.lease`): a second worker that
    starts the same step meanwhile waits (up to ``storage.settings.lease_wait_s``) and then
    skips it once the holder committed. The lease is recorded in ``step.json``
    (``provenance.lease``).

    Args:
        step: the planned step (its inputs must already be committed).
        storage: the storage root (local directory or object store).
        force: recompute even if committed: the attempt computes into fresh scratch (a resumable
            kind too: a forced run starts over) and the old output stays committed until the new
            one commits (a failed forced attempt leaves it, and its descendants, as they were).

    Raises:
        StepBlocked: an input step is not committed.
        tidal.storage.lease.LeaseTimeout: another worker held the lease for ``lease_wait_s`` without committing.
        tidal.storage.lease.LeaseLost: this worker's lease was taken over before it committed.
        Exception: whatever the step kind raises; nothing is committed then.
    """
    started = time.perf_counter()
    if not needs_run(step, storage, force=force, keep_until_commit=True):
        return skip_result(step, storage, time.perf_counter() - started)
    replace = force and storage.is_committed(step.step_id)
    committed = (lambda: False) if replace else (lambda: storage.is_committed(step.step_id))
    for _ in range(LEASE_ROUNDS):
        lease = storage.lease(step.step_id)
        if not lease.acquire(wait_s=storage.settings.lease_wait_s, done=committed):
            log.info("%s was committed by another worker while this one waited for its lease: skip", step.step_id)
            return skip_result(step, storage, time.perf_counter() - started)
        try:
            if committed():  # committed between our check and our lease
                return skip_result(step, storage, time.perf_counter() - started)
            return _compute(step, storage, lease, started, replace=replace)
        except LeaseLost as err:  # another worker holds it now: wait for it like any loser
            log.warning("%s; waiting for the new holder", err)
        finally:
            lease.release()
    raise LeaseLost(f"step {step.step_id}: lost the lease {LEASE_ROUNDS} times; is another worker's clock "
                    f"far off, or storage.lease_ttl_s ({storage.settings.lease_ttl_s} s) too short?")


def _compute(step: Step, storage: Storage, lease: Lease, started: float, *, replace: bool = False) -> StepResult:
    """Compute ``step`` into local scratch (or its resumable dir) and commit it; the lease is held.
    ``replace``: a forced rerun of a committed step (scratch for every kind; the old output is
    discarded at commit, :func:`tidal.core.commit.commit_step`)."""
    spec = kind_spec(step.kind)
    quiet_libraries()
    module = spec.load()
    if getattr(module, "STEP_VERSION", spec.version) != spec.version:
        raise RuntimeError(
            f"{spec.module}.STEP_VERSION={module.STEP_VERSION} but tidal/kinds.py says {spec.version}; "
            "bump both together"
        )
    in_scratch = replace or not spec.resumable
    if not in_scratch:
        work_dir = storage.resumable_dir(step.step_id)
    else:
        storage.clear_uncommitted(step.step_id)
        work_dir = storage.new_scratch(step.step_id)

    ctx = make_context(step, storage, work_dir)
    started_at = now()
    log.info("running %s (%s)", step.step_id, step.kind)
    try:
        summary = module.run(ctx) or {}
    except BaseException as err:
        if _discard_attempt(err, step, storage, work_dir, in_scratch, "failed"):
            raise disk_full_error(step.step_id, work_dir) from err
        raise
    try:
        return commit_step(step, storage, work_dir, summary, started_at=started_at,
                           seconds=time.perf_counter() - started, lease=lease, replace=replace)
    except LeaseLost:
        if in_scratch:
            shutil.rmtree(work_dir, ignore_errors=True)
        raise
    except Exception as err:  # the kind's output checks refused the run: keep it for inspection
        if _discard_attempt(err, step, storage, work_dir, in_scratch, "had its outputs refused"):
            raise disk_full_error(step.step_id, work_dir) from err
        raise


def _discard_attempt(err: BaseException, step: Step, storage: Storage, work_dir: Path, in_scratch: bool,
                     what: str) -> bool:
    """Deal with a failed attempt's ``work_dir``; True when ``err`` is a full disk.

    A full disk keeps nothing (every retry would leave another copy): the caller raises one
    :func:`disk_full_error` (not returned here: a local holding it would keep the failed frames,
    and their open files, alive in a cycle until the garbage collector runs). Otherwise a scratch
    dir holding files is kept under ``.failed/`` for inspection (never counted as committed) and
    an empty one removed. A resumable dir is always left as it is: its checkpoints are what the
    rerun resumes from. ``what`` completes the log
    line "step ID ...".
    """
    if is_disk_full(err):
        if in_scratch:
            shutil.rmtree(work_dir, ignore_errors=True)
        return True
    if in_scratch and work_dir.exists():
        if any(p.is_file() for p in work_dir.rglob("*")):
            log.error("step %s %s; its partial output is kept at %s (never counts as committed)",
                      step.step_id, what, storage.keep_failed(work_dir, step.step_id))
        else:
            shutil.rmtree(work_dir, ignore_errors=True)
            log.error("step %s %s before writing any output (nothing kept)", step.step_id, what)
    return False
