"""A step's committed inputs are checked before it runs: a hand-edited, re-signed or unsigned input is
refused, not read.

Every time a step runs, :func:`verify_inputs` checks each committed input: its ``_SUCCESS`` marker names
the manifest root hash it was committed with, and the manifest's root hash recomputes from its file list.
On a local root, where the step then reads its inputs in place, every listed file is hashed again and
compared by size and sha256 (:func:`tidal.integrity.hashing.verify_manifest`): by content, every time.
There is no cache of earlier checks: a cache must be keyed by something, and the marker's root hash
(the earlier key) is what a tamperer leaves alone when they edit a file (issue 43, item 4). The cost is
one sequential read of the inputs per step run, measured by bench/verify_throughput.py
(``dependent_check_MBps``).

With a signing key configured (``TIDAL_SIGNING_KEY``) every input must be signed with that key and its
HMACs of ``manifest.json`` and ``step.json`` must verify: the rule of ``tidal verify``, which requires a
signature whenever a key is configured. An input signed with another key, or unsigned, is refused, as is
one whose files and manifest were rewritten together.

On an object-store root, where the kinds read inputs in place (ranged reads that no hash covers), the
same commit files are read and the signature checked, and one listing of each input compares every object
with the manifest by size and by the time the store says it was last written (``LastModified``, which no
client can set): a committed step never changes, so an object written after its ``_SUCCESS`` marker
was rewritten after the commit and the input is refused, as is a missing or extra object. Whole files
are also checked against the manifest as they are read (:meth:`tidal.files.step_files.StepFiles.read_bytes`).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from tidal.files.step_files import StepFiles, is_uri
from tidal.integrity.hashing import MANIFEST_NAME, verify_manifest
from tidal.integrity.signing import SigningKey, check_signature, load_key
from tidal.steps import Step
from tidal.storage import Storage, uris
from tidal.storage.base import StorageError
from tidal.storage.layout import COMMIT_FILES, SIGNATURE_JSON, STEP_JSON, SUCCESS

__all__ = ["InputMismatch", "verify_inputs"]


class InputMismatch(StorageError):
    """A committed input of a step no longer matches what was committed (edited, truncated, re-signed)."""


def verify_inputs(step: Step, storage: Storage) -> int:
    """Check every committed input of ``step`` (module docstring).

    Returns:
        How many inputs were checked.

    Raises:
        InputMismatch: naming the input step, its first mismatches and how to recover.
    """
    key = load_key()
    remote = is_uri(storage.uri)
    for dep in step.inputs:
        where = storage.step_uri(dep.step_id) if remote else str(storage.step_dir(dep.step_id))
        files = StepFiles.open(where)
        problems = []
        try:
            marker_root = files.read_bytes(SUCCESS, checked=False).decode().strip()
            manifest = json.loads(files.read_bytes(MANIFEST_NAME, checked=False))
            if manifest.get("root_hash") != marker_root:
                problems.append(f"{MANIFEST_NAME} root_hash differs from the {SUCCESS} marker's")
            if remote:
                problems += _objects_problems(uris.list_objects(where), manifest)
            else:
                problems += verify_manifest(storage.step_dir(dep.step_id), manifest)
            if key is not None:
                problems += _signature_problems(lambda name, f=files: f.read_bytes(name, checked=False), key)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            problems.append(f"commit files unreadable: {type(err).__name__}: {err}")
        if problems:
            shown = "; ".join(problems[:3]) + (f" (and {len(problems) - 3} more)" if len(problems) > 3 else "")
            raise InputMismatch(
                f"step {step.step_id}: its input {dep.step_id} at {where} does not match what was committed: "
                f"{shown}; restore it, or recompute it with `tidal run RECIPE --force {dep.name}`")
    return len(step.inputs)


def _objects_problems(objects: dict[str, tuple[int, float]], manifest: dict) -> list[str]:
    """A committed step in a bucket against its manifest, from one listing: ``objects`` is name ->
    ``(bytes, last modified, unix s)`` (:func:`tidal.storage.uris.list_objects`)."""
    problems = []
    listed = {entry["path"]: entry["bytes"] for entry in manifest["files"]}
    for name, size in listed.items():
        if name not in objects:
            problems.append(f"{name}: missing")
        elif objects[name][0] != size:
            problems.append(f"{name}: {objects[name][0]} bytes, manifest says {size}")
    problems += [f"{name}: not in {MANIFEST_NAME}" for name in sorted(set(objects) - set(listed) - set(COMMIT_FILES))]
    committed_at = objects[SUCCESS][1] if SUCCESS in objects else None
    if committed_at is not None:
        problems += [f"{name}: written after the commit's {SUCCESS} (a committed step never changes)"
                     for name, (_, written) in sorted(objects.items()) if written > committed_at]
    return problems


def _signature_problems(read: Callable[[str], bytes], key: SigningKey) -> list[str]:
    """What is wrong with an input's signature under ``key`` (empty: signed with it, HMACs verify)."""
    try:
        doc = json.loads(read(SIGNATURE_JSON))
    except FileNotFoundError:
        return [(f"unsigned (no {SIGNATURE_JSON}), but a signing key ({key.key_id}) is configured: "
                 "`tidal verify` requires a signature then")]
    if doc.get("key_id") != key.key_id:
        return [f"{SIGNATURE_JSON} names key {doc.get('key_id')!r}, not the configured key {key.key_id!r}"]
    problems = [f"{name}: HMAC differs from {SIGNATURE_JSON}" for name, _, _ in check_signature(doc, read, key)]
    status = (json.loads(read(STEP_JSON)).get("signing") or {}).get("status")
    if not problems and status != "signed":
        problems.append(f"{STEP_JSON} records signing status {status!r}, not 'signed'")
    return problems
