"""The staging location: where a step computed on another machine waits for its commit.

Invariant (docs/architecture.md §0): a step that runs elsewhere (a training pod, a Beam job launched by
the Beam provider) is handed only locations under the storage root, and the commit task never
downloads step data. So the three halves meet in the bucket:

1. prepare (an Airflow task) picks a fresh staging location for the attempt,
   ``{root}/.staging/{step_id}.{token}/``, and writes what the run needs beside it, under
   ``{root}/.staging/{step_id}.{token}.job/`` (a Beam job's ``config.json``) or into it (a
   training step's ``spec.json``, which is one of its outputs);
2. the run (on any machine) computes in its own local scratch, checks its outputs against the
   kind's contract and writes ``manifest.json`` (:func:`seal`: it has the bytes, so it hashes
   them), then uploads the directory to the staging location (:func:`stage`) and, for a Beam
   job, its summary to ``….job/summary.json``;
3. commit (another Airflow task) reads ``manifest.json`` (one small GET), checks the staged
   listing against it (every file there, with its size), and publishes: server-side copies into
   ``{root}/{step_id}/``, then ``step.json`` and the signature, ``_SUCCESS`` last
   (:func:`publish`). Then the staging prefix is deleted.

A killed run leaves only staging (never counted as committed); two attempts that both finish
publish the same content-addressed bytes, and ``_SUCCESS`` is written only if absent.

On a local root the staging location is the usual scratch directory and the commit is the
rename of :meth:`tidal.storage.LocalStorage.commit_scratch`.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from pathlib import Path
from typing import Any

from tidal.context import CHECKSUMS, is_uri
from tidal.files.output import read_checksums
from tidal.integrity.hashing import MANIFEST_NAME, build_manifest, manifest_of, manifest_text, write_manifest
from tidal.kinds import kind_spec
from tidal.storage import uris
from tidal.storage.base import Storage, StorageError
from tidal.storage.layout import SIGNATURE_JSON, STEP_JSON, SUCCESS

STAGING = ".staging"
JOB_SUFFIX = ".job"
SUMMARY_FILE = "summary.json"
CONFIG_FILE = "config.json"
log = logging.getLogger("tidal.storage")


class StagedIncomplete(StorageError):
    """The staged outputs are missing or disagree with their manifest (nothing was committed)."""


def new_staging(storage: Storage, step_id: str) -> str:
    """A fresh staging location for one attempt at ``step_id``: a URI under an object-store root,
    else a new local scratch directory (as a string)."""
    if not is_uri(storage.uri):
        return str(storage.new_scratch(step_id))
    return uris.join(storage.uri, STAGING, f"{step_id}.{time.strftime('%Y%m%dT%H%M%S')}.{uuid.uuid4().hex[:8]}") + "/"


def resumable_staging(storage: Storage, step_id: str) -> str:
    """The one staging location of a resumable step (training), the same for every attempt, so a
    rerun of its launch, or of its prepare, finds what earlier attempts left there."""
    return uris.join(storage.uri, STAGING, step_id) + "/"


def parse_location(staging: str) -> tuple[str, str]:
    """``{root}/.staging/{step_id}[.{time}.{rand}]/`` -> ``(root, step_id)``.

    Raises:
        StorageError: ``staging`` is not a staging location.
    """
    head, sep, tail = staging.rstrip("/").partition(f"/{STAGING}/")
    if not sep or not tail:
        raise StorageError(f"{staging!r} is not a staging location ({{root}}/{STAGING}/{{step_id}}...)")
    return head, tail.split("/")[0].split(".")[0]


def job_location(staging: str) -> str:
    """Where a run's own files (config, summary) live: beside the staging location, never in it."""
    return staging.rstrip("/") + JOB_SUFFIX + ("/" if is_uri(staging) else "")


def check_outputs(kind: str, config: Any, work_dir: Path | str, *, where: str, step_id: str) -> None:
    """The kind's output contract over a finished run: a local directory, or the staging location its
    workers wrote to (read in place: listing, small files, headers); every ``expected_outputs(config)``
    file exists, then the kind's ``check_outputs(config, work_dir)``. ``config``: the step's config
    model (:attr:`tidal.steps.Step.typed_config`), handed to the kind unchanged.

    Raises:
        StagedIncomplete: naming the missing files; ValueError: the kind's own check failed.
    """
    module = kind_spec(kind).load()
    expected = getattr(module, "expected_outputs", None)
    if expected is not None:
        present = set(uris.list_sizes(work_dir)) if is_uri(str(work_dir)) else None
        missing = [name for name in expected(config)
                   if (name not in present if present is not None else not (Path(work_dir) / name).is_file())]
        if missing:
            raise StagedIncomplete(f"{work_dir}: {where} of {step_id} did not write {missing}; "
                                   "nothing was committed (rerun the step)")
    check = getattr(module, "check_outputs", None)
    if check is not None:
        check(config, work_dir)


def seal(kind: str, config: Any, work_dir: Path, *, step_id: str, where: str,
         remote: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Check a finished run's outputs and write its ``manifest.json`` (by the process that has the bytes).

    Args:
        remote: entries (``{path, bytes, sha256}``) of outputs already written to the staging location by
            the processes that had their bytes (a multi-process run's sharded checkpoints,
            :func:`tidal.train.shards.committed_entries`), sealed with the local files.

    Returns:
        The manifest (every file with size and sha256, and the root hash).

    Raises:
        StagedIncomplete: a remote entry has the path of a local file.
    """
    check_outputs(kind, config, work_dir, where=where, step_id=step_id)
    for name in (STEP_JSON, SUCCESS, SIGNATURE_JSON):
        (work_dir / name).unlink(missing_ok=True)
    if not remote:
        return write_manifest(work_dir, exclude=(STEP_JSON, SUCCESS, SIGNATURE_JSON))
    local = build_manifest(work_dir, exclude=(STEP_JSON, SUCCESS, SIGNATURE_JSON, MANIFEST_NAME))["files"]
    both = {e["path"] for e in local} & {e["path"] for e in remote}
    if both:
        raise StagedIncomplete(f"{work_dir}: {where} of {step_id}: {sorted(both)[:5]} both local and in the bucket")
    manifest = manifest_of(sorted(local + list(remote), key=lambda e: e["path"]))
    (work_dir / MANIFEST_NAME).write_text(manifest_text(manifest))
    return manifest


def seal_staged(kind: str, config: Any, staging: str, *, step_id: str, where: str) -> dict[str, Any]:
    """Seal a run whose workers wrote its outputs straight to ``staging`` (the Beam kinds on a cluster
    runner, :class:`tidal.files.output.OutputDir`): check them in place (:func:`check_outputs`), then
    build ``manifest.json`` from the listing and the checksum records the writing workers left under
    ``….job/checksums/`` (size and sha256 of the bytes they uploaded), and write it last. No output
    is read again to hash it; the manifest is byte-identical to :func:`seal`'s over the same files.

    Returns:
        The manifest.

    Raises:
        StagedIncomplete: a listed file has no checksum record or another size than its record
            (a writer that did not finish, or a stray object), or a reserved name is staged.
        ValueError: the kind's own output check failed.
    """
    check_outputs(kind, config, staging, where=where, step_id=step_id)
    sizes = uris.list_sizes(staging)
    records = read_checksums(uris.join(job_location(staging), CHECKSUMS))
    reserved = [n for n in (MANIFEST_NAME, STEP_JSON, SUCCESS, SIGNATURE_JSON) if n in sizes]
    unrecorded = [n for n in sorted(sizes) if n not in records]
    wrong = [n for n in sorted(sizes) if n in records and records[n]["bytes"] != sizes[n]]
    if reserved or unrecorded or wrong:
        raise StagedIncomplete(f"{staging}: {where} of {step_id}: reserved names staged {reserved}, files with "
                               f"no checksum record {unrecorded[:10]}, of another size than recorded {wrong[:10]}; "
                               "nothing was committed (rerun the step)")
    manifest = manifest_of([{"path": n, "bytes": sizes[n], "sha256": records[n]["sha256"]} for n in sorted(sizes)])
    uris.write_bytes(uris.join(staging, MANIFEST_NAME), manifest_text(manifest).encode())
    log.info("sealed %s in place: %d files, %d bytes, root %s", staging, len(manifest["files"]),
             manifest["total_bytes"], manifest["root_hash"][:12])
    return manifest


def stage(work_dir: Path, staging: str, *, uploaded: tuple[str, ...] = ()) -> int:
    """Upload a sealed directory to its staging location, ``manifest.json`` last; returns bytes sent.

    Args:
        uploaded: folders (e.g. ``checkpoints/``) whose files were uploaded there as they were
            written, each checked against its own sha256 manifest: a file under one of them that the
            listing has at the same size is not sent again.
    """
    names = sorted(p.relative_to(work_dir).as_posix() for p in work_dir.rglob("*") if p.is_file())
    if MANIFEST_NAME not in names:
        raise StagedIncomplete(f"{work_dir}: not sealed (no {MANIFEST_NAME}); seal() it first")
    there = uris.list_sizes(staging) if uploaded else {}
    names = [n for n in names if not (n.startswith(uploaded) and there.get(n) == (work_dir / n).stat().st_size)]
    sent = uris.upload_dir(work_dir, staging, [n for n in names if n != MANIFEST_NAME])
    sent += uris.upload_dir(work_dir, staging, [MANIFEST_NAME])
    log.info("staged %d files (%d bytes) at %s", len(names), sent, staging)
    return sent


def staged_manifest(staging: str, expected: list[str], *, where: str, step_id: str) -> tuple[dict[str, Any], str]:
    """Read a staged run's manifest and check the listing against it, downloading nothing else.

    Returns:
        ``(manifest, manifest text)``.

    Raises:
        StagedIncomplete: no manifest (the run did not finish), or a file missing / of another
            size than the manifest says, or an ``expected`` output absent from the manifest.
    """
    try:
        text = uris.read_bytes(uris.join(staging, MANIFEST_NAME)).decode()
    except FileNotFoundError:
        raise StagedIncomplete(f"{staging}: {where} of {step_id} staged no {MANIFEST_NAME} (it did not finish); "
                               "nothing was committed (rerun the step)") from None
    manifest = json.loads(text)
    sizes = uris.list_sizes(staging)
    wrong = [e["path"] for e in manifest["files"] if sizes.get(e["path"]) != e["bytes"]]
    files = {e["path"] for e in manifest["files"]}
    missing = [name for name in expected if name not in files]
    if wrong or missing:
        raise StagedIncomplete(f"{staging}: {where} of {step_id}: files missing or of the wrong size {wrong[:10]}, "
                               f"expected outputs not staged {missing}; nothing was committed (rerun the step)")
    return manifest, text


def publish(storage: Storage, staging: str, step_id: str, manifest: dict[str, Any], records: dict[str, bytes]) -> bool:
    """Turn a staged, checked run into the committed step, ``_SUCCESS`` last (object-store roots).

    Data objects and ``manifest.json`` are copied server-side (CopyObject; multipart copy for large
    objects), then ``records`` (``step.json``, then the signature); the target is listed to check every
    file is there with its size, then ``_SUCCESS`` (body: the manifest root hash; written only if
    absent, so of two racing attempts, which publish the same content-addressed bytes, one marker
    wins). The staging prefix is deleted afterwards.

    Returns:
        True if this call committed; False if the step was committed by another attempt first.

    Raises:
        StorageError: the root is not an object store (local roots commit by rename).
    """
    if not is_uri(storage.uri):
        raise StorageError(f"publish() is for object-store roots; {storage.uri} commits by rename")
    if storage.is_committed(step_id):
        uris.delete_dir(staging)
        uris.delete_dir(job_location(staging))
        return False

    target = storage.step_uri(step_id)
    names = [e["path"] for e in manifest["files"]] + [MANIFEST_NAME]
    uris.copy_dir(staging, target, names, storage.settings)
    for name, data in records.items():
        uris.write_bytes(uris.join(target, name), data)
    sizes = uris.list_sizes(target)  # fence: a concurrent clear of the uncommitted prefix must not pass
    wrong = [e["path"] for e in manifest["files"] if sizes.get(e["path"]) != e["bytes"]]
    wrong += [n for n in (MANIFEST_NAME, *records) if n not in sizes]
    if wrong:
        raise StagedIncomplete(f"{target}: before {SUCCESS}, these objects are missing or of the wrong size: "
                               f"{wrong[:10]}; nothing was committed (the staged run is kept at {staging})")
    won = uris.write_bytes(uris.join(target, SUCCESS), (manifest["root_hash"] + "\n").encode(), if_absent=True)
    uris.delete_dir(staging)
    uris.delete_dir(job_location(staging))
    log.info("committed %s from %s (%d files, copied in the bucket)%s", target, staging, len(names),
             "" if won else "; another attempt's marker was first (same content address)")
    return won
