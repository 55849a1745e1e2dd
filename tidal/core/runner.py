"""Run one step under the commit protocol: skip if committed, else compute, record, commit.

Invariant: ``_SUCCESS`` is written last, after ``manifest.json`` (every output file with
size and sha256) and ``step.json`` (what was hashed, input ids, summary, provenance and
times). A committed step is never recomputed unless forced, and checking that costs one
``stat``, so rerunning a whole DAG, clearing a task or backfilling redoes exactly the
missing work.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tidal.context import StepContext
from tidal.integrity.fingerprint import environment_fingerprint
from tidal.integrity.hashing import write_manifest
from tidal.integrity.provenance import environment, git_sha
from tidal.integrity.signing import SIGNATURE_JSON, load_key, signing_record, write_signature
from tidal.kinds import kind_spec
from tidal.logs import quiet_libraries
from tidal.steps import Step, derive_seed
from tidal.storage import SUCCESS, LocalStorage, Storage
from tidal.storage.lease import Lease, LeaseLost

STEP_JSON = "step.json"
LEASE_ROUNDS = 3  # lease acquisitions per run_step before giving up on a step whose lease keeps moving
log = logging.getLogger("tidal.runner")


class StepBlocked(RuntimeError):
    """A step's inputs are not committed yet; the message names them."""


@dataclass(frozen=True)
class StepResult:
    """What happened to one step: ``status`` is ``"run"`` or ``"skip"`` (already committed)."""

    name: str
    step_id: str
    kind: str
    status: str
    seconds: float
    out_dir: Path
    summary: dict[str, Any] = field(default_factory=dict)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def read_step_json(out_dir: Path) -> dict[str, Any]:
    """The ``step.json`` of a committed step directory."""
    return json.loads((out_dir / STEP_JSON).read_text())


def needs_run(step: Step, storage: Storage, *, force: bool = False) -> bool:
    """Whether ``step`` must be computed: False if committed (and not forced).

    ``force`` first moves a committed output aside. Shared by in-process runs and the
    prepare tasks of runs elsewhere (:mod:`tidal.core.remote`, :mod:`tidal.core.beam_job`).

    Raises:
        StepBlocked: it must run but an input step is not committed.
    """
    if force:
        storage.discard(step.step_id)
    elif storage.is_committed(step.step_id):
        return False
    missing = [dep.step_id for dep in step.inputs if not storage.is_committed(dep.step_id)]
    if missing:
        raise StepBlocked(f"step {step.step_id} cannot run: inputs not committed: {missing}")
    return True


def run_step(step: Step, storage: Storage, *, force: bool = False) -> StepResult:
    """Run ``step`` unless it is committed; commit its output atomically.

    The computation runs under the step's lease (:mod:`tidal.storage.lease`): a second worker that
    starts the same step meanwhile waits (up to ``storage.settings.lease_wait_s``) and then
    skips it once the holder committed. The lease is recorded in ``step.json``
    (``provenance.lease``).

    Args:
        step: the planned step (its inputs must already be committed).
        storage: the storage root (local directory or object store).
        force: recompute even if committed (the old output is moved aside first).

    Raises:
        StepBlocked: an input step is not committed.
        tidal.storage.lease.LeaseTimeout: another worker held the lease for ``lease_wait_s`` without committing.
        tidal.storage.lease.LeaseLost: this worker's lease was taken over before it committed.
        Exception: whatever the step kind raises; nothing is committed then.
    """
    started = time.perf_counter()
    out_dir = storage.step_dir(step.step_id)
    if not needs_run(step, storage, force=force):
        return _skipped(step, storage, started)
    for _ in range(LEASE_ROUNDS):
        lease = storage.lease(step.step_id)
        if not lease.acquire(wait_s=storage.settings.lease_wait_s, done=lambda: storage.is_committed(step.step_id)):
            log.info("%s was committed by another worker while this one waited for its lease: skip", step.step_id)
            return _skipped(step, storage, started)
        try:
            if storage.is_committed(step.step_id):  # committed between our check and our lease
                return _skipped(step, storage, started)
            return _compute(step, storage, lease, started, out_dir)
        except LeaseLost as err:  # another worker holds it now: wait for it like any loser
            log.warning("%s; waiting for the new holder", err)
        finally:
            lease.release()
    raise LeaseLost(f"step {step.step_id}: lost the lease {LEASE_ROUNDS} times; is another worker's clock "
                    f"far off, or storage.lease_ttl_s ({storage.settings.lease_ttl_s} s) too short?")


def _skipped(step: Step, storage: Storage, started: float) -> StepResult:
    summary = json.loads(storage.read_text(step.step_id, STEP_JSON)).get("summary", {})
    return StepResult(step.name, step.step_id, step.kind, "skip", time.perf_counter() - started,
                      storage.step_dir(step.step_id), summary)


def _compute(step: Step, storage: Storage, lease: Lease, started: float, out_dir: Path) -> StepResult:
    """Compute ``step`` into local scratch (or its resumable dir) and commit it; the lease is held."""
    spec = kind_spec(step.kind)
    quiet_libraries()
    module = spec.load()
    if getattr(module, "STEP_VERSION", spec.version) != spec.version:
        raise RuntimeError(
            f"{spec.module}.STEP_VERSION={module.STEP_VERSION} but tidal/kinds.py says {spec.version}; "
            "bump both together"
        )
    if spec.resumable:
        work_dir = storage.resumable_dir(step.step_id)
    else:
        storage.clear_uncommitted(step.step_id)
        work_dir = storage.new_scratch(step.step_id)

    ctx = make_context(step, storage, work_dir)
    started_at = _now()
    log.info("running %s (%s)", step.step_id, step.kind)
    try:
        summary = module.run(ctx) or {}
    except BaseException:
        if not spec.resumable and work_dir.exists():
            kept = storage.keep_failed(work_dir, step.step_id)
            log.error("step %s failed; its partial output is kept at %s (never counts as committed)",
                      step.step_id, kept)
        raise
    seconds = time.perf_counter() - started
    try:
        lease.ensure_held()
        manifest = write_commit(step, storage, work_dir, summary, started_at=started_at, seconds=seconds,
                                provenance={"lease": lease.record()})
        lease.ensure_held()  # fence: a worker that lost its lease must not publish
    except LeaseLost:
        if not spec.resumable:
            shutil.rmtree(work_dir, ignore_errors=True)
        raise
    if not spec.resumable:
        storage.commit_scratch(work_dir, step.step_id)
    else:
        storage.commit_resumable(work_dir, step.step_id)
    storage.clear_attempts(step.step_id)
    log.info("committed %s in %.1f s (manifest %s)", step.step_id, seconds, manifest["root_hash"][:12])
    return StepResult(step.name, step.step_id, step.kind, "run", seconds, out_dir, summary)


def make_context(step: Step, storage: Storage, work_dir: Path) -> StepContext:
    """The :class:`StepContext` of ``step`` writing into ``work_dir`` (inputs: committed dirs, local;
    an object store's are downloaded and verified first, :meth:`tidal.storage.Storage.input_dir`)."""
    return StepContext(
        step_id=step.step_id,
        name=step.name,
        kind=step.kind,
        config=json.loads(json.dumps(dict(step.config))),
        out_dir=work_dir,
        inputs={dep.name: storage.input_dir(dep.step_id) for dep in step.inputs},
        input_ids={dep.name: dep.step_id for dep in step.inputs},
        seed=derive_seed(int(step.config.get("seed", 0)), step.name),
        log=logging.getLogger(f"tidal.step.{step.name}"),
    )


def write_commit(
    step: Step,
    storage: LocalStorage,
    work_dir: Path,
    summary: dict[str, Any],
    *,
    started_at: str,
    seconds: float,
    provenance: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write ``manifest.json``, ``step.json``, ``signature.json`` (with a key), then ``_SUCCESS`` (last).

    Shared by in-process runs and runs elsewhere (a pod: :mod:`tidal.core.remote`), so both
    commit byte-for-byte the same way. ``provenance`` adds fields (e.g. launcher, workload).
    ``step.json`` also records the environment fingerprint (:mod:`tidal.integrity.fingerprint`) and
    ``signing``; with ``$TIDAL_SIGNING_KEY`` set, both files are signed (:mod:`tidal.integrity.signing`).

    Raises:
        tidal.integrity.signing.SigningKeyError: ``$TIDAL_SIGNING_KEY`` is set but malformed.

    Returns:
        The manifest written.
    """
    key = load_key()
    (work_dir / SUCCESS).unlink(missing_ok=True)
    (work_dir / SIGNATURE_JSON).unlink(missing_ok=True)
    manifest = write_manifest(work_dir, exclude=(STEP_JSON, SUCCESS, SIGNATURE_JSON))
    record = {
        "step_id": step.step_id,
        "hash_input": step.hash_input,
        "summary": summary,
        "manifest_root_hash": manifest["root_hash"],
        "environment": environment_fingerprint(),
        "signing": signing_record(key),
        "provenance": {
            "git_sha": git_sha(),
            "environment": environment(),
            "storage_root": str(storage.root),
            "started_at": started_at,
            "ended_at": _now(),
            "seconds": round(seconds, 3),
            "pid": os.getpid(),
            **(provenance or {}),
        },
    }
    (work_dir / STEP_JSON).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    if key is not None:
        write_signature(work_dir, key)
    _write_marker(work_dir / SUCCESS, manifest["root_hash"])
    return manifest


def _write_marker(path: Path, content: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as handle:
        handle.write(content + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.rename(tmp, path)
