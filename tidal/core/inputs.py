"""A step's committed inputs are checked before it runs: a hand-edited input is refused, not read.

On a local storage root a step reads its inputs in place, so :func:`verify_inputs` checks each one
first: its ``_SUCCESS`` marker names the manifest root hash it was committed with, the manifest's
root hash recomputes from its file list, every listed file has the manifest's size and sha256
(:func:`tidal.integrity.hashing.verify_manifest`), and, with a signing key configured, the HMACs of
``manifest.json`` and ``step.json`` in ``signature.json`` verify. A verified input is remembered by
its root hash (and key id) under ``{root}/.verified/``, so a rerun costs one ``stat`` per input.

On an object-store root nothing is read in place from another machine's disk: an input a kind reads
as a local directory is downloaded and verified against its manifest then
(:meth:`tidal.storage.Storage.input_dir`); in-place reads go to the bucket, whose objects the
commit sealed.
"""

from __future__ import annotations

import json

from tidal.files.step_files import is_uri
from tidal.integrity.hashing import MANIFEST_NAME, verify_manifest
from tidal.integrity.signing import check_signature, load_key
from tidal.steps import Step
from tidal.storage import Storage
from tidal.storage.base import StorageError
from tidal.storage.layout import SIGNATURE_JSON, SUCCESS

__all__ = ["VERIFIED_DIR", "InputMismatch", "verify_inputs"]

VERIFIED_DIR = ".verified"


class InputMismatch(StorageError):
    """A committed input of a step no longer matches what was committed (edited, truncated, re-signed)."""


def verify_inputs(step: Step, storage: Storage) -> int:
    """Check every committed input of ``step`` on a local root (module docstring).

    Returns:
        How many inputs were hashed now (0 when every one was verified before at this root hash).

    Raises:
        InputMismatch: naming the input step, its first mismatches and how to recover.
    """
    if is_uri(storage.uri):
        return 0
    key = load_key()
    hashed = 0
    for dep in step.inputs:
        folder = storage.step_dir(dep.step_id)
        marker_root = (folder / SUCCESS).read_text().strip()
        seen = storage.root / VERIFIED_DIR / (f"{dep.step_id}.{marker_root}" + (f".{key.key_id}" if key else ""))
        if seen.is_file():
            continue
        problems = []
        try:
            manifest = json.loads((folder / MANIFEST_NAME).read_text())
            if manifest.get("root_hash") != marker_root:
                problems.append(f"{MANIFEST_NAME} root_hash differs from the {SUCCESS} marker's")
            problems += verify_manifest(folder, manifest)
            if key is not None and (folder / SIGNATURE_JSON).is_file():
                doc = json.loads((folder / SIGNATURE_JSON).read_text())
                if doc.get("key_id") == key.key_id:
                    problems += [f"{name}: HMAC differs from signature.json"
                                 for name, _, _ in check_signature(doc, lambda n, d=folder: (d / n).read_bytes(), key)]
        except (OSError, ValueError, KeyError, TypeError) as err:
            problems.append(f"{MANIFEST_NAME} unreadable: {type(err).__name__}: {err}")
        if problems:
            shown = "; ".join(problems[:3]) + (f" (and {len(problems) - 3} more)" if len(problems) > 3 else "")
            raise InputMismatch(
                f"step {step.step_id}: its input {dep.step_id} at {folder} does not match what was committed: "
                f"{shown}; restore it, or recompute it with `tidal run RECIPE --force {dep.name}`")
        hashed += 1
        seen.parent.mkdir(parents=True, exist_ok=True)
        seen.write_text(f"{dep.step_id} {marker_root}\n")
    return hashed
