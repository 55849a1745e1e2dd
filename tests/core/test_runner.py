"""The commit protocol: _SUCCESS last, crashed attempts never count, reruns complete them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO
from tidal.core.runner import StepBlocked, run_step
from tidal.integrity.hashing import verify_manifest
from tidal.kinds import KINDS, KindSpec
from tidal.steps import Step
from tidal.storage import SCRATCH, LocalStorage, StorageSettings


@pytest.fixture(autouse=True)
def fixture_kind(monkeypatch):
    monkeypatch.setitem(KINDS, "fixture", KindSpec("tests.fixture_kind", 1))


def make_step(**config) -> Step:
    return Step("writer", "fixture", {"parts": 3, "pause_s": 0.0, "fail_at": None, **config})


def test_commit_writes_manifest_step_json_and_success(tmp_path):
    storage = LocalStorage(tmp_path)
    step = make_step()
    result = run_step(step, storage)
    out = storage.step_dir(step.step_id)
    assert result.status == "run" and storage.is_committed(step.step_id)
    manifest = json.loads((out / "manifest.json").read_text())
    assert [f["path"] for f in manifest["files"]] == ["part-0.txt", "part-1.txt", "part-2.txt"]
    assert verify_manifest(out, manifest) == []
    record = json.loads((out / "step.json").read_text())
    assert record["step_id"] == step.step_id and record["summary"] == {"parts": 3}
    assert record["hash_input"]["config"]["parts"] == 3
    assert {"git_sha", "environment", "started_at", "ended_at"} <= set(record["provenance"])
    assert (out / "_SUCCESS").read_text().strip() == manifest["root_hash"]
    assert list((tmp_path / SCRATCH).iterdir()) == []


def test_committed_step_is_skipped_fast(tmp_path):
    storage = LocalStorage(tmp_path)
    step = make_step()
    run_step(step, storage)
    mtime = (storage.step_dir(step.step_id) / "part-0.txt").stat().st_mtime_ns
    again = run_step(step, storage)
    assert again.status == "skip" and again.summary == {"parts": 3}
    assert again.seconds < 0.05
    assert (storage.step_dir(step.step_id) / "part-0.txt").stat().st_mtime_ns == mtime


def test_failed_step_leaves_nothing_committed(tmp_path):
    storage = LocalStorage(tmp_path)
    step = make_step(fail_at=1)
    with pytest.raises(RuntimeError, match="injected failure at part 1"):
        run_step(step, storage)
    assert not storage.is_committed(step.step_id)
    assert not storage.step_dir(step.step_id).exists()
    [kept] = storage.failed_attempts(step.step_id)
    assert kept.startswith(".failed/") and kept.endswith("/")
    assert storage.read_object(kept + "part-0.txt") is not None and storage.read_object(kept + "_SUCCESS") is None


def test_commit_clears_failed_attempts_and_forced_copies(tmp_path, monkeypatch):
    storage = LocalStorage(tmp_path)
    failing = make_step()
    monkeypatch.setenv("TIDAL_FIXTURE_FAIL_AT", "1")
    with pytest.raises(RuntimeError):
        run_step(failing, storage)
    assert storage.failed_attempts(failing.step_id)
    monkeypatch.delenv("TIDAL_FIXTURE_FAIL_AT")  # the fault was in the environment: fixed
    run_step(failing, storage)
    assert storage.is_committed(failing.step_id) and storage.failed_attempts(failing.step_id) == []
    run_step(failing, storage, force=True)
    assert list((tmp_path / SCRATCH).glob("*.discarded.*")) == []


def test_blocked_when_input_missing(tmp_path):
    upstream = make_step()
    downstream = Step("reader", "fixture", {"parts": 1}, inputs=(upstream,))
    with pytest.raises(StepBlocked, match=upstream.step_id):
        run_step(downstream, LocalStorage(tmp_path))


def test_killed_step_is_not_committed_and_rerun_completes(tmp_path):
    """SIGKILL the step mid-write; nothing counts as committed; a rerun commits it."""
    step = make_step(parts=20, pause_s=0.05)
    script = (
        "import sys; from pathlib import Path\n"
        "from tidal.kinds import KINDS, KindSpec\n"
        "KINDS['fixture'] = KindSpec('tests.fixture_kind', 1)\n"
        "from tidal.core.runner import run_step; from tidal.steps import Step\n"
        "from tidal.storage import LocalStorage, StorageSettings\n"
        f"step = Step('writer', 'fixture', {dict(step.config)!r})\n"
        f"run_step(step, LocalStorage(Path({str(tmp_path)!r}), StorageSettings(lease_ttl_s=1.0)))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    scratch = tmp_path / SCRATCH
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        parts = list(scratch.glob("*/part-5.txt")) if scratch.exists() else []
        if parts:
            break
        time.sleep(0.02)
    else:
        proc.kill()
        pytest.fail("the step never started writing")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    storage = LocalStorage(tmp_path, StorageSettings(lease_ttl_s=1.0))  # its lease expires after 1 s
    assert not storage.is_committed(step.step_id)
    assert not storage.step_dir(step.step_id).exists()
    result = run_step(step, storage)
    assert result.status == "run" and storage.is_committed(step.step_id)
    assert len(list(storage.step_dir(step.step_id).glob("part-*.txt"))) == 20
    assert list(scratch.iterdir()) == []  # the killed attempt's scratch was cleared


def test_a_failed_forced_attempt_keeps_the_committed_output_and_its_descendants(tmp_path, monkeypatch):
    """Issue 22, item 7: --force used to delete the committed output before the new attempt; when the
    attempt failed, the step's descendants stayed committed on an input that no longer existed."""
    from tidal.audit.verify import verify_step

    storage = LocalStorage(tmp_path)
    upstream = make_step(parts=3)
    downstream = Step("reader", "fixture", {"parts": 1}, inputs=(upstream,))
    run_step(upstream, storage)
    run_step(downstream, storage)
    before = {p.name: p.read_bytes() for p in storage.step_dir(upstream.step_id).iterdir()}
    monkeypatch.setenv("TIDAL_FIXTURE_FAIL_AT", "1")
    with pytest.raises(RuntimeError, match="injected failure at part 1"):
        run_step(upstream, storage, force=True)
    # the old output is still committed, byte for byte, and so is what was computed from it
    assert storage.is_committed(upstream.step_id) and storage.is_committed(downstream.step_id)
    assert {p.name: p.read_bytes() for p in storage.step_dir(upstream.step_id).iterdir()} == before
    assert verify_step(storage.step_dir(upstream.step_id), upstream.step_id).ok
    assert len(storage.failed_attempts(upstream.step_id)) == 1  # the failed forced attempt, for inspection
    monkeypatch.delenv("TIDAL_FIXTURE_FAIL_AT")
    result = run_step(upstream, storage, force=True)
    assert result.status == "run" and storage.is_committed(upstream.step_id)
    assert verify_step(storage.step_dir(upstream.step_id), upstream.step_id).ok
    assert list((tmp_path / SCRATCH).glob("*.discarded.*")) == [] and storage.failed_attempts(upstream.step_id) == []


def test_force_recomputes(tmp_path):
    storage = LocalStorage(tmp_path)
    step = make_step()
    run_step(step, storage)
    assert run_step(step, storage, force=True).status == "run"
    assert storage.is_committed(step.step_id)


def test_a_hand_edited_committed_input_is_refused_before_the_step_runs(tmp_path, monkeypatch):
    """Issue 22, item 2: a dependent step used to read a hand-edited committed input (and commit on it,
    "signature valid"). Now the input is checked against its manifest first, by content, at every run."""
    from tidal.core.inputs import InputMismatch, verify_inputs

    storage = LocalStorage(tmp_path)
    upstream = make_step(parts=3)
    downstream = Step("reader", "fixture", {"parts": 1}, inputs=(upstream,))
    run_step(upstream, storage)
    part = storage.step_dir(upstream.step_id) / "part-1.txt"
    original = part.read_bytes()
    part.write_bytes(original.replace(b"part", b"PART"))
    with pytest.raises(InputMismatch, match=r"part-1.txt: sha256 differs from manifest.*--force writer"):
        run_step(downstream, storage)
    assert not storage.is_committed(downstream.step_id)
    part.write_bytes(original)
    assert run_step(downstream, storage).status == "run"
    # issue 43, item 4: after a successful run the same edit is refused again (no cache to hide it), and
    # a forced rerun of the dependent, which reads the input again, refuses it too
    part.write_bytes(original.replace(b"part", b"PART"))
    with pytest.raises(InputMismatch, match=r"part-1.txt: sha256 differs from manifest"):
        verify_inputs(downstream, storage)
    with pytest.raises(InputMismatch, match=r"part-1.txt"):
        run_step(downstream, storage, force=True)


def test_a_resigned_input_is_refused_when_a_key_is_configured(tmp_path, monkeypatch):
    """With a signing key, an input whose manifest and files were edited consistently (so the hashes
    match) is still refused: its signature no longer verifies."""
    import json

    from tidal.core.inputs import InputMismatch, verify_inputs
    from tidal.integrity.hashing import write_manifest

    monkeypatch.setenv("TIDAL_SIGNING_KEY", "ab" * 32)
    storage = LocalStorage(tmp_path)
    upstream = make_step(parts=2)
    downstream = Step("reader", "fixture", {"parts": 1}, inputs=(upstream,))
    run_step(upstream, storage)
    folder = storage.step_dir(upstream.step_id)
    (folder / "part-0.txt").write_text("forged\n")
    manifest = write_manifest(folder, exclude=("step.json", "_SUCCESS", "signature.json"))
    (folder / "_SUCCESS").write_text(manifest["root_hash"] + "\n")
    assert json.loads((folder / "manifest.json").read_text())["root_hash"] == manifest["root_hash"]
    with pytest.raises(InputMismatch, match="manifest.json: HMAC differs from signature.json"):
        verify_inputs(downstream, storage)


@pytest.mark.parametrize("change", ["unsigned", "another key"])
def test_an_input_unsigned_or_signed_with_another_key_is_refused_when_a_key_is_configured(
        tmp_path, monkeypatch, change):
    """Issue 43, item 4: `tidal verify` requires a signature with the configured key; so does a dependent."""
    from tidal.core.inputs import InputMismatch

    storage = LocalStorage(tmp_path)
    upstream = make_step(parts=2)
    downstream = Step("reader", "fixture", {"parts": 1}, inputs=(upstream,))
    monkeypatch.setenv("TIDAL_SIGNING_KEY", ("cd" if change == "another key" else "") * 32)
    run_step(upstream, storage)  # unsigned (no key), or signed with key cd…
    monkeypatch.setenv("TIDAL_SIGNING_KEY", "ab" * 32)
    rule = "unsigned .no signature.json" if change == "unsigned" else "signature.json names key"
    with pytest.raises(InputMismatch, match=rule):
        run_step(downstream, storage)
    assert not storage.is_committed(downstream.step_id)
    monkeypatch.setenv("TIDAL_SIGNING_KEY", ("cd" if change == "another key" else "") * 32)
    assert run_step(downstream, storage).status == "run"  # under the key it was committed with, it runs
