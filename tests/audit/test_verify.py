"""`tidal verify`: one flipped byte anywhere, a missing or an extra file, is caught and named."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from tests.files.conftest import upload  # noqa: F401 - fixture used here
from tests.storage.conftest import bucket, moto_server, s3_env  # noqa: F401 - fixtures used here
from tidal.audit.verify import step_files, verify_step, verify_steps
from tidal.cli import main
from tidal.core.runner import run_step
from tidal.files.step_files import StepFiles, bytes_fetched
from tidal.integrity.signing import KEY_ENV, SigningKey
from tidal.kinds import KINDS, KindSpec
from tidal.steps import Step
from tidal.storage import LocalStorage, open_storage

KEY_HEX = "a5" * 32
OTHER_HEX = "5a" * 32


@pytest.fixture(autouse=True)
def fixture_kind(monkeypatch):
    monkeypatch.setitem(KINDS, "fixture", KindSpec("tests.fixture_kind", 1))
    monkeypatch.delenv(KEY_ENV, raising=False)


@pytest.fixture
def signed_step(tmp_path, monkeypatch):
    """A committed, signed step (three data files) and a pristine copy of it."""
    monkeypatch.setenv(KEY_ENV, KEY_HEX)
    storage = LocalStorage(tmp_path / "root")
    step = Step("writer", "fixture", {"parts": 3, "pause_s": 0.0, "fail_at": None})
    run_step(step, storage)
    monkeypatch.delenv(KEY_ENV)
    out = storage.step_dir(step.step_id)
    pristine = tmp_path / "pristine"
    shutil.copytree(out, pristine)
    return out, pristine, step.step_id


KEY = SigningKey(bytes.fromhex(KEY_HEX))


def check(out, step_id, key=KEY, require=False):
    """Verify ``out``: a step directory, a bucket URI or a :class:`StepFiles`."""
    return verify_step(out, step_id, key, require)


def flip(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_an_intact_signed_step_verifies(signed_step):
    out, _, step_id = signed_step
    result = check(out, step_id)
    assert result.ok and result.signature == "valid", result.mismatches
    assert result.files == 3 and result.bytes == sum((out / f"part-{i}.txt").stat().st_size for i in range(3))


@pytest.mark.parametrize("name", ["part-1.txt", "manifest.json", "step.json", "signature.json", "_SUCCESS"])
def test_one_flipped_byte_anywhere_is_caught(signed_step, name):
    """Each byte of the file in turn: a data file, manifest.json, step.json, signature.json, _SUCCESS."""
    out, pristine, step_id = signed_step
    size = (out / name).stat().st_size
    offsets = range(size)
    for offset in offsets:
        flip(out / name, offset)
        result = check(out, step_id)
        assert not result.ok, f"{name} byte {offset} flipped but verify passed"
        assert any(m.file.startswith(name) or name == "signature.json" for m in result.mismatches), result.mismatches
        shutil.copy2(pristine / name, out / name)
    assert check(out, step_id).ok


def test_a_flipped_data_byte_is_reported_with_expected_and_got(signed_step):
    out, pristine, step_id = signed_step
    flip(out / "part-2.txt", 0)
    [mismatch] = check(out, step_id).mismatches
    manifest = json.loads((pristine / "manifest.json").read_text())
    want = next(f["sha256"] for f in manifest["files"] if f["path"] == "part-2.txt")
    assert mismatch.file == "part-2.txt" and mismatch.expected == f"sha256 {want}"
    assert mismatch.got.startswith("sha256 ") and mismatch.got != mismatch.expected


def test_missing_and_extra_files_are_caught(signed_step):
    out, _, step_id = signed_step
    (out / "part-0.txt").unlink()
    (out / "nested").mkdir()
    (out / "nested" / "extra.bin").write_bytes(b"not in the manifest")
    result = check(out, step_id)
    got = {m.file: m.got for m in result.mismatches}
    assert got["part-0.txt"] == "missing" and got["nested/extra.bin"].startswith("sha256 ")
    assert len(result.mismatches) == 2


def test_signature_file_removed_or_step_relabelled_unsigned_is_caught(signed_step):
    out, pristine, step_id = signed_step
    (out / "signature.json").unlink()
    assert [m.file for m in check(out, step_id).mismatches] == ["signature.json"]
    shutil.copy2(pristine / "signature.json", out / "signature.json")
    record = json.loads((out / "step.json").read_text())
    record["signing"] = {"status": "unsigned"}  # a forger without the key
    (out / "step.json").write_text(json.dumps(record))
    assert not check(out, step_id).ok


def test_signatures_that_cannot_be_checked_fail_only_when_required(signed_step):
    out, _, step_id = signed_step
    assert check(out, step_id, key=None).signature == "unchecked (no key)"
    assert check(out, step_id, key=None).ok and not check(out, step_id, key=None, require=True).ok
    other = check(out, step_id, key=SigningKey(bytes.fromhex(OTHER_HEX)))
    assert other.ok and other.signature.startswith("unchecked (signed with key")


def test_unsigned_step_passes_unless_a_signature_is_required(tmp_path):
    storage = LocalStorage(tmp_path)
    step = Step("writer", "fixture", {"parts": 2, "pause_s": 0.0, "fail_at": None})
    run_step(step, storage)
    out = storage.step_dir(step.step_id)
    assert check(out, step.step_id).signature == "unsigned" and check(out, step.step_id).ok
    [mismatch] = check(out, step.step_id, require=True).mismatches
    assert mismatch.got == "unsigned"


def test_a_step_moved_under_another_id_is_caught(signed_step):
    out, _, _ = signed_step
    moved = out.parent / "writer-000000000000"
    out.rename(moved)
    files = {m.file for m in check(moved, "writer-000000000000").mismatches}
    assert "step.json step_id" in files and "step.json hash_input" in files


def test_cli_exit_codes(signed_step, capsys, monkeypatch):
    out, _, step_id = signed_step
    monkeypatch.setenv(KEY_ENV, KEY_HEX)
    assert main(["verify", str(out), "--require-signature"]) == 0
    assert "signature valid" in capsys.readouterr().out
    assert main(["verify", step_id, "--storage-root", str(out.parent), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"][0]["ok"] is True
    flip(out / "part-0.txt", 3)
    assert main(["verify", str(out)]) == 1
    text = capsys.readouterr().out
    assert "FAIL" in text and "part-0.txt: expected sha256" in text
    assert main(["verify", "no-such-step", "--storage-root", str(out.parent)]) == 2
    assert "not a recipe file, a step directory, a step id" in capsys.readouterr().err
    monkeypatch.delenv("TIDAL_STORAGE_ROOT", raising=False)
    assert main(["verify", "writer-abc"]) == 2


def test_with_a_key_configured_verify_fails_foreign_and_stripped_signatures(signed_step, capsys, monkeypatch):
    """Issue 22, item 3: with the key configured, a step re-signed with another key and one stripped to
    unsigned (signature.json removed too) exited 0 unless --require-signature was given."""
    out, _, _ = signed_step
    monkeypatch.setenv(KEY_ENV, KEY_HEX)
    assert main(["verify", str(out)]) == 0
    capsys.readouterr()
    record = json.loads((out / "step.json").read_text())
    foreign = json.loads((out / "signature.json").read_text()) | {"key_id": "0123456789abcdef"}
    (out / "signature.json").write_text(json.dumps(foreign))
    (out / "step.json").write_text(json.dumps(record | {"signing": record["signing"] | {"key_id": "0123456789abcdef"}}))
    assert main(["verify", str(out)]) == 1
    assert "unchecked (signed with key 0123456789abcdef" in capsys.readouterr().out
    (out / "signature.json").unlink()
    (out / "step.json").write_text(json.dumps(record | {"signing": {"status": "unsigned"}}))
    assert main(["verify", str(out)]) == 1
    assert "--allow-unsigned accepts unsigned steps" in capsys.readouterr().out
    assert main(["verify", str(out), "--allow-unsigned"]) == 0  # asked for explicitly
    monkeypatch.delenv(KEY_ENV)
    assert main(["verify", str(out)]) == 0 and main(["verify", str(out), "--require-signature"]) == 1


def test_an_s3_step_is_verified_object_by_object(s3_env, bucket, tmp_path, monkeypatch, capsys):  # noqa: F811
    """A signed step committed to a real S3 server (moto on loopback), verified from the bucket
    alone: no local copy is read or made, and tampering with objects is caught."""
    import boto3

    monkeypatch.setenv(KEY_ENV, KEY_HEX)
    client = boto3.client("s3", endpoint_url=s3_env.endpoint, region_name="us-east-1")
    storage = open_storage(f"s3://{bucket}/root")
    step = Step("writer", "fixture", {"parts": 3, "pause_s": 0.0, "fail_at": None})
    run_step(step, storage)
    cache = tmp_path / "cache"
    shutil.rmtree(cache, ignore_errors=True)  # a machine that shares only the bucket
    files = step_files(storage, step.step_id)
    assert isinstance(files, StepFiles) and files.remote
    result = check(files, step.step_id)
    assert result.ok and result.signature == "valid" and result.files == 3, result.mismatches
    assert result.location == storage.step_uri(step.step_id)
    assert main(["verify", step.step_id, "--storage-root", f"s3://{bucket}/root", "--require-signature"]) == 0
    capsys.readouterr()

    key = f"root/{step.step_id}/part-1.txt"
    body = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    body[0] ^= 0x01
    client.put_object(Bucket=bucket, Key=key, Body=bytes(body))
    client.delete_object(Bucket=bucket, Key=f"root/{step.step_id}/part-2.txt")
    client.put_object(Bucket=bucket, Key=f"root/{step.step_id}/extra.txt", Body=b"x")
    got = {m.file: m.got for m in check(files, step.step_id).mismatches}  # the same object: listed afresh
    assert got["part-1.txt"].startswith("sha256 ") and got["part-2.txt"] == "missing" and "extra.txt" in got
    assert main(["verify", step.step_id, "--storage-root", f"s3://{bucket}/root"]) == 1
    assert f"FAIL {step.step_id}" in capsys.readouterr().out
    assert not cache.exists(), "verify wrote a local copy"


def tamper(upload, key: str, offset: int) -> None:  # noqa: F811 - the fixture's helper
    """Flip one bit of byte ``offset`` of object ``key`` in the bucket."""
    data = bytearray(upload.client.get_object(Bucket=upload.bucket, Key=key)["Body"].read())
    data[offset] ^= 0x01
    upload.client.put_object(Bucket=upload.bucket, Key=key, Body=bytes(data))


def test_an_uploaded_step_is_hashed_in_chunks_from_the_bucket(signed_step, upload, monkeypatch):  # noqa: F811
    """A step uploaded to moto verifies from the bucket, streamed in small chunks (every byte fetched
    once, ``bytes`` = what was hashed); one byte changed in the bucket is a mismatch naming the file,
    and a damaged manifest.json is reported, not raised."""
    import tidal.files.step_files
    out, _, step_id = signed_step
    uri = upload(out, step_id)
    monkeypatch.setattr(tidal.files.step_files, "COPY_CHUNK_BYTES", 5)  # several ranged GETs per file
    data_bytes = sum((out / f"part-{i}.txt").stat().st_size for i in range(3))
    before = bytes_fetched()
    result = check(uri, step_id)
    assert result.ok and result.signature == "valid", result.mismatches
    assert result.location == uri and result.files == 3 and result.bytes == data_bytes
    size = {name: (out / name).stat().st_size for name in ("manifest.json", "step.json", "signature.json", "_SUCCESS")}
    hmac_reread = size["manifest.json"] + size["step.json"]
    assert bytes_fetched() - before == data_bytes + sum(size.values()) + hmac_reread
    [ok] = verify_steps(open_storage(f"s3://{upload.bucket}/root"), [step_id], KEY)
    assert ok.ok and ok.as_dict()["bytes"] == data_bytes

    tamper(upload, f"root/{step_id}/part-1.txt", 2)
    [mismatch] = check(uri, step_id).mismatches
    assert mismatch.file == "part-1.txt" and mismatch.expected.startswith("sha256 ")
    assert mismatch.got.startswith("sha256 ") and mismatch.got != mismatch.expected

    tamper(upload, f"root/{step_id}/manifest.json", 0)  # no longer JSON
    files = {m.file for m in check(uri, step_id).mismatches}
    assert "manifest.json" in files and "manifest.json HMAC" in files


def test_a_local_step_is_hashed_in_chunks_in_place(signed_step, monkeypatch):
    """On a local root the files are hashed where they are, in chunks, and nothing is fetched."""
    import tidal.files.step_files
    out, _, step_id = signed_step
    monkeypatch.setattr(tidal.files.step_files, "LOCAL_HASH_CHUNK_BYTES", 3)
    before = bytes_fetched()
    result = check(out, step_id)
    assert result.ok and result.location == str(out) and bytes_fetched() == before
    data = (out / "part-0.txt").read_bytes()
    assert StepFiles.open(out).sha256("part-0.txt") == (hashlib.sha256(data).hexdigest(), len(data))
