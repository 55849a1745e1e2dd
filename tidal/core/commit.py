"""The one commit path: every place a step runs (in-process, a pod, a Beam-provider job) ends here.

Invariant: ``_SUCCESS`` is written last, after ``manifest.json`` (every output file with size
and sha256) and ``step.json`` (what was hashed, input ids, summary, provenance and times), and
only after the kind's own output checks passed (:func:`check_outputs`). A committed step is
never recomputed unless forced, and checking that costs one ``stat``.

The callers differ only in where the computation ran and where its summary comes from:
:func:`tidal.core.runner.run_step` (``module.run`` in this process, under a lease),
:func:`tidal.core.remote.commit` (``summary.json`` a pod wrote) and
:func:`tidal.core.beam_job.commit` (the kind's ``summarize`` over a job's outputs). Each calls
:func:`skip_result` for a committed step and :func:`commit_step` otherwise, so a drift between
them (a check one path skips) cannot happen.

Kind contract (optional, beside the kind's ``run`` and ``summarize``):

* ``expected_outputs(config) -> list[str]``: file names a finished run must have written;
* ``check_outputs(config, out_dir) -> None``: raises ``ValueError`` naming the file and both
  numbers when the outputs disagree with each other (e.g. row counts against ``counts.json``).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tidal.context import StepContext, is_uri
from tidal.core.inputs import verify_inputs
from tidal.integrity.fingerprint import environment_fingerprint
from tidal.integrity.hashing import MANIFEST_NAME, write_manifest
from tidal.integrity.provenance import environment, git_sha
from tidal.integrity.signing import load_key, signature_doc, signing_record, write_signature
from tidal.kinds import kind_spec
from tidal.steps import CommittedStep, Step, derive_seed
from tidal.storage import Storage, staging
from tidal.storage.layout import SIGNATURE_JSON, STEP_JSON, SUCCESS, atomic_write_text
from tidal.storage.lease import Lease

log = logging.getLogger("tidal.runner")


class StepBlocked(RuntimeError):
    """A step's inputs are not committed yet; the message names them."""


class OutputsIncomplete(RuntimeError):
    """A finished run lacks an output its kind declares (nothing was committed)."""


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


def now() -> str:
    """The current UTC time as ISO 8601 with milliseconds (the times recorded in ``step.json``)."""
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def read_step_json(out_dir: Path) -> dict[str, Any]:
    """The ``step.json`` of a committed step directory."""
    return json.loads((out_dir / STEP_JSON).read_text())


def needs_run(step: Step, storage: Storage, *, force: bool = False, keep_until_commit: bool = False) -> bool:
    """Whether ``step`` must be computed: False if committed (and not forced).

    ``force`` moves a committed output aside first, unless ``keep_until_commit`` (in-process runs,
    :func:`tidal.core.runner.run_step`: the old output stays committed until the new attempt commits,
    :func:`commit_step` with ``replace``). Shared by in-process runs and the prepare halves of runs
    elsewhere (:mod:`tidal.core.remote`, :mod:`tidal.core.beam_job`), which still discard first.

    Raises:
        StepBlocked: it must run but an input step is not committed.
        tidal.core.inputs.InputMismatch: a committed input no longer matches its manifest (or signature).
    """
    if isinstance(step, CommittedStep):  # another run's output, read here: never recomputed or discarded
        if storage.is_committed(step.step_id):
            return False
        raise StepBlocked(f"step {step.step_id} ({step.name}) was committed when the recipe was planned and is "
                          "gone now; it is another run's output, which this graph never recomputes")
    if force:
        if not keep_until_commit:
            storage.discard(step.step_id)
    elif storage.is_committed(step.step_id):
        return False
    missing = [dep.step_id for dep in step.inputs if not storage.is_committed(dep.step_id)]
    if missing:
        raise StepBlocked(f"step {step.step_id} cannot run: inputs not committed: {missing}")
    verify_inputs(step, storage)  # a hand-edited, re-signed or unsigned input is refused, not read
    return True


def step_seed(step: Step) -> int | None:
    """The step's own seed, derived from the recipe seed in its config and its name
    (:func:`tidal.steps.derive_seed`); None for a kind that draws no random numbers.

    Raises:
        ValueError: the kind is seeded (``tidal/kinds.py``) but the config carries no ``seed``
            (a planner bug: a seeded step never falls back to a default seed).
    """
    seeded = kind_spec(step.kind).seeded
    if "seed" not in step.config:
        if seeded:
            raise ValueError(f"step {step.step_id}: a {step.kind} step needs a 'seed' in its config "
                             "(derived from the recipe seed); none was planned")
        return None
    return derive_seed(int(step.config["seed"]), step.name)


def input_location(storage: Storage, step_id: str) -> Path | str:
    """Where a committed input lives as a step reads it: the directory on a local root, the step's
    URI on an object-store root (read in place; :meth:`StepContext.input_dir` downloads on demand)."""
    return storage.step_dir(step_id) if not is_uri(storage.uri) else storage.step_uri(step_id)


def make_context(step: Step, storage: Storage, work_dir: Path) -> StepContext:
    """The :class:`StepContext` of ``step`` writing into ``work_dir``; inputs are named by
    :func:`input_location` and downloaded only if the kind asks for a local copy
    (:meth:`tidal.storage.Storage.input_dir`: verified against the manifest).

    Raises:
        ValueError: a seeded kind's config has no seed (:func:`step_seed`).
    """
    return StepContext(
        step_id=step.step_id,
        name=step.name,
        kind=step.kind,
        config=step.typed_config,  # the model parsed at plan time, unchanged
        out_dir=work_dir,
        inputs={dep.name: input_location(storage, dep.step_id) for dep in step.inputs},
        input_ids={dep.name: dep.step_id for dep in step.inputs},
        seed=step_seed(step),
        log=logging.getLogger(f"tidal.step.{step.name}"),
        resolve=lambda uri: storage.input_dir(uri.rstrip("/").rsplit("/", 1)[-1]),
    )


def skip_result(step: Step, storage: Storage, seconds: float) -> StepResult:
    """The result of a step that is already committed (its summary read back from ``step.json``)."""
    summary = json.loads(storage.read_text(step.step_id, STEP_JSON)).get("summary", {})
    return StepResult(step.name, step.step_id, step.kind, "skip", seconds, storage.step_dir(step.step_id), summary)


def check_outputs(step: Step, work_dir: Path, *, where: str = "the run") -> None:
    """Check a finished run's outputs against its kind's contract before anything is committed.

    Every name of ``expected_outputs(config)`` must be a file in ``work_dir``; then the kind's
    ``check_outputs(config, work_dir)`` runs. Kinds that declare neither pass.

    Raises:
        OutputsIncomplete: naming the missing files, ``where`` (e.g. "the FlinkRunner job") and the step.
        ValueError: the kind's own check failed (names the file and both numbers).
    """
    try:
        staging.check_outputs(step.kind, step.typed_config, work_dir, where=where, step_id=step.step_id)
    except staging.StagedIncomplete as err:
        raise OutputsIncomplete(str(err)) from None


def step_record(step: Step, storage: Storage, manifest: dict[str, Any], summary: dict[str, Any], key: Any, *,
                started_at: str, seconds: float, provenance: dict[str, Any] | None) -> dict[str, Any]:
    """What ``step.json`` records: hash input, summary, manifest root hash, environment fingerprint,
    signing, and provenance (git sha, environment, storage root, times, ``provenance`` extras)."""
    return {
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
            "ended_at": now(),
            "seconds": round(seconds, 3),
            "pid": os.getpid(),
            **(provenance or {}),
        },
    }


def write_commit(
    step: Step,
    storage: Storage,
    work_dir: Path,
    summary: dict[str, Any],
    *,
    started_at: str,
    seconds: float,
    provenance: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write ``manifest.json``, ``step.json``, ``signature.json`` (with a key), then ``_SUCCESS`` (last).

    ``provenance`` adds fields (e.g. launcher, workload, lease). ``step.json`` also records the
    environment fingerprint (:mod:`tidal.integrity.fingerprint`) and ``signing``; with
    ``$TIDAL_SIGNING_KEY`` set, both files are signed (:mod:`tidal.integrity.signing`).

    Raises:
        tidal.integrity.signing.SigningKeyError: ``$TIDAL_SIGNING_KEY`` is set but malformed.

    Returns:
        The manifest written.
    """
    key = load_key()
    (work_dir / SUCCESS).unlink(missing_ok=True)
    (work_dir / SIGNATURE_JSON).unlink(missing_ok=True)
    manifest = write_manifest(work_dir, exclude=(STEP_JSON, SUCCESS, SIGNATURE_JSON))
    record = step_record(step, storage, manifest, summary, key, started_at=started_at, seconds=seconds,
                         provenance=provenance)
    (work_dir / STEP_JSON).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    if key is not None:
        write_signature(work_dir, key)
    atomic_write_text(work_dir / SUCCESS, manifest["root_hash"] + "\n", durable=True)
    return manifest


def commit_step(
    step: Step,
    storage: Storage,
    work_dir: Path,
    summary: dict[str, Any] | Callable[[], dict[str, Any]],
    *,
    started_at: str,
    seconds: float,
    provenance: dict[str, Any] | None = None,
    lease: Lease | None = None,
    where: str = "the run",
    replace: bool = False,
) -> StepResult:
    """Commit a finished run of ``step`` from ``work_dir``: the kind's output checks, the commit
    files (:func:`write_commit`), then publication (a scratch directory is renamed or uploaded
    into place; a resumable one is committed in place or uploaded with the marker last), then
    the failed attempts kept for inspection are cleared.

    Args:
        summary: what the run returned (in-process), or a function that reads it back from the
            outputs (called after the output checks passed).
        started_at: ISO time the attempt started (recorded in ``step.json``).
        seconds: wall time of the attempt.
        provenance: extra fields for ``step.json`` (launcher, runner, workload).
        lease: the step's lease when one is held: checked before and after the commit files are
            written (a worker that lost its lease must not publish); its record enters provenance.
        where: names the run in errors ("the FlinkRunner job", "the gke run").
        replace: a forced rerun of a committed step computed into scratch (``work_dir``): the old
            output is moved aside (:meth:`Storage.discard`) only now, after the new one passed its
            checks, just before it is published; until then the old output stays committed.

    Raises:
        OutputsIncomplete: an expected output is missing; ValueError: a kind check failed.
        tidal.storage.lease.LeaseLost: the lease moved to another worker (nothing published).
    """
    spec = kind_spec(step.kind)
    check_outputs(step, work_dir, where=where)
    if callable(summary):
        summary = summary()
    if lease is not None:
        lease.ensure_held()
        provenance = {**(provenance or {}), "lease": lease.record()}
    manifest = write_commit(step, storage, work_dir, summary, started_at=started_at, seconds=seconds,
                            provenance=provenance)
    if lease is not None:
        lease.ensure_held()  # fence: a worker that lost its lease must not publish
    if replace:
        storage.discard(step.step_id)  # the old output goes only now (a forced rerun: tidal run --force)
    if spec.resumable and not replace:
        storage.commit_resumable(work_dir, step.step_id)  # local: in place; object store: upload, marker last
    elif not storage.commit_scratch(work_dir, step.step_id):  # local: atomic rename; object store: marker last
        log.info("%s was committed by another attempt first (same content address): skip", step.step_id)
        return skip_result(step, storage, seconds)
    storage.clear_attempts(step.step_id)
    log.info("committed %s in %.1f s (manifest %s)", step.step_id, seconds, manifest["root_hash"][:12])
    return StepResult(step.name, step.step_id, step.kind, "run", seconds, storage.step_dir(step.step_id), summary)


def commit_staged(
    step: Step,
    storage: Storage,
    location: str,
    summary: dict[str, Any],
    *,
    started_at: str,
    seconds: float,
    provenance: dict[str, Any] | None = None,
    where: str = "the run",
) -> StepResult:
    """Commit a run another machine staged at ``location`` (an object-store root), reading only
    ``manifest.json`` and the listing: the run sealed its outputs (the kind's checks, the manifest,
    :func:`tidal.storage.staging.seal`); here the listing is checked against the manifest and the
    kind's expected outputs, ``step.json`` and the signature are written, and the step is published
    with ``_SUCCESS`` last (:func:`tidal.storage.staging.publish`).

    Raises:
        OutputsIncomplete: nothing or not all of it was staged (names the files); nothing committed.
    """
    module = kind_spec(step.kind).load()
    expected = list(getattr(module, "expected_outputs", lambda _c: [])(step.typed_config))
    try:
        manifest, manifest_text = staging.staged_manifest(location, expected, where=where, step_id=step.step_id)
    except staging.StagedIncomplete as err:
        raise OutputsIncomplete(str(err)) from None
    key = load_key()
    record = step_record(step, storage, manifest, summary, key, started_at=started_at, seconds=seconds,
                         provenance=provenance)
    records = {STEP_JSON: (json.dumps(record, indent=1, sort_keys=True) + "\n").encode()}
    if key is not None:
        signed = {MANIFEST_NAME: manifest_text.encode(), STEP_JSON: records[STEP_JSON]}
        records[SIGNATURE_JSON] = (json.dumps(signature_doc(key, signed), indent=1, sort_keys=True) + "\n").encode()
    if not staging.publish(storage, location, step.step_id, manifest, records):
        log.info("%s was committed by another attempt first (same content address): skip", step.step_id)
        return skip_result(step, storage, seconds)
    storage.clear_attempts(step.step_id)
    log.info("committed %s in %.1f s (manifest %s, staged at %s)", step.step_id, seconds,
             manifest["root_hash"][:12], location)
    return StepResult(step.name, step.step_id, step.kind, "run", seconds, storage.step_dir(step.step_id), summary)


__all__ = ["STEP_JSON", "OutputsIncomplete", "StepBlocked", "StepResult", "check_outputs", "commit_staged",
           "commit_step", "input_location", "make_context", "needs_run", "now", "read_step_json", "skip_result",
           "step_record", "step_seed", "write_commit"]
