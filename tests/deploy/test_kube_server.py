"""The chart and every training workload against a real kube-apiserver (tests/cluster/kube.py).

What the schemas (kubernetes-validate, values.schema.json) accepted is here put to the upstream
API server v1.37 with etcd: the rendered chart applied (server-side dry run, then for real), the
JobSet CRD's own schema, Pod Security Admission on the training namespace, and the training
RBAC exercised with tokens the server signs for the Airflow service accounts.
"""

from __future__ import annotations

import json

import pytest
import yaml

from tests.deploy.chart import RELEASE, chart_copy, chart_values, documents, rendered
from tests.deploy.kube_checks import (
    admit_matrix,
    dry_run_create,
    matrix_objects,
    namespace,
    privileged,
    rbac_report,
    service_account_token,
)
from tests.launch.test_pods import MATRIX
from tidal.launch.hardening import violations
from tidal.launch.pods import workload
from tidal.recipe import ResourceConfig


@pytest.fixture(scope="module")
def chart(tmp_path_factory):
    return chart_copy(tmp_path_factory.mktemp("chart"))


@pytest.mark.parametrize("values_file", ["values-dev.yaml", "values-prod.yaml"])
def test_the_rendered_chart_is_accepted_by_the_server_without_warnings(kube, chart, values_file):
    text = rendered(chart, values_file)
    objects = [obj for _, obj in documents(text)]
    namespaces = [namespace(RELEASE["Namespace"])] + [obj for obj in objects if obj["kind"] == "Namespace"]
    kube.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(namespaces))  # a dry run cannot fill them
    result = kube.kubectl("apply", "--dry-run=server", "-f", "-", stdin=text, check=False)
    assert result.returncode == 0, result.stderr
    assert "Warning" not in result.stderr, result.stderr  # e.g. Pod Security warnings on the MLflow pods
    applied = {line.split()[0].split("/", 1)[1] for line in result.stdout.splitlines()}
    assert applied == {obj["metadata"]["name"] for obj in objects}


def test_every_values_file_keeps_the_priority_values_the_server_cannot_change(kube, installed, chart):
    """PriorityClasses are cluster-scoped and their ``value`` is immutable: the server refuses an
    upgrade that changes it (found by applying the dev values over the prod release), so every
    values file renders the same classes as the installed release."""
    def classes(values_file):
        return {obj["metadata"]["name"]: obj for _, obj in documents(rendered(chart, values_file))
                if obj["kind"] == "PriorityClass"}

    prod = classes("values-prod.yaml")
    assert {name: obj["value"] for name, obj in prod.items()} == {"tidal-train-high": 1000000,
                                                                  "tidal-train-spot": 1000}
    for values_file in ("values.yaml", "values-dev.yaml"):
        assert {n: o["value"] for n, o in classes(values_file).items()} == {n: o["value"] for n, o in prod.items()}
    changed = {**prod["tidal-train-high"], "value": 100000}
    result = kube.kubectl("apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(changed), check=False)
    assert result.returncode != 0 and "may not be changed in an update" in result.stderr, result.stderr


def test_the_training_namespace_enforces_restricted_pod_security(kube, installed):
    labels = kube.get_json("namespace", installed["training"]["namespace"])["metadata"]["labels"]
    assert installed["training"]["podSecurity"] == "restricted"
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


def _realistic_recipes() -> list[tuple[str, dict]]:
    """The train resources of recipes/gke/ (issue 40, item 6), as matrix cases."""
    from tests.conftest import REPO
    from tidal.recipe import load_recipe

    return [(path.stem, load_recipe(path).train.resources.model_dump(mode="json", exclude={"namespace"}))
            for path in sorted((REPO / "recipes" / "gke").glob("*.yaml"))]


def test_every_workload_of_the_matrix_is_admitted_in_the_training_namespace(kube, installed):
    """Pods, JobSets (the CRD's schema) and the Jobs and Pods inside them, under Pod Security
    ``restricted``, with the chart's priority classes and service account; the realistic recipes' too."""
    recipes = _realistic_recipes()
    accepted, total, refusals = admit_matrix(kube, MATRIX + recipes, installed["training"]["namespace"])
    assert (accepted, refusals) == (total, "")
    assert total == len(MATRIX) + len(recipes) and len(MATRIX) > 80 and len(recipes) == 5


def test_a_privileged_pod_is_rejected_by_pod_security_admission(kube, installed):
    training = installed["training"]["namespace"]
    objects = matrix_objects(MATRIX, training)
    (key, (_, pod)) = next((k, v) for k, v in objects.items() if k.startswith("pod/"))
    bad = privileged(pod)
    assert violations(bad)  # tidal's own check refuses it too
    accepted, refusals = dry_run_create(kube, [bad])
    assert accepted == set()
    assert f'pods "{pod["metadata"]["name"]}" is forbidden: violates PodSecurity "restricted:latest"' in refusals
    assert "privileged" in refusals
    accepted, refusals = dry_run_create(kube, [pod])
    assert accepted == {key}, refusals


def test_a_jobset_the_crd_schema_refuses_is_rejected(kube, installed):
    config = ResourceConfig.model_validate({"accelerator": {"kind": "cpu", "nodes": 2}, "launcher": "gke",
                                            "namespace": installed["training"]["namespace"]})
    manifest = workload(config, name="w-bad", step_uri="s3://b/s")
    manifest["spec"]["failurePolicy"]["restartStrategy"] = "Sometimes"
    accepted, refusals = dry_run_create(kube, [manifest])
    assert accepted == set() and "restartStrategy" in refusals, refusals


def test_the_launchers_may_launch_training_and_nothing_else(kube, installed):
    """SelfSubjectAccessReviews with tokens the server signed for the worker and triggerer accounts
    (created by the Airflow chart, here its stand-in) and for the training pods' own account."""
    report = rbac_report(kube, installed)
    assert report == {key: [] for key in report}
    assert len(report) == 5


def test_a_launcher_token_creates_reads_and_deletes_a_training_pod_and_is_refused_secrets(kube, installed):
    training = installed["training"]["namespace"]
    token = service_account_token(kube, installed["training"]["launchers"]["worker"], RELEASE["Namespace"])
    config = ResourceConfig.model_validate({"accelerator": {"kind": "cpu"}, "launcher": "gke", "namespace": training})
    pod = workload(config, name="tidal-train-rbac", step_uri="s3://b/s")
    kube.kubectl("create", "-f", "-", stdin=json.dumps(pod), token=token)
    got = json.loads(kube.kubectl("get", "pod", "tidal-train-rbac", "-n", training, "-o", "json", token=token).stdout)
    assert got["spec"]["serviceAccountName"] == installed["serviceAccounts"]["train"]["name"]
    assert got["spec"]["automountServiceAccountToken"] is False
    kube.kubectl("delete", "pod", "tidal-train-rbac", "-n", training, "--wait=false", token=token)
    for args in (["get", "secrets", "-n", training], ["get", "pods", "-n", "default"], ["get", "nodes"],
                 ["create", "-n", "default", "-f", "-"]):
        result = kube.kubectl(*args, token=token, check=False,
                              stdin=json.dumps({**pod, "metadata": {**pod["metadata"], "namespace": "default"}}))
        assert result.returncode != 0 and "forbidden" in result.stderr.lower(), (args, result.stderr)


def test_values_files_keep_the_training_namespace_of_the_recipes(installed):
    assert installed["training"]["namespace"] == ResourceConfig().namespace == chart_values("values.yaml")[
        "training"]["namespace"]
