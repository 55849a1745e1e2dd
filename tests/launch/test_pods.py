"""Every workload of the hardware matrix: Kubernetes schema-valid, hardened, and as reviewed.

Schema: core objects (Pod, the Jobs inside a JobSet) are validated with ``kubernetes-validate``
against the bundled OpenAPI schema of Kubernetes ``K8S_VERSION`` in strict mode (unknown fields
are errors). JobSet is a CRD that package does not know, so its own shape is checked with
``JOBSET_SCHEMA`` below, written from the JobSet v1alpha2 API types
(sigs.k8s.io/jobset api/jobset/v1alpha2/jobset_types.go: JobSetSpec, ReplicatedJob,
FailurePolicy, SuccessPolicy, Network), and each replicated job's template is validated as a
core ``batch/v1`` Job.

Golden files: ``TIDAL_REGEN_GOLDEN=1 .venv/bin/pytest tests/launch/test_pods.py`` rewrites them.
"""

from __future__ import annotations

import os
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tidal.launch.hardening import violations
from tidal.launch.local import entrypoint_command
from tidal.launch.pods import (
    POD_COMMAND,
    SpecError,
    is_single_pod,
    live_metrics_env,
    pod_tracking_uri,
    workload,
)
from tidal.launch.resources import GPU_TYPES, TPU_TYPES
from tidal.recipe import ResourceConfig

K8S_VERSION = "1.37.0"
GOLDEN = Path(__file__).parent / "golden"
STEP_URI = "s3://tidal-runs/tiny/train-0123456789ab"
NAME = "tidal-train-0123456789ab"
LABELS = {"tidal.dev/recipe": "tiny", "tidal.dev/step": "train", "tidal.dev/step-id": "train-0123456789ab"}
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
SERVER_URI = "http://tidal-mlflow.tidal:5000"  # the chart's tracking server (helm/tidal/values.yaml)
RUN_ID = "5d1c0e4b7a2f4e9c8b3a6d0f1e2c3b4a"

JOBSET_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "jobset.x-k8s.io/v1alpha2"},
        "kind": {"const": "JobSet"},
        "metadata": {"type": "object", "required": ["name"],
                     "properties": {"name": {"type": "string", "pattern": DNS_LABEL, "maxLength": 63},
                                    "namespace": {"type": "string"},
                                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                                    "annotations": {"type": "object", "additionalProperties": {"type": "string"}}}},
        "spec": {
            "type": "object", "required": ["replicatedJobs"], "additionalProperties": False,
            "properties": {
                "replicatedJobs": {"type": "array", "minItems": 1, "items": {
                    "type": "object", "required": ["name", "template"], "additionalProperties": False,
                    "properties": {"name": {"type": "string", "pattern": DNS_LABEL},
                                   "replicas": {"type": "integer", "minimum": 1},
                                   "dependsOn": {"type": "array"},
                                   "template": {"type": "object", "required": ["spec"],
                                                "properties": {"metadata": {"type": "object"},
                                                               "spec": {"type": "object"}}}}}},
                "network": {"type": "object", "additionalProperties": False,
                            "properties": {"enableDNSHostnames": {"type": "boolean"},
                                           "subdomain": {"type": "string"},
                                           "publishNotReadyAddresses": {"type": "boolean"}}},
                "successPolicy": {"type": "object", "required": ["operator"], "additionalProperties": False,
                                  "properties": {"operator": {"enum": ["All", "Any"]},
                                                 "targetReplicatedJobs": {"type": "array",
                                                                          "items": {"type": "string"}}}},
                "failurePolicy": {"type": "object", "additionalProperties": False,
                                  "properties": {"maxRestarts": {"type": "integer", "minimum": 0},
                                                 "restartStrategy": {"enum": ["Recreate", "BlockingRecreate"]},
                                                 "rules": {"type": "array"}}},
                "startupPolicy": {"type": "object",
                                  "properties": {"startupPolicyOrder": {"enum": ["AnyOrder", "InOrder"]}}},
                "suspend": {"type": "boolean"},
                "coordinator": {"type": "object"},
                "managedBy": {"type": "string"},
                "ttlSecondsAfterFinished": {"type": "integer", "minimum": 0},
            },
        },
    },
}


def validate(manifest: dict) -> None:
    """Schema-validate a Pod or a JobSet (and each Job template inside it); raises on error."""
    if manifest["kind"] == "JobSet":
        jsonschema.validate(manifest, JOBSET_SCHEMA)
        for rjob in manifest["spec"]["replicatedJobs"]:
            job = {"apiVersion": "batch/v1", "kind": "Job",
                   "metadata": {"name": f"{manifest['metadata']['name']}-{rjob['name']}-0",
                                **{k: v for k, v in rjob["template"].get("metadata", {}).items()}},
                   "spec": rjob["template"]["spec"]}
            kubernetes_validate.validate(job, K8S_VERSION, strict=True)
    else:
        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


def matrix() -> list[tuple[str, dict]]:
    """Every TPU type x topology, every GPU type x per-node count, CPU; each with spot off and on."""
    cases: list[tuple[str, dict]] = []
    for key, tpu in TPU_TYPES.items():
        for topo in tpu.topologies.values():
            cases.append((f"{tpu.name}-{topo.topology}", {"kind": "tpu", "type": key, "topology": topo.topology}))
            if topo.multi_host:
                cases.append((f"{tpu.name}-{topo.topology}-x2", {"kind": "tpu", "type": key,
                                                                 "topology": topo.topology, "slices": 2}))
    for key, gpu in GPU_TYPES.items():
        for count in gpu.counts:
            cases.append((f"{key}-{count}", {"kind": "gpu", "type": key, "count": count}))
        cases.append((f"{key}-x2nodes", {"kind": "gpu", "type": key, "count": max(gpu.counts), "nodes": 2}))
    cases += [("cpu", {"kind": "cpu"}), ("cpu-x4nodes", {"kind": "cpu", "nodes": 4})]
    return [(f"{name}-{'spot' if spot else 'ondemand'}", {"accelerator": acc, "spot": spot, "launcher": "gke",
                                                           "priority_class": "tidal-train-spot" if spot else None})
            for name, acc in cases for spot in (False, True)]


MATRIX = matrix()


def build(resources: dict) -> dict:
    return workload(ResourceConfig.model_validate(resources), name=NAME, step_uri=STEP_URI, labels=LABELS,
                    secret_env={"MLFLOW_TRACKING_TOKEN": ("tidal-mlflow", "token")})


def test_matrix_is_complete():
    assert len(MATRIX) > 80
    kinds = {(r["accelerator"]["kind"], r["spot"]) for _, r in MATRIX}
    assert kinds == {(k, s) for k in ("cpu", "gpu", "tpu") for s in (False, True)}


def test_every_spec_is_schema_valid_hardened_and_placed():
    for case, resources in MATRIX:
        manifest = build(resources)
        validate(manifest)
        assert violations(manifest) == [], case
        config = ResourceConfig.model_validate(resources)
        pods = [manifest["spec"]] if manifest["kind"] == "Pod" else [
            r["template"]["spec"]["template"]["spec"] for r in manifest["spec"]["replicatedJobs"]]
        for spec in pods:
            container = spec["containers"][0]
            assert container["command"] + container["args"] == [*POD_COMMAND, STEP_URI]
            assert spec["terminationGracePeriodSeconds"] == config.grace_seconds
            selector, res = spec.get("nodeSelector", {}), container["resources"]
            assert (selector.get("cloud.google.com/gke-spot") == "true") == config.spot, case
            assert any(t["key"] == "cloud.google.com/gke-spot" for t in spec.get("tolerations", [])) == config.spot
            assert spec.get("priorityClassName") == config.priority_class
            for name in ("google.com/tpu", "nvidia.com/gpu"):
                assert res["requests"].get(name) == res["limits"].get(name), case
        deadline = (manifest["spec"]["activeDeadlineSeconds"] if manifest["kind"] == "Pod" else
                    manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["activeDeadlineSeconds"])
        assert deadline == config.deadline_seconds


def test_shapes_follow_the_topology_table():
    for case, resources in MATRIX:
        acc = resources["accelerator"]
        manifest = build(resources)
        if acc["kind"] == "tpu":
            tpu = TPU_TYPES[acc["type"]]
            topo = tpu.topologies[acc["topology"]]
            expect_single = not topo.multi_host and acc.get("slices", 1) == 1
            assert (manifest["kind"] == "Pod") == expect_single, case
            if manifest["kind"] == "JobSet":
                rjob = manifest["spec"]["replicatedJobs"][0]
                job = rjob["template"]["spec"]
                assert rjob["replicas"] == acc.get("slices", 1)
                assert job["parallelism"] == job["completions"] == topo.hosts
                assert job["completionMode"] == "Indexed"
                spec = job["template"]["spec"]
            else:
                spec = manifest["spec"]
            assert spec["nodeSelector"]["cloud.google.com/gke-tpu-accelerator"] == acc["type"]
            assert spec["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == acc["topology"]
            assert spec["containers"][0]["resources"]["limits"]["google.com/tpu"] == str(topo.chips_per_host)
            # GKE injects the TPU worker env: we must not set our own coordinator
            assert not any(e["name"].startswith("JAX_") for e in spec["containers"][0]["env"])
        elif acc.get("nodes", 1) > 1:
            spec = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
            env = {e["name"]: e for e in spec["containers"][0]["env"]}
            assert env["JAX_COORDINATOR_ADDRESS"]["value"] == f"{NAME}-workers-0-0.{NAME}:8476"
            assert env["JAX_NUM_PROCESSES"]["value"] == str(acc["nodes"])
            assert "job-completion-index" in env["JAX_PROCESS_ID"]["valueFrom"]["fieldRef"]["fieldPath"]
        else:
            assert manifest["kind"] == "Pod"


def test_pod_runs_the_local_entrypoint():
    assert entrypoint_command("DIR")[1:] == [*POD_COMMAND[1:], "DIR"]


def test_schema_validation_and_hardening_catch_mistakes():
    manifest = build(MATRIX[0][1])
    manifest["spec"]["containers"][0]["resources"]["limits"]["google.com/tpu"] = {"chips": 8}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(manifest)
    bad = build(MATRIX[0][1])
    bad["spec"]["automountServiceAccountToken"] = True
    bad["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] = False
    bad["spec"]["containers"][0]["env"].append({"name": "HF_TOKEN", "value": "hf_abc"})
    found = violations(bad)
    assert len(found) == 3 and any("HF_TOKEN" in v for v in found)
    jobset = build({"accelerator": {"kind": "tpu", "type": "v5p", "topology": "2x2x2"}})
    jobset["spec"]["replicatedJobs"][0]["replicas"] = 0
    with pytest.raises(jsonschema.ValidationError):
        validate(jobset)


def test_secret_literals_and_bad_names_are_refused():
    config = ResourceConfig()
    with pytest.raises(SpecError, match="secretKeyRef"):
        workload(config, name=NAME, step_uri=STEP_URI, env={"AWS_SECRET_ACCESS_KEY": "x"})
    with pytest.raises(SpecError, match="DNS-1123"):
        workload(config, name="Tidal_Train", step_uri=STEP_URI)
    multi = ResourceConfig(accelerator={"kind": "cpu", "nodes": 2})
    assert not is_single_pod(multi)
    with pytest.raises(SpecError, match="at most 40"):
        workload(multi, name="t" * 41, step_uri=STEP_URI)


def pod_specs(manifest: dict) -> list[dict]:
    """The pod spec(s) of a Pod or JobSet manifest."""
    if manifest["kind"] == "Pod":
        return [manifest["spec"]]
    return [r["template"]["spec"]["template"]["spec"] for r in manifest["spec"]["replicatedJobs"]]


def test_training_pods_get_the_live_metrics_env_of_a_tracking_server():
    from tidal.train.metrics import RUN_ID_ENV, URI_ENV

    env = live_metrics_env(SERVER_URI, RUN_ID)
    assert env == {"MLFLOW_TRACKING_URI": SERVER_URI, "TIDAL_MLFLOW_RUN_ID": RUN_ID}
    assert set(env) == {URI_ENV, RUN_ID_ENV}  # the names the trainer reads
    shapes = {"pod": {"kind": "cpu"}, "cpu-jobset": {"kind": "cpu", "nodes": 2},
              "tpu-multislice": {"kind": "tpu", "type": "tpu-v5p-slice", "topology": "2x2x4", "slices": 2}}
    for case, acc in shapes.items():
        manifest = workload(ResourceConfig.model_validate({"launcher": "gke", "accelerator": acc}), name=NAME,
                            step_uri=STEP_URI, labels=LABELS, env=env,
                            secret_env={"MLFLOW_TRACKING_TOKEN": ("tidal-mlflow", "token")})
        validate(manifest)
        assert violations(manifest) == [], case
        for spec in pod_specs(manifest):
            got = {e["name"]: e for e in spec["containers"][0]["env"]}
            assert got[URI_ENV] == {"name": URI_ENV, "value": SERVER_URI}, case
            assert got[RUN_ID_ENV] == {"name": RUN_ID_ENV, "value": RUN_ID}, case
            assert got["MLFLOW_TRACKING_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "tidal-mlflow", "key": "token"}


@pytest.mark.parametrize("uri", ["sqlite:////srv/tidal/mlflow.db", "file:///srv/tidal/mlruns", "/srv/tidal/mlruns",
                                 "postgresql://tidal:pw@db:5432/mlflow", "http://tidal:pw@mlflow:5000",
                                 "http://localhost:5000", "http://127.0.0.1:5000", "http://[::1]:5000",
                                 "http://0.0.0.0:5000",
                                 "http://mlflow:5000/it's", "", None])
def test_no_live_metrics_env_for_a_store_a_pod_cannot_reach(uri):
    assert pod_tracking_uri(uri) is None
    assert live_metrics_env(uri, RUN_ID) == {}


def test_no_live_metrics_env_without_a_run():
    for uri in ("https://mlflow.example.org/tidal", "http://10.8.0.12:5000", "http://[fd00::2]:5000/"):
        assert pod_tracking_uri(uri) == uri
    assert live_metrics_env(SERVER_URI, None) == live_metrics_env(SERVER_URI, "") == {}


GOLDEN_CASES = {
    "tpu-v5e-2x4-single-host.yaml": {"launcher": "gke", "accelerator": {"kind": "tpu", "type": "tpu-v5-lite-podslice",
                                                                        "topology": "2x4"}},
    "tpu-v5p-2x2x4-multislice-jobset.yaml": {"launcher": "gke", "priority_class": "tidal-train",
                                             "accelerator": {"kind": "tpu", "type": "tpu-v5p-slice",
                                                             "topology": "2x2x4", "slices": 2}},
    "gpu-h100-8.yaml": {"launcher": "gke", "accelerator": {"kind": "gpu", "type": "nvidia-h100-80gb", "count": 8},
                        "memory": "1000Gi", "cpu": "200"},
    "cpu-spot.yaml": {"launcher": "gke", "spot": True},
}


@pytest.mark.parametrize("filename", sorted(GOLDEN_CASES))
def test_golden_files_match_the_builder(filename):
    text = "# generated by tests/launch/test_pods.py (TIDAL_REGEN_GOLDEN=1 to rewrite); reviewed by hand\n"
    text += yaml.safe_dump(build(GOLDEN_CASES[filename]), sort_keys=False)
    path = GOLDEN / filename
    if os.environ.get("TIDAL_REGEN_GOLDEN"):
        path.write_text(text)
    assert path.read_text() == text, f"{path} differs from the builder; TIDAL_REGEN_GOLDEN=1 rewrites it"
