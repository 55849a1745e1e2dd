"""Deployment secrets for training pods ($TIDAL_POD_SECRET_ENV): parsing, refusals, and the
rendered Pod and JobSet read them through secretKeyRef (Kubernetes OpenAPI schema, hardening)."""

from __future__ import annotations

import json

import pytest
import yaml

from operators.dag_factory import build_dag
from tests.launch.test_pods import validate
from tests.operators.test_gke import JOBSET, POD, rendered, write_recipe
from tidal.launch.hardening import violations
from tidal.launch.pods import SpecError, pod_secret_env

TOKEN = {"MLFLOW_TRACKING_TOKEN": ["tidal-mlflow-auth", "token"]}


def test_a_json_object_maps_env_names_to_secret_keys():
    assert pod_secret_env(json.dumps(TOKEN)) == {"MLFLOW_TRACKING_TOKEN": ("tidal-mlflow-auth", "token")}
    assert pod_secret_env(None) == pod_secret_env("") == pod_secret_env("  ") == {}
    two = {"MLFLOW_TRACKING_USERNAME": ["mlflow.auth", "user"],
           "MLFLOW_TRACKING_PASSWORD": ["mlflow.auth", "pass.word"]}
    assert pod_secret_env(json.dumps(two)) == {k: tuple(v) for k, v in two.items()}


@pytest.mark.parametrize(("value", "says"), [
    ("{not json", "TIDAL_POD_SECRET_ENV is not JSON"),
    ('["MLFLOW_TRACKING_TOKEN"]', "must be a JSON object"),
    ('{"1BAD": ["s", "k"]}', "'1BAD' is not an environment variable name"),
    ('{"MLFLOW_TRACKING_URI": ["s", "k"]}', "set by tidal itself"),
    ('{"JAX_PROCESS_ID": ["s", "k"]}', "set by tidal itself"),
    ('{"TOKEN": "tidal-mlflow-auth"}', 'must map to ["secret name", "key"]'),
    ('{"TOKEN": ["s", "k", "x"]}', 'must map to ["secret name", "key"]'),
    ('{"TOKEN": ["Upper_Case", "k"]}', "is not a DNS-1123 subdomain"),
    ('{"TOKEN": ["s", "a/b"]}', "must match [-._a-zA-Z0-9]+"),
])
def test_bad_settings_are_refused_naming_the_variable_and_entry(value, says):
    with pytest.raises(SpecError) as err:
        pod_secret_env(value)
    assert says in str(err.value) and "TIDAL_POD_SECRET_ENV" in str(err.value)


def secret_refs(pod_spec: dict) -> dict:
    return {e["name"]: e["valueFrom"]["secretKeyRef"] for e in pod_spec["containers"][0]["env"]
            if "secretKeyRef" in e.get("valueFrom", {})}


def test_pods_and_jobsets_read_the_secrets_through_secret_key_ref(tmp_path, tiny_data, monkeypatch):
    from kubernetes.client import ApiClient

    monkeypatch.setenv("TIDAL_POD_SECRET_ENV", json.dumps(TOKEN))
    want = {"MLFLOW_TRACKING_TOKEN": {"name": "tidal-mlflow-auth", "key": "token"}}
    launch = build_dag(write_recipe(tmp_path, tiny_data, "pod", POD)).task_dict["train.launch"]
    rendered(launch)
    pod = ApiClient().sanitize_for_serialization(launch.build().build_pod_request_obj(dry_run=True))
    validate(pod)
    assert violations(pod) == [] and secret_refs(pod["spec"]) == want
    create = build_dag(write_recipe(tmp_path, tiny_data, "gke", JOBSET)).task_dict["train.create"]
    jobset = yaml.safe_load(rendered(create)["yaml_conf"])
    validate(jobset)
    assert violations(jobset) == []
    assert secret_refs(jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]) == want


def test_without_the_setting_pods_get_no_secret_and_a_bad_one_fails_the_dag(tmp_path, tiny_data, monkeypatch):
    monkeypatch.delenv("TIDAL_POD_SECRET_ENV", raising=False)
    path = write_recipe(tmp_path, tiny_data, "pod", POD)
    launch = build_dag(path).task_dict["train.launch"]
    assert secret_refs(rendered(launch)["pod_template_dict"]["spec"]) == {}
    monkeypatch.setenv("TIDAL_POD_SECRET_ENV", '{"MLFLOW_TRACKING_TOKEN": "no-key"}')
    with pytest.raises(SpecError, match="TIDAL_POD_SECRET_ENV: 'MLFLOW_TRACKING_TOKEN' must map to"):
        build_dag(path)
