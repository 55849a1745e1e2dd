"""HMAC-SHA256 signatures of a step's ``manifest.json`` and ``step.json``.

Invariant: a signed step holds ``signature.json`` next to the two files it signs, written
after them and before ``_SUCCESS``; it records the algorithm, the key id (first 16 hex of
the key's sha256, so a verifier can tell *which* key without learning it) and, per file,
the HMAC over the file's exact bytes (RFC 2104 with SHA-256, Python's :mod:`hmac`).
``manifest.json`` pins every output file by sha256 and ``step.json`` pins the manifest's
root hash, the step id and what was hashed, so the two signatures cover the whole step.

The key comes from the environment only, never from a recipe (a recipe is shared and
versioned; a key is a secret): ``TIDAL_SIGNING_KEY`` holds it as hex, e.g.
``openssl rand -hex 32``. On Airflow, ``operators/step.py`` exports it from the connection
``tidal_signing`` (its password) into the task's environment; this module never imports
Airflow. Without a key a step is committed unsigned and ``step.json`` records
``{"status": "unsigned"}``; ``tidal verify --require-signature`` treats that as a failure.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tidal.settings import current

KEY_ENV = "TIDAL_SIGNING_KEY"
ALGORITHM = "HMAC-SHA256"
from tidal.storage.layout import MANIFEST_JSON, SIGNATURE_JSON, STEP_JSON

SIGNED_FILES = (MANIFEST_JSON, STEP_JSON)
# RFC 2104 §3: keys shorter than the hash output (32 bytes for SHA-256) are "strongly discouraged".
MIN_KEY_BYTES = 32
KEY_ID_CHARS = 16


class SigningKeyError(ValueError):
    """``TIDAL_SIGNING_KEY`` is set but is not a usable key (the message says why, never the key)."""


@dataclass(frozen=True)
class SigningKey:
    """A secret HMAC key (bytes); ``key_id`` names it without revealing it."""

    secret: bytes = field(repr=False)

    @property
    def key_id(self) -> str:
        """First 16 hex characters of sha256(secret)."""
        return hashlib.sha256(self.secret).hexdigest()[:KEY_ID_CHARS]

    def sign(self, data: bytes) -> str:
        """Hex HMAC-SHA256 of ``data`` (64 hex characters)."""
        return hmac.new(self.secret, data, hashlib.sha256).hexdigest()


def load_key(environ: Mapping[str, str] | None = None) -> SigningKey | None:
    """The signing key from ``$TIDAL_SIGNING_KEY`` (hex), or None when it is unset or empty.

    Raises:
        SigningKeyError: the value is not hex, or is shorter than 32 bytes (64 hex
            characters; RFC 2104 §3 advises a key at least as long as the hash output).
    """
    if environ is not None:
        value = environ.get(KEY_ENV, "").strip()
    else:
        secret_value = current().signing_key
        value = secret_value.get_secret_value().strip() if secret_value is not None else ""
    if not value:
        return None
    try:
        secret = bytes.fromhex(value)
    except ValueError:
        raise SigningKeyError(f"${KEY_ENV} must be hex (e.g. `openssl rand -hex 32`); "
                              f"it has {len(value)} characters that are not all hex digits") from None
    if len(secret) < MIN_KEY_BYTES:
        raise SigningKeyError(f"${KEY_ENV} holds {len(secret)} bytes; use at least {MIN_KEY_BYTES} "
                              f"({2 * MIN_KEY_BYTES} hex characters, RFC 2104 §3), e.g. `openssl rand -hex 32`")
    return SigningKey(secret)


def signing_record(key: SigningKey | None) -> dict[str, str]:
    """What ``step.json`` records under ``signing``: signed (algorithm, key id) or unsigned."""
    if key is None:
        return {"status": "unsigned", "reason": f"no ${KEY_ENV} (nor Airflow connection tidal_signing)"}
    return {"status": "signed", "algorithm": ALGORITHM, "key_id": key.key_id}


def signature_doc(key: SigningKey, files: Mapping[str, bytes]) -> dict[str, Any]:
    """The ``signature.json`` document over ``files`` (name -> exact bytes)."""
    return {"algorithm": ALGORITHM, "key_id": key.key_id,
            "files": {name: key.sign(data) for name, data in sorted(files.items())}}


def write_signature(step_dir: Path, key: SigningKey, files: tuple[str, ...] = SIGNED_FILES) -> dict[str, Any]:
    """Sign ``files`` (exact bytes) in ``step_dir`` and write ``signature.json``; returns it."""
    doc = signature_doc(key, {name: (step_dir / name).read_bytes() for name in files})
    (step_dir / SIGNATURE_JSON).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return doc


def check_signature(doc: Mapping[str, Any], read: Callable[[str], bytes], key: SigningKey,
                    files: tuple[str, ...] = SIGNED_FILES) -> list[tuple[str, str, str]]:
    """Recompute each file's HMAC and compare in constant time (:func:`hmac.compare_digest`).

    Args:
        doc: the parsed ``signature.json``.
        read: file name -> exact bytes (a local path or an object-store reader).
        key: the key whose id ``doc`` names (the caller checks the id).

    Returns:
        ``(file, expected, got)`` for every file whose HMAC differs or that the
        signature does not cover; empty when all match.
    """
    signed = doc.get("files") or {}
    problems = []
    for name in files:
        expected = signed.get(name)
        got = key.sign(read(name))
        if not isinstance(expected, str):
            problems.append((name, "an HMAC in signature.json", "none recorded"))
        elif not hmac.compare_digest(expected, got):
            problems.append((name, expected, got))
    return problems
