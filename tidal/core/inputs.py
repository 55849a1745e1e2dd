"""A step's committed inputs are checked before it runs: a hand-edited input is refused, not read.

On a local storage root a step reads its inputs in place, so :func:`verify_inputs` checks each one
first with :func:`tidal.verify.verify_step`, the one verifier of committed steps (every file's size
and sha256, the manifest's root hash and the ``_SUCCESS`` marker, the step id from ``step.json``,
and, with a signing key configured, the HMACs of ``signature.json``). A verified input is
remembered by its root hash (and key id) under ``{root}/.verified/``, so a rerun costs one ``stat``
per input.

On an object-store root nothing is read in place from another machine's disk: an input a kind reads
as a local directory is downloaded and verified against its manifest then
(:meth:`tidal.storage.Storage.input_dir`); in-place reads go to the bucket, whose objects the
commit sealed.
"""

from __future__ import annotations

from tidal.files import is_uri
from tidal.integrity.signing import load_key
from tidal.layout import SUCCESS
from tidal.steps import Step
from tidal.storage import Storage
from tidal.storage.base import StorageError
from tidal.verify import verify_step

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
        problems = [str(m) for m in verify_step(folder, dep.step_id, key).mismatches]
        if problems:
            shown = "; ".join(problems[:3]) + (f" (and {len(problems) - 3} more)" if len(problems) > 3 else "")
            raise InputMismatch(
                f"step {step.step_id}: its input {dep.step_id} at {folder} does not match what was committed: "
                f"{shown}; restore it, or recompute it with `tidal run RECIPE --force {dep.name}`")
        hashed += 1
        seen.parent.mkdir(parents=True, exist_ok=True)
        seen.write_text(f"{dep.step_id} {marker_root}\n")
    return hashed
