"""The GKE variant of the tiny DAG: it parses light, renders, and its operators carry the
arguments chosen on purpose; the pod the real KubernetesPodOperator would create is
schema-valid and hardened. Nothing runs on a cluster here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from operators.dag_factory import build_dag
from operators.gke import ProviderOperator, jobset_finished
from tests.conftest import REPO, TINY
from tests.launch.test_pods import K8S_VERSION, validate
from tidal.launch.hardening import violations
from tidal.planner import build_graph
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


class StubTI:
    """Just enough of a task instance for Jinja: the prepare task's XCom."""

    def xcom_pull(self, task_ids=None, key=None):
        assert (task_ids, key) == ("train.prepare", "step_uri")
        return STEP_URI


def rendered(op) -> dict:
    op.render_template_fields({"ti": StubTI()})
    return op.operator_kwargs


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
    assert heavy == ""
    assert float(elapsed) < 2.0
    assert tasks == "train.commit,train.create,train.delete,train.prepare,train.wait"


def test_resources_never_change_step_ids(tiny_data):
    ids = {json.dumps(r): {s.name: s.step_id for s in build_graph(parse_recipe(
        {**tiny_data, "train": {**tiny_data["train"], "resources": r}}))} for r in ({}, POD, JOBSET)}
    assert len({json.dumps(v, sort_keys=True) for v in ids.values()}) == 1


def test_single_host_variant_renders_a_valid_hardened_pod(tmp_path, tiny_data):
    from kubernetes.client import ApiClient

    dag = build_dag(write_recipe(tmp_path, tiny_data, "pod", POD))
    prepare, launch, commit = (dag.task_dict[f"train.{t}"] for t in ("prepare", "launch", "commit"))
    assert prepare.upstream_task_ids == {"gate", "mix", "tokenize-udhr", "tokenizer"}
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


def test_prepare_then_commit_follows_the_commit_protocol(tmp_path, tiny_data):
    from tidal.launch.remote import RemoteRunIncomplete, commit, prepare
    from tidal.pipeline import Pipeline
    from tidal.runner import StepBlocked

    path = write_recipe(tmp_path, {**tiny_data, "storage_root": str(tmp_path / "store")}, "pod", POD)
    pipe = Pipeline.load(path, storage_root=str(tmp_path / "store"))
    with pytest.raises(StepBlocked):
        prepare(pipe, "train")
    train = pipe.graph["train"]
    for dep in train.inputs:  # pretend the inputs are committed
        (pipe.storage.step_dir(dep.step_id)).mkdir(parents=True)
        (pipe.storage.step_dir(dep.step_id) / "_SUCCESS").write_text("x\n")
    prepared = prepare(pipe, "train")
    out = Path(prepared["step_uri"])
    assert prepared["status"] == "run" and json.loads((out / "spec.json").read_text())["step_id"] == train.step_id
    with pytest.raises(RemoteRunIncomplete):
        commit(pipe, "train", started_at=prepared["started_at"], launcher="gke")
    (out / "summary.json").write_text(json.dumps({"steps": 1}))
    result = commit(pipe, "train", started_at=prepared["started_at"], launcher="gke", workload="tidal-x")
    assert result.status == "run" and pipe.storage.is_committed(train.step_id)
    assert json.loads((out / "step.json").read_text())["provenance"]["launcher"] == "gke"
    assert prepare(pipe, "train")["status"] == "skip"
