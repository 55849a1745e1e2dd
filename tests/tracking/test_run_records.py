"""What a ``tidal run`` leaves in MLflow and in its step outputs (issue 21, items 7 and 10; issue 23, item 7).

A real ``mlflow server`` (loopback, SQLite store; tests/storage/servers.py) records a whole
``tidal run`` of a small slice of the tiny recipe, then a second run whose gate fails.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.e2e.slices import write_slice_recipe
from tests.storage.servers import free_port, kill_mlflow_server, start_mlflow_server

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
OK_KEY, FAILED_KEY = "records__ok", "records__failed"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """The server's URI, the passing run's pipeline, and the exit code of the failing run."""
    from tidal.cli import main
    from tidal.core.load import load_pipeline
    from tidal.tracking import client as tracking_client

    tmp = tmp_path_factory.mktemp("records")
    port = free_port()
    proc = start_mlflow_server(port, tmp / "mlflow")
    uri = f"http://127.0.0.1:{port}"
    try:
        with pytest.MonkeyPatch.context() as env:
            for var in ("TIDAL_STORAGE_ROOT", "TIDAL_MLFLOW_UI_URL", "TIDAL_STATSD_HOST"):
                env.delenv(var, raising=False)
            env.setenv("MLFLOW_TRACKING_URI", uri)
            env.setattr(tracking_client, "_unreachable_until", {})
            recipe = write_slice_recipe(tmp / "ok.yaml", tmp / "store")
            data = yaml.safe_load(recipe.read_text())
            data["train"]["checkpoint_permanent_every"] = 40  # checkpoints 20, 40, 60: 40 permanent, 60 final
            recipe.write_text(yaml.safe_dump(data, sort_keys=False))
            assert main(["run", str(recipe), "--run-key", OK_KEY]) == 0
            bad = yaml.safe_load(recipe.read_text())
            bad["gate"]["min_total_tokens"] = 10**12  # same data steps (committed), a gate that fails
            (tmp / "bad").mkdir()  # a folder of its own: one recipe file per name in a folder (the DAG's rule)
            (tmp / "bad" / "bad.yaml").write_text(yaml.safe_dump(bad, sort_keys=False))
            assert main(["run", str(tmp / "bad" / "bad.yaml"), "--run-key", FAILED_KEY]) == 1  # gate failed
            yield uri, load_pipeline(recipe)
    finally:
        kill_mlflow_server(proc)


def _parent(client, exp_id, key):
    (run,) = client.search_runs([exp_id], f"tags.`tidal.run_key` = '{key}'")
    return run


def test_parent_runs_are_closed_with_the_final_metrics(recorded):
    uri, pipe = recorded
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(pipe.experiment)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"  # not the GenAI traces page
    ok = _parent(client, exp.experiment_id, OK_KEY)
    assert ok.info.status == "FINISHED"
    summary = json.loads(pipe.storage.read_text(pipe.graph["train"].step_id, "summary.json"))
    for key in ("final_train_loss", "eval_loss", "tokens_per_second", "tokens_seen"):
        assert ok.data.metrics[key] == pytest.approx(summary[key]), key
    assert [k for k in ok.data.metrics if k.startswith("eval_loss/")]
    assert _parent(client, exp.experiment_id, FAILED_KEY).info.status == "FAILED"


def test_curves_have_no_summary_point(recorded):
    uri, pipe = recorded
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(pipe.experiment)
    ok = _parent(client, exp.experiment_id, OK_KEY)
    (train,) = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{ok.info.run_id}' and "
                                  "tags.`tidal.kind` = 'train'")
    out = pipe.storage.step_dir(pipe.graph["train"].step_id)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = sorted(k for k in rows[-1] if k.startswith("eval_loss/"))
    assert evals
    for key in [*evals, "loss"]:
        logged = sorted((m.step, m.value) for m in client.get_metric_history(train.info.run_id, key))
        assert logged == sorted((r["step"], r[key]) for r in rows if key in r), key  # the curve, nothing more
    final = client.get_metric_history(train.info.run_id, "final_train_loss")
    assert [m.step for m in final] == [60]  # a summary number sits at the last step, not at 0
    names = {a.path for a in client.list_artifacts(train.info.run_id)}
    assert {"recipe.yaml", "tokenizer.json", "metrics.jsonl", "loss_curve.png", "summary.json"} <= names
    recipe = yaml.safe_load(Path(client.download_artifacts(train.info.run_id, "recipe.yaml")).read_text())
    assert recipe["name"] == pipe.recipe.name and recipe["train"]["steps"] == 60


def test_pictures_are_valid_deterministic_pngs(recorded, tmp_path):
    import matplotlib.image as mpimg

    from tidal.train.curves import write_loss_curve

    _, pipe = recorded
    out = pipe.storage.step_dir(pipe.graph["train"].step_id)
    committed = (out / "loss_curve.png").read_bytes()
    assert "loss_curve.png" in (out / "manifest.json").read_text()  # hashed with the step
    image = mpimg.imread(out / "loss_curve.png")
    assert image.ndim == 3 and image.shape[0] > 100 and image.std() > 0  # drawn, not blank
    again = [write_loss_curve(out / "metrics.jsonl", tmp_path / f"{i}.png").read_bytes() for i in range(2)]
    assert again[0] == again[1] == committed
    assert b"Software" not in committed and b"Matplotlib" not in committed
    stats = pipe.storage.step_dir(pipe.graph["stats"].step_id) / "stats.png"
    assert mpimg.imread(stats).shape[0] > 100


def test_gate_summary_renders_offline_with_the_real_run_time(recorded):
    _, pipe = recorded
    out = pipe.storage.step_dir(pipe.graph["gate"].step_id)
    page = (out / "gate_summary.html").read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?https?://""", page) and "http://" not in page \
        and "https://" not in page
    assert "1970" not in page and f"Run time: {dt.datetime.now(dt.UTC):%Y-%m-%d}" in page
    result = json.loads((out / "gate_result.json").read_text())
    assert page.count("<tr>") == len(result["results"]) + 1 and "PASS" in page
    assert not [p for p in (out / "data_docs").rglob("*") if "1970" in str(p)]  # GX's run time is real too


def test_train_run_logs_input_datasets_checkpoint_models_and_the_registered_final_one(recorded):
    uri, pipe = recorded
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(pipe.experiment)
    ok = _parent(client, exp.experiment_id, OK_KEY)
    (run,) = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{ok.info.run_id}' and "
                                "tags.`tidal.kind` = 'train'")
    step = pipe.graph["train"]
    digests = {i.dataset.name: i.dataset.digest for i in run.inputs.dataset_inputs}
    assert sorted(digests) == sorted(dep.name for dep in step.inputs)
    for dep in step.inputs:
        record = json.loads(pipe.storage.read_text(dep.step_id, "step.json"))
        assert digests[dep.name] == record["manifest_root_hash"][:36]
    out = pipe.storage.step_dir(step.step_id)
    summary = json.loads((out / "summary.json").read_text())
    models = {int(m.tags["tidal.checkpoint_step"]): m for m in client.search_logged_models(
        [exp.experiment_id], filter_string=f"tags.`tidal.step_id` = '{step.step_id}'")}
    assert sorted(models) == [40, 60]  # 20 was neither permanent nor final
    for number, model in models.items():
        manifest = json.loads((out / "checkpoint_manifests" / f"{number}.json").read_text())
        assert model.tags["tidal.checkpoint_root_hash"] == manifest["root_hash"]
    manifest = json.loads((out / "checkpoint_manifests" / "40.json").read_text())
    assert models[40].tags["tidal.params_sha256"] == manifest["params_sha256"]  # hashed at the save
    assert models[60].tags["tidal.params_sha256"] == summary["params_sha256"]  # the final parameters
    assert models[40].tags["tidal.final"] == "false" and models[60].tags["tidal.final"] == "true"
    assert models[60].tags["tidal.checkpoint_root_hash"] == summary["checkpoint_root_hash"]
    (version,) = client.search_model_versions(f"name = '{pipe.experiment}'")
    assert version.tags["tidal.logged_model_id"] == models[60].model_id
    assert version.source == f"models:/{models[60].model_id}"  # a server refuses a local path outside its store
    assert version.tags["tidal.checkpoint_uri"] == str(out / "checkpoints" / "60")
    assert version.tags["intended_use"] == "research"
    assert version.tags["licence"] == "GPL-2.0-or-later AND LicenseRef-Brown-Corpus AND MIT"
