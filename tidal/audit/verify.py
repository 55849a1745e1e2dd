"""``tidal verify``: recompute every content hash, id and signature of committed steps.

Invariant: verification trusts nothing a step recorded about itself. For each step it
recomputes, from the bytes as stored now,

* the sha256 and size of every file the manifest lists (a flipped byte, a truncated,
  missing or *extra* file is reported: file, expected, got);
* the manifest's root hash (sha256 of its canonical file list, :mod:`tidal.integrity.hashing`), and
  that ``step.json`` and ``_SUCCESS`` record that same root;
* the step id from ``step.json``'s ``hash_input`` (:class:`tidal.steps.Step`'s formula) and
  that it names the directory it sits in;
* the HMAC-SHA256 of ``manifest.json`` and ``step.json`` (:mod:`tidal.integrity.signing`), when the
  step is signed and the key is configured.

Hash: SHA-256, as the manifests already record (:mod:`tidal.integrity.hashing`). It is what the
archives are pinned by, what ``sha256sum`` and object stores (S3 ``ChecksumSHA256``) can
check independently, and it runs at ~1-2 GB/s per core with the SHA extensions that
OpenSSL uses (``bench/verify_throughput.py`` measures it against ``sha256sum``); switching to
BLAKE3 would change every recorded hash for a speed-up that only matters past tens of GB.

Files are read in place through :class:`tidal.files.step_files.StepFiles`, the one reader of committed
steps: on an object store (``s3://``) the objects themselves, never a local copy (verification
runs on machines that share only the bucket); locally the step directory. Every file is
streamed through sha256 in chunks (:meth:`~tidal.files.step_files.StepFiles.sha256`), so a checkpoint is
never held in memory, and ``bytes`` counts what was hashed. The listing is taken afresh and the
small commit files are read unchecked (``read_bytes(checked=False)``): a damaged manifest is
reported, not trusted.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tidal.files.step_files import StepFiles
from tidal.integrity.hashing import MANIFEST_NAME, canonical_json, sha256_bytes
from tidal.integrity.signing import SIGNATURE_JSON, SIGNED_FILES, SigningKey, check_signature
from tidal.steps import ID_HASH_CHARS
from tidal.storage.layout import COMMIT_FILES as LAYOUT_COMMIT_FILES
from tidal.storage.layout import STEP_JSON, SUCCESS

#: Files the commit protocol writes next to the outputs; everything else must be in the manifest.
COMMIT_FILES = frozenset(LAYOUT_COMMIT_FILES)
#: Files hashed at once by default: one per core, at most 8 (bench/verify_throughput.py).
DEFAULT_WORKERS = min(8, os.cpu_count() or 1)


def step_files(storage: Any, step_id: str) -> StepFiles:
    """The files of ``step_id`` where ``storage`` commits them (``storage.step_uri``: a local
    directory, or ``s3://bucket/prefix/{step_id}/`` read object by object)."""
    return StepFiles.open(storage.step_uri(step_id))


def _location(files: StepFiles) -> str:
    """A bucket step as ``s3://bucket/prefix/{step_id}/`` (``step_uri``'s form), a directory as its path."""
    return files.uri_of("") if files.remote else files.uri


@dataclass(frozen=True)
class Mismatch:
    """One thing that does not match: which file, what was expected, what was found."""

    file: str
    expected: str
    got: str

    def __str__(self) -> str:
        return f"{self.file}: expected {self.expected}, got {self.got}"


@dataclass
class StepVerification:
    """The result of verifying one step.

    Attributes:
        signature: ``valid``, ``invalid``, ``unsigned``, ``unchecked (no key)`` or
            ``unchecked (signed with key <id>, configured <id>)``.
        files: data files hashed; ``bytes``: the bytes hashed of them (as read, not as listed);
            ``seconds``: wall time.
    """

    step_id: str
    location: str
    mismatches: list[Mismatch] = field(default_factory=list)
    signature: str = "unsigned"
    files: int = 0
    bytes: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """True when nothing mismatched."""
        return not self.mismatches

    def as_dict(self) -> dict[str, Any]:
        """JSON form (for ``tidal verify --json``)."""
        return {"step_id": self.step_id, "location": self.location, "ok": self.ok, "signature": self.signature,
                "files": self.files, "bytes": self.bytes, "seconds": round(self.seconds, 3),
                "mismatches": [vars(m) for m in self.mismatches]}


def _short(value: Any) -> str:
    return str(value) if value is not None else "nothing"


def _read(files: StepFiles, name: str) -> bytes | None:
    """The bytes of ``name`` as stored (not checked against the manifest, which may itself be
    damaged); None when it does not exist."""
    try:
        return files.read_bytes(name, checked=False)
    except FileNotFoundError:
        return None


def _hash(files: StepFiles, name: str) -> tuple[str, int] | None:
    """``(sha256, bytes hashed)`` of ``name``, streamed; None when it is gone (removed after the listing)."""
    try:
        return files.sha256(name)
    except FileNotFoundError:
        return None


def _load_json(files: StepFiles, name: str, bad: list[Mismatch]) -> dict[str, Any] | None:
    raw = _read(files, name)
    if raw is None:
        bad.append(Mismatch(name, "present", "missing"))
        return None
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        bad.append(Mismatch(name, "valid JSON", f"unreadable ({err})"))
        return None
    if not isinstance(data, dict):
        bad.append(Mismatch(name, "a JSON object", type(data).__name__))
        return None
    return data


def verify_step(files: StepFiles | str | Path, step_id: str, key: SigningKey | None = None,
                require_signature: bool = False, workers: int = DEFAULT_WORKERS) -> StepVerification:
    """Verify one committed step (see the module docstring for every check).

    Args:
        files: the step's files (:func:`step_files`), or its location (a directory, or
            ``s3://bucket/prefix/{step_id}/``) for :meth:`tidal.files.step_files.StepFiles.open`.
        step_id: the id the step is stored under (its directory name).
        key: the signing key, if configured (:func:`tidal.integrity.signing.load_key`).
        require_signature: count an unsigned step, or one whose signature cannot be
            checked (no key, another key), as a mismatch.
        workers: files hashed in parallel (threads; hashlib releases the GIL on large
            buffers, and object-store reads overlap their latency).

    Returns:
        A :class:`StepVerification`; ``ok`` is False on any mismatch. Never raises for
        damaged content: a missing or unreadable file is a mismatch.
    """
    started = time.perf_counter()
    files = StepFiles.open(files)
    result = StepVerification(step_id, _location(files))
    bad = result.mismatches
    present = files.list_files()
    if not present:
        bad.append(Mismatch("(step)", "a committed step directory", "nothing stored"))
        result.seconds = time.perf_counter() - started
        return result
    manifest = _load_json(files, MANIFEST_NAME, bad)
    record = _load_json(files, STEP_JSON, bad)

    root = None
    if manifest is not None:
        listed = manifest.get("files") if isinstance(manifest.get("files"), list) else []
        body = {"files": listed, "total_bytes": manifest.get("total_bytes")}
        root = sha256_bytes(canonical_json(body).encode())
        if root != manifest.get("root_hash"):
            bad.append(Mismatch(f"{MANIFEST_NAME} root_hash", _short(manifest.get("root_hash")), root))
        if manifest.get("total_bytes") != sum(int(e.get("bytes", 0)) for e in listed):
            bad.append(Mismatch(f"{MANIFEST_NAME} total_bytes", "the sum of its files' bytes",
                                _short(manifest.get("total_bytes"))))
        names = {entry.get("path") for entry in listed}
        extras = sorted(set(present) - names - COMMIT_FILES)
        to_hash = sorted(names & set(present)) + extras
        if workers > 1 and len(to_hash) > 1:
            with ThreadPoolExecutor(max_workers=workers) as pool:  # hashlib releases the GIL on large reads
                digests = dict(zip(to_hash, pool.map(lambda name: _hash(files, name), to_hash)))
        else:
            digests = {name: _hash(files, name) for name in to_hash}
        for entry in listed:
            name = entry.get("path")
            hashed = digests.get(name)
            if hashed is None:
                bad.append(Mismatch(name, f"sha256 {entry.get('sha256')}", "missing"))
                continue
            got, size = hashed
            if size != entry.get("bytes"):
                bad.append(Mismatch(name, f"{entry.get('bytes')} bytes", f"{size} bytes"))
            result.files += 1
            result.bytes += size
            if got != entry.get("sha256"):
                bad.append(Mismatch(name, f"sha256 {entry.get('sha256')}", f"sha256 {got}"))
        for extra in extras:
            if (hashed := digests[extra]) is not None:
                bad.append(Mismatch(extra, "not present (not in manifest.json)", f"sha256 {hashed[0]}"))

    raw_marker = _read(files, SUCCESS) if SUCCESS in present else None
    marker = raw_marker.decode(errors="replace") if raw_marker is not None else None
    if marker is None:
        bad.append(Mismatch(SUCCESS, "present (committed)", "missing"))
    elif root is not None and marker != f"{manifest.get('root_hash')}\n":  # exactly what the commit wrote
        bad.append(Mismatch(SUCCESS, f"manifest root {manifest.get('root_hash')}", repr(marker)))

    if record is not None:
        _check_record(record, step_id, manifest, bad)
        result.signature = _check_signing(files, record, present, key, require_signature, bad)
    result.seconds = time.perf_counter() - started
    return result


def _check_record(record: dict[str, Any], step_id: str, manifest: dict[str, Any] | None,
                  bad: list[Mismatch]) -> None:
    """step.json: recorded id = directory, id recomputed from hash_input, manifest root."""
    if record.get("step_id") != step_id:
        bad.append(Mismatch(f"{STEP_JSON} step_id", step_id, _short(record.get("step_id"))))
    hash_input = record.get("hash_input")
    if isinstance(hash_input, dict):
        try:
            recomputed = f"{hash_input.get('name')}-{sha256_bytes(canonical_json(hash_input).encode())[:ID_HASH_CHARS]}"
        except (TypeError, ValueError) as err:
            recomputed = f"(not hashable: {err})"
        if recomputed != step_id:
            bad.append(Mismatch(f"{STEP_JSON} hash_input", f"hashes to {step_id}", recomputed))
    else:
        bad.append(Mismatch(f"{STEP_JSON} hash_input", "an object", _short(hash_input)))
    if manifest is not None and record.get("manifest_root_hash") != manifest.get("root_hash"):
        bad.append(Mismatch(f"{STEP_JSON} manifest_root_hash", _short(manifest.get("root_hash")),
                            _short(record.get("manifest_root_hash"))))


def _signed_bytes(files: StepFiles) -> Callable[[str], bytes]:
    """name -> bytes as stored for the HMAC check; a missing file reads as ``b""`` (its HMAC then differs)."""
    return lambda name: _read(files, name) or b""


def _check_signing(files: StepFiles, record: dict[str, Any], present: dict[str, int], key: SigningKey | None,
                   require: bool, bad: list[Mismatch]) -> str:
    """Check ``signature.json`` against step.json's ``signing`` record; returns the status.

    The HMACs are recomputed whenever the configured key is the one ``signature.json`` names,
    even if step.json's record was altered, so the report names the file that changed.
    """
    signing = record.get("signing") if isinstance(record.get("signing"), dict) else {"status": "unsigned"}
    signed = signing.get("status") == "signed"
    doc = None
    if SIGNATURE_JSON in present:
        doc = _load_json(files, SIGNATURE_JSON, bad)
    elif signed:
        bad.append(Mismatch(SIGNATURE_JSON, f"present (step.json records a signature, key {signing.get('key_id')})",
                            "missing"))
        return "invalid"
    hmac_ok = None
    if doc is not None and key is not None and doc.get("key_id") == key.key_id:
        problems = check_signature(doc, _signed_bytes(files), key, SIGNED_FILES)
        bad += [Mismatch(f"{name} HMAC", expected, got) for name, expected, got in problems]
        hmac_ok = not problems
    if not signed:
        if SIGNATURE_JSON in present:
            bad.append(Mismatch(SIGNATURE_JSON, "absent (step.json records unsigned)", "present"))
            return "invalid"
        if require:
            bad.append(Mismatch(STEP_JSON, "a signed step (a signing key is configured, or --require-signature; "
                                            "--allow-unsigned accepts unsigned steps)", "unsigned"))
        return "unsigned"
    if doc is None:
        return "invalid"
    for field_name in ("algorithm", "key_id"):
        if doc.get(field_name) != signing.get(field_name):
            bad.append(Mismatch(f"{SIGNATURE_JSON} {field_name}", f"{signing.get(field_name)} (step.json)",
                                _short(doc.get(field_name))))
            return "invalid"
    if hmac_ok is not None:
        return "valid" if hmac_ok else "invalid"
    status = ("unchecked (no key)" if key is None
              else f"unchecked (signed with key {signing.get('key_id')}, configured {key.key_id})")
    if require:
        bad.append(Mismatch(SIGNATURE_JSON, f"checkable with key {signing.get('key_id')}", status))
    return status


def verify_steps(storage: Any, step_ids: Iterable[str], key: SigningKey | None = None,
                 require_signature: bool = False, workers: int = DEFAULT_WORKERS) -> list[StepVerification]:
    """:func:`verify_step` for each id, read in place through :func:`step_files`."""
    return [verify_step(step_files(storage, sid), sid, key, require_signature, workers) for sid in step_ids]


def format_verification(results: list[StepVerification], not_committed: Iterable[str] = ()) -> str:
    """Text report: one line per step, then one indented line per mismatch, then a total."""
    lines = []
    for res in results:
        verdict = "ok  " if res.ok else "FAIL"
        lines.append(f"{verdict} {res.step_id}  {res.files} files, {res.bytes:,} bytes, "
                     f"signature {res.signature}, {res.seconds:.2f} s")
        lines += [f"       {m}" for m in res.mismatches]
    for name in not_committed:
        lines.append(f"--   {name}  not committed (nothing to verify)")
    failed = sum(not r.ok for r in results)
    total = sum(r.bytes for r in results)
    lines.append(f"{len(results)} steps verified, {failed} failed, {total:,} bytes hashed")
    return "\n".join(lines)
