"""The whole DAG through real Airflow (`airflow dags test`, SQLite) on a slice of real text.

Runs the tiny recipe with smaller source slices and fewer training steps, then asserts
what a user would check: the MLflow run and its hash tags, a passing gate, a checkpoint
whose manifest matches its files, a falling training loss; then runs the DAG again and
checks every step was skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO
from tests.e2e.slices import write_slice_recipe

VENV_BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory):
    base = tmp_path_factory.mktemp("e2e")
    recipes = base / "recipes"
    recipes.mkdir()
    write_slice_recipe(recipes / "tiny_ci.yaml", base / "storage")
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(base / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "TIDAL_RECIPES_DIR": str(recipes),
        "RAYON_NUM_THREADS": "1",
        # OpenLineage through the official provider, file transport: one JSON event per line
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
            {"type": "file", "log_file_path": str(base / "openlineage.jsonl"), "append": True}),
        "AIRFLOW__OPENLINEAGE__NAMESPACE": "tidal-e2e",
    }
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("TIDAL_STORAGE_ROOT", None)
    migrate = subprocess.run(
        [str(VENV_BIN / "airflow"), "db", "migrate"], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert migrate.returncode == 0, migrate.stdout[-3000:] + migrate.stderr[-3000:]
    return {"env": env, "recipe": recipes / "tiny_ci.yaml", "storage": base / "storage",
            "openlineage": base / "openlineage.jsonl"}


def dags_test(env: dict) -> tuple[subprocess.CompletedProcess, float]:
    started = time.perf_counter()
    proc = subprocess.run(
        [str(VENV_BIN / "airflow"), "dags", "test", "tidal_tiny_ci"],
        env=env, capture_output=True, text=True, timeout=1500, cwd=REPO, check=False,
    )
    return proc, time.perf_counter() - started


def task_states(env: dict) -> dict[str, str]:
    """``{task id: state}`` of the newest DAG run, read from Airflow's metadata database."""
    import sqlite3

    with sqlite3.connect(Path(env["AIRFLOW_HOME"]) / "airflow.db") as db:
        [(run_id,)] = db.execute("SELECT run_id FROM dag_run WHERE dag_id = 'tidal_tiny_ci' "
                                 "ORDER BY id DESC LIMIT 1").fetchall()
        rows = db.execute("SELECT task_id, state FROM task_instance WHERE dag_id = 'tidal_tiny_ci' AND run_id = ?",
                          (run_id,)).fetchall()
    return dict(rows)


def parent_and_children(pipe):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(pipe.tracking_uri)
    exp = client.get_experiment_by_name("tidal-tiny_ci")
    parents = client.search_runs(
        [exp.experiment_id], "tags.`tidal.run_key` != ''", order_by=["attributes.start_time DESC"]
    )
    children = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{parents[0].info.run_id}'")
    names = [c.data.tags["mlflow.runName"] for c in children]
    assert len(names) == len(set(names)), f"a step recorded twice: {sorted(names)}"
    return client, parents, {c.data.tags["mlflow.runName"]: c for c in children}


def check_openlineage(path: Path, pipe) -> None:
    """Every step task's COMPLETE event: step URIs as inputs and output, the tidal_step facet valid
    against docs/openlineage/TidalStepRunFacet.json with the step id, root hash, signature status
    and the licence of every upstream source."""
    import jsonschema

    from operators.openlineage_facets import dataset_name
    from tidal.quality.licences import licence_decisions

    schema = json.loads((REPO / "docs" / "openlineage" / "TidalStepRunFacet.json").read_text())
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    complete = {e["job"]["name"].split(".", 1)[1]: e for e in events
                if e.get("eventType") == "COMPLETE" and e["job"]["name"].startswith("tidal_tiny_ci.")}
    licences = licence_decisions(pipe.recipe.sources, pipe.recipe.licences)
    for step in pipe.graph:
        event = complete[step.name]
        assert event["job"]["namespace"] == "tidal-e2e"
        facet = event["run"]["facets"]["tidal_step"]
        jsonschema.validate(facet, schema)
        record = json.loads(pipe.storage.read_text(step.step_id, "step.json"))
        assert (facet["step_id"], facet["status"]) == (step.step_id, "run")
        assert facet["manifest_root_hash"] == record["manifest_root_hash"]
        assert facet["signature_status"] == record["signing"]["status"]
        out = dataset_name(pipe.storage.step_uri(step.step_id))
        assert [(d["namespace"], d["name"]) for d in event["outputs"]] == [out]
        assert sorted((d["namespace"], d["name"]) for d in event["inputs"]) == sorted(
            dataset_name(pipe.storage.step_uri(dep.step_id)) for dep in step.inputs)
        if step.kind == "fetch":
            src = step.config["source"]
            assert facet["licences"] == {src: {"licence": licences[src]["licence"]}}
    upstream = {src for src in pipe.recipe.sources if "train" in pipe.graph.descendants(f"fetch-{src}")}
    assert len(upstream) >= 3
    assert complete["train"]["run"]["facets"]["tidal_step"]["licences"] == {
        src: {"licence": licences[src]["licence"]} for src in upstream}


def test_dag_runs_end_to_end_then_skips_everything(airflow_env):
    from tidal.core.load import load_pipeline
    from tidal.integrity.hashing import verify_manifest

    first, first_s = dags_test(airflow_env["env"])
    log = first.stdout + first.stderr
    assert first.returncode == 0, log[-6000:]

    pipe = load_pipeline(airflow_env["recipe"])
    assert all(pipe.storage.is_committed(s.step_id) for s in pipe.graph)

    check_openlineage(airflow_env["openlineage"], pipe)
    client, parents, children = parent_and_children(pipe)
    assert len(parents) == 1
    parent = parents[0]
    assert parent.data.tags["tidal.recipe_hash"] == pipe.recipe_hash
    assert parent.data.params["train.steps"] == "60"
    assert parent.info.status == "FINISHED"
    assert set(children) == {s.name for s in pipe.graph}
    for step in pipe.graph:
        tags = children[step.name].data.tags
        assert tags["tidal.step_id"] == step.step_id and tags["tidal.status"] == "run"
        assert parent.data.tags[f"tidal.step_id.{step.name}"] == step.step_id

    tokenizer_meta = json.loads((pipe.storage.step_dir(pipe.graph["tokenizer"].step_id)
                                 / "tokenizer_meta.json").read_text())
    assert children["tokenizer"].data.tags["tidal.tokenizer_hash"] == tokenizer_meta["tokenizer_hash"]
    for src in ("brown", "gcide", "songci", "udhr"):
        assert len(children[f"fetch-{src}"].data.tags["tidal.archive_sha256"]) == 64

    gate = json.loads((pipe.storage.step_dir(pipe.graph["gate"].step_id) / "gate_result.json").read_text())
    assert gate["success"] is True and gate["results"]

    train_dir = pipe.storage.step_dir(pipe.graph["train"].step_id)
    ckpt_manifest = json.loads((train_dir / "checkpoint_manifest.json").read_text())
    ckpt_dir = train_dir / "checkpoints" / str(ckpt_manifest["step"])
    assert ckpt_manifest["step"] == 60
    assert verify_manifest(ckpt_dir, ckpt_manifest) == []
    train_tags = children["train"].data.tags
    assert train_tags["tidal.checkpoint_root_hash"] == ckpt_manifest["root_hash"]
    assert verify_manifest(train_dir, json.loads((train_dir / "manifest.json").read_text())) == []

    history = client.get_metric_history(children["train"].info.run_id, "loss")
    losses = [m.value for m in sorted(history, key=lambda m: m.step)]
    assert len(losses) >= 5
    assert len({m.step for m in history}) == len(history), "loss history logged twice (live and afterwards)"
    assert children["train"].info.status == "FINISHED"
    assert losses[-1] < losses[0] - 1.0, losses
    summary = json.loads((train_dir / "summary.json").read_text())
    assert summary["tokens_seen"] == 60 * 8 * (128 - 1) or summary["tokens_seen"] == 60 * 8 * 128
    assert 0 < summary["eval_loss"] < 20

    report = subprocess.run(
        [str(VENV_BIN / "tidal"), "report", str(airflow_env["recipe"])],
        env=airflow_env["env"], capture_output=True, text=True, timeout=300, check=False,
    )
    assert report.returncode == 0, report.stderr[-3000:]
    assert f"run key tidal_tiny_ci__{parent.data.tags['tidal.run_key'].split('__', 1)[1]}" in report.stdout
    assert "steps run:     17" in report.stdout and "gate:          passed" in report.stdout

    second, second_s = dags_test(airflow_env["env"])
    assert second.returncode == 0, (second.stdout + second.stderr)[-6000:]
    _, parents, children = parent_and_children(pipe)
    assert len(parents) == 2
    assert {c.data.tags["tidal.status"] for c in children.values()} == {"skip"}
    # ... written by the planning task alone: no step task of the cached run got a worker
    states = task_states(airflow_env["env"])
    assert states.pop("plan") == "success" and states.pop("report") == "success", states
    assert set(states.values()) == {"skipped"} and len(states) == len(list(pipe.graph)), states

    # A failing gate fails the DAG run with a readable summary; upstream data steps are reused.
    data = yaml.safe_load(airflow_env["recipe"].read_text())
    data["gate"]["min_total_tokens"] = 10**12
    airflow_env["recipe"].write_text(yaml.safe_dump(data, sort_keys=False))
    failing, _ = dags_test(airflow_env["env"])
    log = failing.stdout + failing.stderr
    assert failing.returncode != 0
    assert "GateFailed" in log and "total_tokens [source=all]: expected >= 1e+12, got" in log
    strict = load_pipeline(airflow_env["recipe"])
    assert not strict.storage.is_committed(strict.graph["gate"].step_id)
    assert not strict.storage.is_committed(strict.graph["train"].step_id)
    assert strict.graph["stats"].step_id == pipe.graph["stats"].step_id
    # the evidence is kept (never committed) and recorded in MLflow as a FAILED nested run
    [kept] = strict.storage.failed_attempts(strict.graph["gate"].step_id)
    assert json.loads(strict.storage.read_object(kept + "gate_result.json"))["success"] is False
    assert strict.storage.read_object(kept + "data_docs/index.html") is not None
    _, _, children = parent_and_children(strict)
    assert children["gate"].info.status == "FAILED"
    assert children["gate"].data.tags["tidal.status"] == "failed"
    assert "total_tokens" in children["gate"].data.tags["error"]
    print(f"RESULT e2e_first_run_s={first_s:.1f} e2e_cached_run_s={second_s:.1f} ratio={second_s / first_s:.3f}")
