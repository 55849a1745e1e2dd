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

On an object-store root the same commit files are read (a few small GETs per input) and the signature
is checked; the data objects are read in place by the kinds, whole files checked against the manifest
as they are read (:meth:`tidal.files.step_files.StepFiles.read_bytes`), ranged reads not.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from tidal.files.step_files import StepFiles, is_uri
from tidal.integrity.hashing import MANIFEST_NAME, verify_manifest
from tidal.integrity.signing import SigningKey, check_signature, load_key
from tidal.steps import Step
from tidal.storage import Storage
from tidal.storage.base import StorageError
from tidal.storage.layout import SIGNATURE_JSON, STEP_JSON, SUCCESS

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
            if not remote:
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
