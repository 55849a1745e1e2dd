"""MLflow 3 lineage objects of recorded steps (issue 23, item 7), read back from a real SQLite store.

The tiny recipe (``checkpoint_permanent_every: 10``) over a storage root whose steps are committed by
hand: every input of ``train`` as a stand-in (``step.json``, ``manifest.json``, ``_SUCCESS``), one
of them holding a sparse 1 GiB file that its manifest lists; ``train`` itself with a summary and the
manifests of checkpoints 5, 10 and 20 (20 final). :meth:`Pipeline.record` then logs the runs through
the tracker, and the test asks MLflow for the datasets, logged models and the registered version.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from mlflow.entities import LoggedModelStatus
from mlflow.tracking import MlflowClient

from tests.conftest import TINY
from tidal.core.commit import StepResult
from tidal.core.load import load_pipeline
from tidal.storage.layout import MANIFEST_JSON, STEP_JSON, SUMMARY_JSON
from tidal.tracking import Tracker
from tidal.tracking import client as tracking_client
from tidal.tracking.mlflow_lineage import DIGEST_CHARS, MODEL_TYPE

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
GIB = 1 << 30
RUN_KEY = "lineage__run"


def _commit(out: Path, name: str, root_hash: str, total_bytes: int, extra: dict[str, str] | None = None,
            provenance: dict | None = None) -> None:
    """A committed stand-in step: its files, a manifest claiming ``total_bytes``, step.json, _SUCCESS."""
    out.mkdir(parents=True, exist_ok=True)
    for rel, text in (extra or {}).items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text)
    (out / MANIFEST_JSON).write_text(json.dumps({"files": [], "total_bytes": total_bytes, "root_hash": root_hash}))
    (out / STEP_JSON).write_text(json.dumps({"hash_input": {"name": name}, "manifest_root_hash": root_hash,
                                             "summary": {}, "provenance": provenance or {}}))
    (out / "_SUCCESS").write_text(root_hash + "\n")


# what a GKE launch sized the train step as (tidal/train/preflight.py): its MLflow run gets it as tags
SIZING = {"method": "compiled", "mesh": {"data": 1, "fsdp": 4, "tensor": 1}, "chips": 4, "predicted_mfu": 0.412}


def _root_hash(index: int) -> str:
    return f"{index:02x}" * 32


@pytest.fixture
def committed(tmp_path, monkeypatch):
    """The pipeline, its train step's summary, and the 1 GiB input step's name."""
    for var in ("TIDAL_STORAGE_ROOT", "MLFLOW_TRACKING_URI", "TIDAL_TRACKING_PENDING_DIR", "TIDAL_STATSD_HOST"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(tracking_client, "_unreachable_until", {})
    data = yaml.safe_load(TINY.read_text())
    data["storage_root"] = str(tmp_path / "store")
    data["train"]["checkpoint_permanent_every"] = 10
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(yaml.safe_dump(data, sort_keys=False))
    pipe = load_pipeline(recipe)
    train = pipe.graph["train"]
    big = "tokenize-brown"
    for index, dep in enumerate(train.inputs):
        out = pipe.storage.step_dir(dep.step_id)
        _commit(out, dep.name, _root_hash(index + 1), GIB if dep.name == big else 1000)
        if dep.name == big:
            with open(out / "shard-00000.bin", "wb") as shard:  # sparse: 1 GiB without writing it
                shard.truncate(GIB)
    summary = {"steps": 20, "checkpoint_step": 20, "checkpoint_root_hash": "cc" * 32, "params_sha256": "dd" * 32}
    manifests = {f"checkpoint_manifests/{n}.json": json.dumps({"step": n, "root_hash": f"{n:02x}" * 32,
                                                               **({"params_sha256": "ee" * 32} if n == 10 else {})})
                 for n in (5, 10, 20)}
    _commit(pipe.storage.step_dir(train.step_id), "train", "ff" * 32, 5000,
            {SUMMARY_JSON: json.dumps(summary), **manifests}, provenance={"launcher": "gke", "sizing": SIZING})
    return pipe, summary, big


def _step_run(client: MlflowClient, pipe, step_id: str):
    exp = client.get_experiment_by_name(pipe.experiment).experiment_id
    (run,) = client.search_runs([exp], f"tags.`tidal.step_id` = '{step_id}'")
    return run


def test_any_step_logs_its_inputs_as_metadata_only_datasets_in_under_a_second(committed):
    pipe, _, big = committed
    assert pipe.parent_run(RUN_KEY)  # the store's first-use migration is not what is timed
    mix = pipe.graph["mix"]
    assert big in [d.name for d in mix.inputs]
    result = StepResult("mix", mix.step_id, "mix", "skip", 0.0, pipe.storage.step_dir(mix.step_id), {})
    started = time.perf_counter()
    pipe.record(result, RUN_KEY)
    seconds = time.perf_counter() - started
    print(f"RESULT record_mix_with_1GiB_input_s={seconds:.3f}")
    assert seconds < 1.0, f"recording a step whose input holds 1 GiB took {seconds:.2f} s: data was read?"

    client = MlflowClient(pipe.tracking_uri)
    run = _step_run(client, pipe, mix.step_id)
    datasets = {i.dataset.name: i for i in run.inputs.dataset_inputs}
    assert sorted(datasets) == sorted(d.name for d in mix.inputs)
    for index, dep in enumerate(pipe.graph["train"].inputs):
        if dep.name not in datasets:
            continue
        logged = datasets[dep.name]
        assert logged.dataset.digest == _root_hash(index + 1)[:DIGEST_CHARS]
        assert json.loads(logged.dataset.source) == {"uri": pipe.storage.step_uri(dep.step_id)}
        assert logged.dataset.source_type == "local"
        profile = json.loads(logged.dataset.profile)
        assert profile["manifest_root_hash"] == _root_hash(index + 1) and profile["step_id"] == dep.step_id
        tags = {t.key: t.value for t in logged.tags}
        assert tags == {"mlflow.data.context": "input", "tidal.step_id": dep.step_id,
                        "tidal.manifest_root_hash": _root_hash(index + 1)}
    assert json.loads(datasets[big].dataset.profile)["total_bytes"] == GIB


def test_train_logs_a_model_per_permanent_checkpoint_and_registers_the_final_one(committed):
    pipe, summary, _ = committed
    train = pipe.graph["train"]
    result = StepResult("train", train.step_id, "train", "skip", 0.0, pipe.storage.step_dir(train.step_id), summary)
    pipe.record(result, RUN_KEY)
    pipe.record(result, RUN_KEY + "_again")  # a second DAG run that skips the step: no duplicate model/version

    client = MlflowClient(pipe.tracking_uri)
    exp = client.get_experiment_by_name(pipe.experiment).experiment_id
    runs = client.search_runs([exp], f"tags.`tidal.step_id` = '{train.step_id}'")
    assert len(runs) == 2
    for run in runs:
        sized = {k: v for k, v in run.data.tags.items() if k.startswith("tidal.sizing.")}
        assert sized == {"tidal.sizing.method": "compiled", "tidal.sizing.mesh": json.dumps(SIZING["mesh"]),
                         "tidal.sizing.chips": "4", "tidal.sizing.predicted_mfu": "0.412"}, sized
        contexts = {t.value for i in run.inputs.dataset_inputs for t in i.tags if t.key == "mlflow.data.context"}
        assert len(run.inputs.dataset_inputs) == len(train.inputs) and contexts == {"training"}
    models = client.search_logged_models([exp], filter_string=f"tags.`tidal.step_id` = '{train.step_id}'")
    by_step = {int(m.tags["tidal.checkpoint_step"]): m for m in models}
    assert sorted(by_step) == [10, 20]  # 5 is neither permanent nor final
    for number, model in by_step.items():
        assert model.model_type == MODEL_TYPE and model.status == LoggedModelStatus.READY
        assert model.tags["tidal.checkpoint_root_hash"] == f"{number:02x}" * 32
        assert model.tags["tidal.checkpoint_uri"] == str(pipe.storage.step_dir(train.step_id) / "checkpoints"
                                                         / str(number))
        assert model.source_run_id in {r.info.run_id for r in runs}
    assert by_step[10].tags["tidal.params_sha256"] == "ee" * 32 and by_step[10].tags["tidal.final"] == "false"
    assert by_step[20].tags["tidal.params_sha256"] == summary["params_sha256"]
    assert by_step[20].tags["tidal.final"] == "true"
    for run in runs:
        assert {o.model_id for o in run.outputs.model_outputs} == {m.model_id for m in models}

    (version,) = client.search_model_versions("name = 'tidal-tiny'")
    expected_licence = "GPL-2.0-or-later AND LicenseRef-Brown-Corpus AND MIT"
    assert version.source == by_step[20].tags["tidal.checkpoint_uri"]  # a server's: models:/<id>
    assert version.tags["tidal.checkpoint_uri"] == by_step[20].tags["tidal.checkpoint_uri"]
    assert version.tags["licence"] == expected_licence and version.tags["intended_use"] == "research"
    assert version.tags["tidal.logged_model_id"] == by_step[20].model_id
    assert version.tags["tidal.checkpoint_root_hash"] == "14" * 32 and version.tags["tidal.step_id"] == train.step_id
    assert version.tags["tidal.params_sha256"] == summary["params_sha256"]
    assert version.tags["tidal.licence.brown"] == "LicenseRef-Brown-Corpus"
    assert by_step[20].tags["licence"] == expected_licence


def test_an_mlflow_outage_buffers_the_lineage_and_a_replay_delivers_it(committed, tmp_path, monkeypatch):
    pipe, summary, _ = committed
    sqlite_uri = pipe.tracking_uri
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # nobody listens
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    monkeypatch.setenv("TIDAL_TRACKING_PENDING_DIR", str(tmp_path / "pending"))
    down = load_pipeline(pipe.recipe_path)
    assert down.tracking_uri == "http://127.0.0.1:9"
    train = down.graph["train"]
    result = StepResult("train", train.step_id, "train", "skip", 0.0, down.storage.step_dir(train.step_id), summary)
    down.record(result, "lineage__outage")  # a committed step is never failed by tracking
    payloads = [json.loads(p.read_text()) for p in sorted((tmp_path / "pending").glob("*.json"))]
    (step,) = [p for p in payloads if p["op"] == "log_step"]
    assert len(step["args"]["lineage"]["datasets"]) == len(train.inputs)
    assert [m["checkpoint_step"] for m in step["args"]["lineage"]["models"]] == [10, 20]

    up = Tracker(sqlite_uri, pipe.experiment, pending_dir=tmp_path / "pending")
    assert up.replay_pending() == len(payloads)
    client = MlflowClient(sqlite_uri)
    run = _step_run(client, pipe, train.step_id)
    assert len(run.inputs.dataset_inputs) == len(train.inputs) and len(run.outputs.model_outputs) == 2
    (version,) = client.search_model_versions("name = 'tidal-tiny'")
    assert version.tags["licence"] and version.tags["intended_use"] == "research"


def test_a_lineage_call_mlflow_refuses_keeps_the_step_run_and_holds_nothing(tmp_path, monkeypatch, caplog):
    """A refusal (here a dataset name over MLflow's 500 characters) is not an outage: the step's run is
    logged without the dataset, nothing is buffered and the store is not held as unreachable."""
    from tidal.tracking.mlflow_lineage import Lineage, StepDataset

    monkeypatch.setattr(tracking_client, "_unreachable_until", {})
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracker = Tracker(uri, "tidal-refused", pending_dir=tmp_path / "pending")
    parent = tracker.parent_run("refused", {}, {})
    bad = Lineage((StepDataset("x" * 600, "x-0123456789ab", "clean", str(tmp_path), "ab" * 32),))
    run_id = tracker.log_step(parent, "mix", "mix-0123456789ab", "mix", "run", {}, lineage=bad)
    assert run_id is not None and "lineage of step mix not logged" in caplog.text
    run = MlflowClient(uri).get_run(run_id)
    assert run.info.status == "FINISHED" and not run.inputs.dataset_inputs
    assert not list((tmp_path / "pending").glob("*.json"))
    assert tracking_client._unreachable_until == {}  # the next call is not skipped


def _log_same_inputs(uri: str, experiment_id: str, barrier) -> str:
    """One of several processes: a run of its own, then the shared input datasets, all at one moment."""
    from tidal.tracking.mlflow_lineage import Lineage, StepDataset, log_datasets

    client = MlflowClient(tracking_uri=uri)
    run_id = client.create_run(experiment_id).info.run_id
    lineage = Lineage(datasets=tuple(StepDataset(f"clean-{i}", f"clean-{i}-0123456789ab", "clean",
                                                 f"s3://b/r/clean-{i}-0123456789ab", f"{i}" * 64) for i in range(8)))
    barrier.wait()
    try:
        log_datasets(client, lambda what, fn: fn(), run_id, lineage)
    except Exception as err:  # noqa: BLE001 - reported to the test
        return f"{type(err).__name__}: {str(err)[:300]}"
    return run_id


def test_concurrent_runs_on_one_store_all_log_their_shared_inputs(tmp_path):
    """Issue 43, item 9: two runs on one root logged the same input datasets at once and one failed with
    `UNIQUE constraint failed: datasets.experiment_id, datasets.name, datasets.digest`; the lost insert
    race is made again and finds the other's row."""
    import multiprocessing

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    experiment_id = MlflowClient(tracking_uri=uri).create_experiment("race")
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager:
        barrier = manager.Barrier(4)
        with context.Pool(4) as pool:
            results = pool.starmap(_log_same_inputs, [(uri, experiment_id, barrier)] * 4)
    assert all(not r.startswith(("LineageRefused", "MlflowException")) for r in results), results
    client = MlflowClient(tracking_uri=uri)
    for run_id in results:
        names = sorted(d.dataset.name for d in client.get_run(run_id).inputs.dataset_inputs)
        assert names == [f"clean-{i}" for i in range(8)], (run_id, names)
