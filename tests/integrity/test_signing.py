"""HMAC-SHA256 signing of step.json and manifest.json: key handling and what a commit writes."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest

from tidal.core.runner import run_step
from tidal.integrity.signing import KEY_ENV, SIGNATURE_JSON, SigningKey, SigningKeyError, load_key
from tidal.kinds import KINDS, KindSpec
from tidal.steps import Step
from tidal.storage import LocalStorage

KEY_HEX = "00112233445566778899aabbccddeeff" * 2  # 32 bytes


@pytest.fixture(autouse=True)
def fixture_kind(monkeypatch):
    monkeypatch.setitem(KINDS, "fixture", KindSpec("tests.fixture_kind", 1))
    monkeypatch.delenv(KEY_ENV, raising=False)


def make_step(parts: int = 3) -> Step:
    return Step("writer", "fixture", {"parts": parts, "pause_s": 0.0, "fail_at": None})


def test_key_is_hex_of_at_least_32_bytes():
    key = load_key({KEY_ENV: KEY_HEX})
    assert key.secret == bytes.fromhex(KEY_HEX)
    assert key.key_id == hashlib.sha256(bytes.fromhex(KEY_HEX)).hexdigest()[:16]
    assert KEY_HEX not in repr(key) and KEY_HEX[:16] not in repr(key)
    assert load_key({}) is None and load_key({KEY_ENV: "  "}) is None
    with pytest.raises(SigningKeyError, match="at least 32"):
        load_key({KEY_ENV: "ab" * 31})
    with pytest.raises(SigningKeyError, match="must be hex") as err:
        load_key({KEY_ENV: "zz" * 32})
    assert "zz" not in str(err.value)  # the message never echoes the key


def test_signed_commit_writes_detached_hmacs_before_success(tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY_HEX)
    storage = LocalStorage(tmp_path)
    step = make_step()
    run_step(step, storage)
    out = storage.step_dir(step.step_id)
    record = json.loads((out / "step.json").read_text())
    key = SigningKey(bytes.fromhex(KEY_HEX))
    assert record["signing"] == {"status": "signed", "algorithm": "HMAC-SHA256", "key_id": key.key_id}
    doc = json.loads((out / SIGNATURE_JSON).read_text())
    assert doc["key_id"] == key.key_id and doc["algorithm"] == "HMAC-SHA256"
    for name in ("manifest.json", "step.json"):  # HMAC over the exact bytes, recomputed independently
        want = hmac.new(bytes.fromhex(KEY_HEX), (out / name).read_bytes(), hashlib.sha256).hexdigest()
        assert doc["files"][name] == want
    manifest = json.loads((out / "manifest.json").read_text())
    assert SIGNATURE_JSON not in [f["path"] for f in manifest["files"]]  # commit files are not outputs
    assert (out / "signature.json").stat().st_mtime_ns <= (out / "_SUCCESS").stat().st_mtime_ns


def test_without_a_key_the_step_is_committed_unsigned(tmp_path):
    storage = LocalStorage(tmp_path)
    step = make_step()
    run_step(step, storage)
    out = storage.step_dir(step.step_id)
    record = json.loads((out / "step.json").read_text())
    assert storage.is_committed(step.step_id)
    assert record["signing"]["status"] == "unsigned" and KEY_ENV in record["signing"]["reason"]
    assert not (out / SIGNATURE_JSON).exists()


def test_step_json_records_the_environment_fingerprint(tmp_path):
    import platform

    storage = LocalStorage(tmp_path)
    step = make_step()
    run_step(step, storage)
    env = json.loads((storage.step_dir(step.step_id) / "step.json").read_text())["environment"]
    assert env["python"] == platform.python_version() and env["machine"] == platform.machine()
    assert "numpy" in env["packages"]


def test_a_malformed_key_commits_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "not-a-hex-key")
    storage = LocalStorage(tmp_path)
    step = make_step()
    with pytest.raises(SigningKeyError):
        run_step(step, storage)
    assert not storage.is_committed(step.step_id)


def test_the_key_never_changes_a_step_id(tmp_path, monkeypatch):
    storage = LocalStorage(tmp_path)
    unsigned = make_step()
    run_step(unsigned, storage)
    monkeypatch.setenv(KEY_ENV, KEY_HEX)
    signed = make_step()
    assert signed.step_id == unsigned.step_id
    assert run_step(signed, storage).status == "skip"


def test_airflow_connection_tidal_signing_exports_the_key(tmp_path):
    """operators/step.py reads the connection (here from AIRFLOW_CONN_TIDAL_SIGNING, Airflow's env
    secrets backend) and exports it for tidal's commit; an exported variable is never overwritten."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    probe = (
        "import os\n"
        "from operators.step import export_signing_key\n"
        "print(export_signing_key(), os.environ.get('TIDAL_SIGNING_KEY'))\n"
        "print(export_signing_key())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != KEY_ENV}
    env["AIRFLOW_CONN_TIDAL_SIGNING"] = json.dumps({"conn_type": "generic", "password": KEY_HEX})
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout.split("\n")
    assert out[0] == f"True {KEY_HEX}" and out[1] == "False"
