"""File sources pinned by content: fetch's snapshot_sha256, files.json, the pin in the step id."""

from __future__ import annotations

import gzip
import hashlib
import json
import subprocess
import sys

import pytest

from tests.data.test_recipe_data import with_source
from tidal.context import StepContext
from tidal.core.planner import build_graph
from tidal.data import fetch
from tidal.recipe import RecipeError, parse_recipe


def corpus(root):
    (root / "part").mkdir(parents=True)
    (root / "a.jsonl").write_bytes(b'{"text": "one"}\n{broken\n{"text": "two"}\n')
    (root / "part" / "b10.jsonl.gz").write_bytes(gzip.compress(b'{"text": "three"}\n'))
    (root / "part" / "b2.jsonl").write_bytes(b'{"text": "four"}\n')
    return root


def expected_snapshot(root) -> str:
    """sha256sum of the files in read (natural) order, piped into sha256sum: computed apart from tidal."""
    lines = subprocess.run(["sha256sum", "a.jsonl", "part/b2.jsonl", "part/b10.jsonl.gz"], cwd=root,
                           capture_output=True, check=True).stdout
    return hashlib.sha256(lines).hexdigest()


def run_fetch(tmp_path, root, name, **extra):
    out = tmp_path / name
    out.mkdir()
    config = {"source": "web", "format": "jsonl", "path": str(root), "text_field": "text", **extra}
    return fetch.run(StepContext("fetch-web-1", "fetch-web", "fetch", config, out)), out


def test_fetch_records_the_snapshot_of_the_files_it_read(tmp_path):
    root = corpus(tmp_path / "web")
    summary, out = run_fetch(tmp_path, root, "unpinned")
    want = expected_snapshot(root)
    assert summary["snapshot_sha256"] == want
    files = json.loads((out / fetch.FILES_FILE).read_text())
    assert files["snapshot_sha256"] == want
    assert [(f["name"], f["bytes"]) for f in files["files"]] == [
        (rel, (root / rel).stat().st_size) for rel in ("a.jsonl", "part/b2.jsonl", "part/b10.jsonl.gz")]
    assert files["files"][0]["sha256"] == hashlib.sha256((root / "a.jsonl").read_bytes()).hexdigest()
    # pinned with the right value: the same raw.parquet bytes
    pinned, pinned_out = run_fetch(tmp_path, root, "pinned", snapshot_sha256=want)
    assert pinned["documents"] == summary["documents"] == 5
    assert (pinned_out / fetch.RAW_FILE).read_bytes() == (out / fetch.RAW_FILE).read_bytes()


def test_a_changed_file_fails_a_pinned_fetch_before_writing(tmp_path):
    root = corpus(tmp_path / "web")
    want = expected_snapshot(root)
    (root / "part" / "b2.jsonl").write_bytes(b'{"text": "four, edited"}\n')
    with pytest.raises(ValueError, match="changed since the recipe pinned them") as err:
        run_fetch(tmp_path, root, "changed", snapshot_sha256=want)
    assert want in str(err.value) and expected_snapshot(root) in str(err.value)
    assert str(root) in str(err.value) and "sources.web.snapshot_sha256" in str(err.value)
    assert list((tmp_path / "changed").iterdir()) == []  # neither raw.parquet nor files.json


def fetch_step(tiny_data, **source):
    return build_graph(parse_recipe(with_source(tiny_data, "web", {"format": "jsonl", "licence": "CC0-1.0",
                                                                   **source})))["fetch-web"]


def test_a_file_source_id_follows_its_content_not_its_pin_or_place(tiny_data, tmp_path):
    """Issue 21 item 13: pinning the value the plan hashed keeps the id, and so does moving the
    pinned (or unpinned) files; one changed byte changes it. An unpinned s3:// source, which
    the planner cannot hash, is addressed by its path."""
    root = corpus(tmp_path / "web")
    want = expected_snapshot(root)
    unpinned = fetch_step(tiny_data, path=str(root))
    assert unpinned.config["snapshot_sha256"] == want  # hashed when planned, as sha256sum would
    assert "path" not in unpinned.hash_input["config"]
    assert fetch_step(tiny_data, path=str(root), snapshot_sha256=want).step_id == unpinned.step_id
    (tmp_path / "elsewhere").mkdir()
    moved = root.rename(tmp_path / "elsewhere" / "web")
    assert fetch_step(tiny_data, path=str(moved)).step_id == unpinned.step_id
    assert fetch_step(tiny_data, path="s3://corpora/web/", snapshot_sha256=want).step_id == unpinned.step_id
    data = (moved / "part" / "b2.jsonl").read_bytes()
    (moved / "part" / "b2.jsonl").write_bytes(data[:-3] + b"X" + data[-2:])  # one byte
    changed = fetch_step(tiny_data, path=str(moved))
    assert changed.config["snapshot_sha256"] == expected_snapshot(moved) != want
    assert changed.step_id != unpinned.step_id
    assert fetch_step(tiny_data, path=str(moved), snapshot_sha256="b" * 64).step_id not in (
        changed.step_id, unpinned.step_id)
    s3 = [fetch_step(tiny_data, path=f"s3://corpora/{name}/") for name in ("web", "other")]
    assert "snapshot_sha256" not in s3[0].config and s3[0].step_id != s3[1].step_id
    with pytest.raises(RecipeError, match="no `path` or `snapshot_sha256`"):
        parse_recipe(with_source(tiny_data, "brown2", {**tiny_data["sources"]["brown"], "snapshot_sha256": "a" * 64}))
    with pytest.raises(RecipeError, match="snapshot_sha256"):
        parse_recipe(with_source(tiny_data, "web", {"format": "jsonl", "path": str(moved), "licence": "CC0-1.0",
                                                    "snapshot_sha256": "not-a-hash"}))


def test_a_capped_fetch_accepts_the_pin_the_plan_printed(tmp_path):
    """With max_documents the plan's value (every file) is accepted as well as the hash of the
    files read, and a change to a file the cap never reached still fails the pinned fetch."""
    root = corpus(tmp_path / "web")
    want = expected_snapshot(root)
    summary, _ = run_fetch(tmp_path, root, "capped", max_documents=1, snapshot_sha256=want)
    assert summary["documents"] == 1 and summary["snapshot_sha256"] != want  # the files read: a.jsonl
    (root / "part" / "b2.jsonl").write_bytes(b'{"text": "four, edited"}\n')
    with pytest.raises(ValueError, match="changed since the recipe pinned them"):
        run_fetch(tmp_path, root, "capped-changed", max_documents=1, snapshot_sha256=want)


def test_plan_notes_an_unpinned_file_source(tiny_data, tmp_path):
    import yaml

    want = expected_snapshot(corpus(tmp_path / "web"))
    recipe = tmp_path / "web.yaml"
    recipe.write_text(yaml.safe_dump(with_source(tiny_data, "web", {"format": "jsonl", "path": str(tmp_path / "web"),
                                                                    "licence": "CC0-1.0"})))
    plan = subprocess.run([sys.executable, "-m", "tidal", "plan", str(recipe), "--storage-root", str(tmp_path / "s")],
                          capture_output=True, text=True, check=False)
    assert plan.returncode == 0, plan.stderr[-2000:]
    assert "note: source web reads" in plan.stdout and "unpinned" in plan.stdout
    assert f"pin sources.web.snapshot_sha256: {want} to keep this id" in plan.stdout
    assert "note: source brown" not in plan.stdout  # archive sources are pinned by their sha256


def test_tidal_run_with_a_wrong_pin_fails_fetch_with_one_error_line(tiny_data, tmp_path, monkeypatch):
    """Issue 43, item 7: a wrong snapshot_sha256 was a 31-line traceback and no ``error:`` line."""
    import yaml

    corpus(tmp_path / "web")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    recipe = tmp_path / "web.yaml"
    recipe.write_text(yaml.safe_dump(with_source(tiny_data, "web", {
        "format": "jsonl", "path": str(tmp_path / "web"), "licence": "CC0-1.0", "snapshot_sha256": "a" * 64})))
    run = subprocess.run([sys.executable, "-m", "tidal", "run", str(recipe), "--step", "fetch-web",
                          "--storage-root", str(tmp_path / "s")], capture_output=True, text=True, check=False,
                         timeout=300)
    assert run.returncode == 1, run.stderr[-3000:]
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "changed since the recipe pinned them" in errors[0], run.stderr[-3000:]
    assert "sources.web.snapshot_sha256" in errors[0] and "Traceback" not in run.stderr
