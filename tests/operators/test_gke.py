"""The GKE variant of the tiny DAG: it parses light, renders, and its operators carry the
arguments chosen on purpose; the pod the real KubernetesPodOperator would create is
schema-valid and hardened, and carries the live-metrics env of the run prepare opened.
Nothing runs on a cluster here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from operators.dag_factory import build_dag
from operators.gke import jobset_finished
from operators.remote import ProviderOperator
from tests.conftest import REPO, TINY, seal
from tests.launch.test_pods import K8S_VERSION, RUN_ID, SERVER_URI, validate
from tests.storage.servers import hostname_mlflow_server
from tidal.core.planner import build_graph
from tidal.launch.hardening import violations
from tidal.recipe import parse_recipe

STEP_URI = "s3://tidal-runs/tiny/train-0123456789ab"
POD = {"launcher": "gke", "accelerator": {"kind": "tpu", "type": "tpu-v5-lite-podslice", "topology": "2x4"}}
JOBSET = {"launcher": "gke", "spot": True, "accelerator": {"kind": "tpu", "type": "tpu-v5p-slice",
                                                           "topology": "2x2x2", "slices": 2}}


def write_recipe(tmp_path: Path, data: dict, name: str, resources: dict) -> Path:
    data = {**data, "name": name, "train": {**data["train"], "resources": resources}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# what prepare pushes when it opened a live run on a tracking server
XCOMS = {"step_uri": STEP_URI, "mlflow_tracking_uri": SERVER_URI, "mlflow_run_id": RUN_ID}
LIVE_ENV = {"MLFLOW_TRACKING_URI": SERVER_URI, "TIDAL_MLFLOW_RUN_ID": RUN_ID}


class StubTI:
    """Just enough of a task instance for Jinja and the prepare/commit operators: XComs."""

    def __init__(self, xcoms: dict | None = None):
        self.xcoms = dict(XCOMS if xcoms is None else xcoms)

    def xcom_pull(self, task_ids=None, key=None):
        assert task_ids == "train.prepare"
        return self.xcoms.get(key)

    def xcom_push(self, key, value):
        self.xcoms[key] = value


def rendered(op, xcoms: dict | None = None) -> dict:
    op.render_template_fields({"ti": StubTI(xcoms)})
    return op.operator_kwargs


def env_of(pod_spec: dict) -> dict:
    """``{name: value}`` of the training container's literal env vars."""
    return {e["name"]: e["value"] for e in pod_spec["containers"][0]["env"] if "value" in e}


PROBE = r"""
import sys, time, runpy
import airflow.sdk
started = time.perf_counter()
ns = runpy.run_path("dags/pretrain.py")
print(time.perf_counter() - started)
print(",".join(m for m in ("kubernetes", "kubernetes_asyncio", "jax", "apache_beam") if m in sys.modules))
print(",".join(sorted(t.task_id for t in ns["tidal_gke"].tasks if t.task_id.startswith("train"))))
"""


def test_dag_file_with_gke_recipe_parses_fast_without_the_kubernetes_client(tmp_path, tiny_data):
    write_recipe(tmp_path, tiny_data, "gke", JOBSET)
    write_recipe(tmp_path, tiny_data, "pod", POD)
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120,
                         check=True, env={**__import__("os").environ, "TIDAL_RECIPES_DIR": str(tmp_path)})
    elapsed, heavy, tasks = out.stdout.strip().splitlines()[-3:]
    assert heavy == "" and float(elapsed) > 0  # light: no Kubernetes client imported (seconds: bench/dag_parse.py)
    assert tasks == "train.commit,train.create,train.delete,train.prepare,train.wait"


def test_resources_never_change_step_ids(tiny_data):
    ids = {json.dumps(r): {s.name: s.step_id for s in build_graph(parse_recipe(
        {**tiny_data, "train": {**tiny_data["train"], "resources": r}}))} for r in ({}, POD, JOBSET)}
    assert len({json.dumps(v, sort_keys=True) for v in ids.values()}) == 1


def test_single_host_variant_renders_a_valid_hardened_pod(tmp_path, tiny_data):
    from kubernetes.client import ApiClient

    dag = build_dag(write_recipe(tmp_path, tiny_data, "pod", POD))
    prepare, launch, commit = (dag.task_dict[f"train.{t}"] for t in ("prepare", "launch", "commit"))
    # the eval source's tokenize step, and every training source's for its held-out split
    assert prepare.upstream_task_ids == {"gate", "mix", "plan", "tokenizer", "tokenize-udhr", "tokenize-brown",
                                         "tokenize-gcide", "tokenize-songci"}
    assert prepare.trigger_rule == "none_failed" and "train.prepare" in dag.task_dict["plan"].entry_tasks["train"]
    assert launch.upstream_task_ids == {"train.prepare"}
    assert commit.upstream_task_ids == {"train.prepare", "train.launch"}
    assert commit.trigger_rule == "none_failed_min_one_success"
    assert dag.task_dict["report"].upstream_task_ids >= {"train.commit"}
    assert isinstance(launch, ProviderOperator) and launch.provider_class.endswith(":KubernetesPodOperator")
    kwargs = rendered(launch)
    assert {k: kwargs[k] for k in ("on_finish_action", "durable", "get_logs", "deferrable")} == {
        "on_finish_action": "delete_succeeded_pod", "durable": True, "get_logs": True, "deferrable": True}
    assert kwargs["arguments"] == [STEP_URI] and kwargs["cmds"] == ["python", "-m", "tidal.train"]

    kpo = launch.build()  # the real provider operator, with the rendered arguments
    assert kpo.deferrable and kpo.durable and kpo.get_logs and kpo.on_finish_action.value == "delete_succeeded_pod"
    pod = ApiClient().sanitize_for_serialization(kpo.build_pod_request_obj(dry_run=True))
    validate(pod)
    assert violations(pod) == []
    container = pod["spec"]["containers"][0]
    assert container["command"] + container["args"] == ["python", "-m", "tidal.train", STEP_URI]
    assert pod["spec"]["nodeSelector"] == {"cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
                                           "cloud.google.com/gke-tpu-topology": "2x4"}
    assert container["resources"]["limits"]["google.com/tpu"] == "8"
    assert pod["spec"]["terminationGracePeriodSeconds"] == 600 and pod["spec"]["activeDeadlineSeconds"] == 86400
    assert pod["metadata"]["labels"]["tidal.dev/step-id"].startswith("train-")
    assert env_of(pod["spec"]).items() >= LIVE_ENV.items()  # live metrics into prepare's run
    assert K8S_VERSION


def test_multi_host_variant_renders_jobset_sensor_and_cleanup(tmp_path, tiny_data):
    dag = build_dag(write_recipe(tmp_path, tiny_data, "gke", JOBSET))
    create, wait, delete, commit = (dag.task_dict[f"train.{t}"] for t in ("create", "wait", "delete", "commit"))
    assert wait.upstream_task_ids == {"train.create"} and wait.mode == "reschedule"
    assert delete.trigger_rule == "none_skipped"
    assert commit.upstream_task_ids == {"train.prepare", "train.wait", "train.delete"}
    kwargs = rendered(create)
    assert kwargs["custom_resource_definition"] is True
    jobset = yaml.safe_load(kwargs["yaml_conf"])
    validate(jobset)
    assert violations(jobset) == []
    assert jobset["metadata"]["name"] == wait.name == yaml.safe_load(rendered(delete)["yaml_conf"])["metadata"]["name"]
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["args"] == [STEP_URI]
    assert pod["nodeSelector"]["cloud.google.com/gke-spot"] == "true"
    assert env_of(pod).items() >= LIVE_ENV.items()
    create.build()  # the real KubernetesCreateResourceOperator accepts these arguments
    delete.build()


def test_local_launcher_is_unchanged():
    dag = build_dag(TINY)
    assert type(dag.task_dict["train"]).__name__ == "TidalStepOperator"


def test_jobset_status():
    done = {"metadata": {"name": "j"}, "status": {"conditions": [{"type": "Completed", "status": "True"}]}}
    assert jobset_finished(done) and not jobset_finished({"metadata": {"name": "j"}, "status": {}})
    failed = {"metadata": {"name": "j"}, "status": {"restarts": 3, "conditions": [
        {"type": "Failed", "status": "True", "message": "maxRestarts reached"}]}}
    with pytest.raises(RuntimeError, match="after 3 restarts: maxRestarts reached"):
        jobset_finished(failed)


def test_prepare_then_commit_follows_the_commit_protocol(tmp_path, tiny_data, monkeypatch):
    from tidal.core.load import load_pipeline
    from tidal.core.remote import RemoteRunIncomplete, commit, prepare
    from tidal.core.runner import StepBlocked

    monkeypatch.setenv("TIDAL_SIZING_CACHE", str(tmp_path / "sizing"))  # empty: sized by the analytical plan
    path = write_recipe(tmp_path, {**tiny_data, "storage_root": str(tmp_path / "store")}, "pod", POD)
    pipe = load_pipeline(path, storage_root=str(tmp_path / "store"))
    with pytest.raises(StepBlocked):
        prepare(pipe, "train")
    train = pipe.graph["train"]
    for dep in train.inputs:  # pretend the inputs are committed
        (pipe.storage.step_dir(dep.step_id)).mkdir(parents=True)
        seal(pipe.storage.step_dir(dep.step_id))
    prepared = prepare(pipe, "train")
    out = Path(prepared["step_uri"])
    assert prepared["status"] == "run" and json.loads((out / "spec.json").read_text())["step_id"] == train.step_id
    with pytest.raises(RemoteRunIncomplete):
        commit(pipe, "train", started_at=prepared["started_at"], launcher="gke")
    (out / "summary.json").write_text(json.dumps({"steps": 1}))
    # the launch was sized first (issue 40, item 7): v5e 2x4, 8 chips, nothing compiled here
    sizing = prepared["sizing"]
    assert sizing["method"] == "analytical" and sizing["chips"] == 8 and "v5e 2x4" in sizing["where"], sizing
    assert 0 < sizing["hbm_per_chip_bytes"] < sizing["hbm_capacity_bytes"] and 0 < sizing["predicted_mfu"] < 1
    result = commit(pipe, "train", started_at=prepared["started_at"], launcher="gke", workload="tidal-x",
                    sizing=sizing)
    assert result.status == "run" and pipe.storage.is_committed(train.step_id)
    provenance = json.loads((out / "step.json").read_text())["provenance"]
    assert provenance["launcher"] == "gke" and provenance["sizing"] == sizing
    assert prepare(pipe, "train")["status"] == "skip"


@pytest.mark.parametrize("resources, task, xcoms", [
    (POD, "launch", {"step_uri": STEP_URI, "mlflow_tracking_uri": "", "mlflow_run_id": ""}),  # pushed empty
    (JOBSET, "create", {"step_uri": STEP_URI}),  # not pushed at all
], ids=["pod", "jobset"])
def test_without_a_live_run_the_pod_env_turns_live_metrics_off(tmp_path, tiny_data, monkeypatch, resources, task,
                                                                xcoms):
    from tidal.train.metrics import LiveMetrics

    dag = build_dag(write_recipe(tmp_path, tiny_data, "gke", resources))
    kwargs = rendered(dag.task_dict[f"train.{task}"], xcoms)
    manifest = kwargs["pod_template_dict"] if task == "launch" else yaml.safe_load(kwargs["yaml_conf"])
    validate(manifest)
    pod = manifest["spec"] if task == "launch" else \
        manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    env = env_of(pod)
    assert env["MLFLOW_TRACKING_URI"] == env["TIDAL_MLFLOW_RUN_ID"] == ""
    for name in LIVE_ENV:
        monkeypatch.setenv(name, env[name])
    assert LiveMetrics.from_env(tmp_path, {"step_id": "train-x"}) is None  # the trainer logs nothing live


def commit_inputs(pipe) -> None:
    """Mark the training step's inputs committed (their contents are not read here)."""
    for dep in pipe.graph["train"].inputs:
        pipe.storage.step_dir(dep.step_id).mkdir(parents=True)
        seal(pipe.storage.step_dir(dep.step_id))


def gke_context(tmp_path: Path, tiny_data: dict, monkeypatch, uri: str | None = None, run_id: str = "manual__1"):
    """A GKE-recipe DAG with the training step's inputs committed, tracking at ``uri`` (None:
    the storage root's SQLite), and a task context: ``(dag, pipe, ti, context)``."""
    from tidal.core.load import load_pipeline

    monkeypatch.delenv("TIDAL_STORAGE_ROOT", raising=False)
    if uri is None:
        monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    else:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        monkeypatch.setenv("TIDAL_TRACKING_PENDING_DIR", str(tmp_path / "pending"))
    monkeypatch.setenv("TIDAL_SIGNING_KEY", "ab" * 32)
    monkeypatch.setenv("TIDAL_SIZING_CACHE", str(tmp_path / "sizing"))  # empty: prepare sizes analytically
    path = write_recipe(tmp_path, {**tiny_data, "storage_root": str(tmp_path / "store")}, "pod", POD)
    dag = build_dag(path)
    pipe = load_pipeline(path)
    commit_inputs(pipe)
    ti = StubTI({})
    context = {"params": {}, "ti": ti, "dag_run": SimpleNamespace(dag_id=dag.dag_id, run_id=run_id)}
    return dag, pipe, ti, context


def test_prepare_and_commit_with_a_local_tracking_store(tmp_path, tiny_data, monkeypatch, capsys):
    """A SQLite store is on the Airflow worker: no live run, one log line, the step's run is
    recorded at commit as before."""
    from mlflow.tracking import MlflowClient

    dag, pipe, ti, context = gke_context(tmp_path, tiny_data, monkeypatch)
    store = tmp_path / "store"
    capsys.readouterr()
    assert dag.task_dict["train.prepare"].choose_branch(context) == ["train.launch", "train.commit"]
    assert ti.xcoms["mlflow_tracking_uri"] == ti.xcoms["mlflow_run_id"] == ""
    said = [line for line in capsys.readouterr().out.splitlines() if "no live metrics" in line]  # the task log
    assert len(said) == 1 and "(sqlite)" in said[0], said
    assert not (store / "mlflow.db").exists()  # nothing was opened in MLflow
    (Path(ti.xcoms["step_uri"]) / "summary.json").write_text(json.dumps({"steps": 1, "final_train_loss": 2.5}))
    out = dag.task_dict["train.commit"].execute(context)
    assert out["status"] == "run" and pipe.storage.is_committed(pipe.graph["train"].step_id)
    client = MlflowClient(pipe.tracking_uri)
    runs = client.search_runs([client.get_experiment_by_name(pipe.tracker().experiment).experiment_id])
    child = [r for r in runs if r.data.tags.get("tidal.step_id") == pipe.graph["train"].step_id]
    assert len(child) == 1 and child[0].info.status == "FINISHED" and child[0].data.metrics["final_train_loss"] == 2.5
    # prepare's sizing reached commit through its XCom: step.json and the run's tags (issue 40, item 7)
    sizing = ti.xcoms["prepared"]["sizing"]
    record = json.loads(pipe.storage.read_text(pipe.graph["train"].step_id, "step.json"))
    assert record["provenance"]["sizing"] == sizing and sizing["method"] == "analytical", record["provenance"]
    assert child[0].data.tags["tidal.sizing.predicted_mfu"] == str(sizing["predicted_mfu"])


@pytest.mark.slow
def test_prepare_opens_the_live_run_on_a_tracking_server_and_commit_completes_it(tmp_path, tiny_data, monkeypatch):
    """Real ``mlflow server`` on loopback (about a minute to start on a busy 2-core host)."""

    from mlflow.tracking import MlflowClient

    # by host name: a loopback URI is refused (in a pod it would be the pod itself)
    with hostname_mlflow_server(tmp_path) as uri:
        dag, pipe, ti, context = gke_context(tmp_path, tiny_data, monkeypatch, uri, run_id="manual__2")
        dag.task_dict["train.prepare"].choose_branch(context)
        run_id = ti.xcoms["mlflow_run_id"]
        assert ti.xcoms["mlflow_tracking_uri"] == uri and run_id
        client = MlflowClient(uri)
        live = client.get_run(run_id)
        assert live.info.status == "RUNNING" and live.data.tags["tidal.step_id"] == pipe.graph["train"].step_id
        assert live.data.tags["mlflow.parentRunId"]
        env = env_of(rendered(dag.task_dict["train.launch"], ti.xcoms)["pod_template_dict"]["spec"])
        assert env["MLFLOW_TRACKING_URI"] == uri and env["TIDAL_MLFLOW_RUN_ID"] == run_id
        client.log_metric(run_id, "loss", 3.0, step=1)  # what the pod's trainer logs live
        (Path(ti.xcoms["step_uri"]) / "summary.json").write_text(json.dumps({"steps": 1, "final_train_loss": 2.5}))
        dag.task_dict["train.commit"].execute(context)
        done = client.get_run(run_id)
        assert done.info.status == "FINISHED" and done.data.metrics["final_train_loss"] == 2.5
        children = client.search_runs([live.info.experiment_id],
                                      filter_string="tags.`mlflow.parentRunId` = "
                                                    f"'{live.data.tags['mlflow.parentRunId']}'")
        assert [r.info.run_id for r in children] == [run_id]  # completed, not duplicated


def test_a_failed_launch_closes_the_live_run_and_a_rerun_launch_completes_it(tmp_path, tiny_data, monkeypatch):
    """The pod never started (launch failed): the failure callback marks prepare's live run
    FAILED instead of leaving it RUNNING; the callback of a non-GKE task or of prepare itself
    touches nothing; a cleared launch that then succeeds is completed by commit (FINISHED).
    The live run is opened by hand on a SQLite store (prepare opens one only on a server a pod
    can reach: test_prepare_opens_the_live_run_on_a_tracking_server_and_commit_completes_it)."""
    from mlflow.tracking import MlflowClient

    from operators.callbacks import on_failure_callback
    from operators.step import run_key_of

    dag, pipe, ti, context = gke_context(tmp_path, tiny_data, monkeypatch, run_id="manual__3")
    dag.task_dict["train.prepare"].choose_branch(context)
    step = pipe.graph["train"]
    run_id = pipe.tracker().open_step_run(pipe.parent_run(run_key_of(context)), step.name, step.step_id, step.kind)
    ti.xcoms.update(mlflow_tracking_uri=pipe.tracking_uri, mlflow_run_id=run_id)
    client = MlflowClient(pipe.tracking_uri)
    assert client.get_run(run_id).info.status == "RUNNING"

    def failed(task_id):
        return {**context, "ti": SimpleNamespace(task_id=task_id, xcom_pull=ti.xcom_pull, try_number=1, map_index=-1),
                "task": dag.task_dict[task_id], "exception": RuntimeError("pod never started: ImagePullBackOff")}

    for task_id in ("train.prepare", "report"):  # not a launch of a GKE step: the run stays open
        on_failure_callback(failed(task_id))
        assert client.get_run(run_id).info.status == "RUNNING", task_id
    on_failure_callback(failed("train.launch"))
    run = client.get_run(run_id)
    assert run.info.status == "FAILED" and run.data.tags["tidal.status"] == "failed"
    # cleared launch succeeds: the pod logged into the same run; commit completes it
    (Path(ti.xcoms["step_uri"]) / "summary.json").write_text(json.dumps({"steps": 1, "final_train_loss": 2.5}))
    dag.task_dict["train.commit"].execute(context)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.metrics["final_train_loss"] == 2.5


def test_a_step_that_does_not_fit_fails_prepare_without_retry_and_writes_nothing(tmp_path, tiny_data, monkeypatch):
    """Issue 40, item 7: the refusal (here the one line a cached compiled sizing gives, tests/train/test_sizing.py)
    fails the prepare task for good, before spec.json or any pod."""
    from airflow.sdk.exceptions import AirflowFailException

    from tidal.core import remote
    from tidal.train.preflight import SizingRefused

    dag, pipe, ti, context = gke_context(tmp_path, tiny_data, monkeypatch)
    line = "train on v5e 2x4 (8 chips, 1 host) does not fit: the TPU compiler refused it (RESOURCE_EXHAUSTED)"

    def refuse(step, recipe):
        raise SizingRefused(line)

    monkeypatch.setattr(remote, "preflight", refuse)
    with pytest.raises(AirflowFailException, match=r"^error: train on v5e 2x4") as failed:
        dag.task_dict["train.prepare"].choose_branch(context)
    assert str(failed.value) == f"error: {line}" and "prepared" not in ti.xcoms
    assert not pipe.storage.resumable_dir(pipe.graph["train"].step_id).joinpath("spec.json").exists()
