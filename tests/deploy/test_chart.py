"""helm/tidal: values files against values.schema.json, and the chart as real Helm renders it.

``helm`` is built from helm.sh/helm/v4 by ``tools/k8s/install.sh`` (``make tools``). The chart's
Airflow dependency (the official chart, whose repository cannot be reached here) is replaced in a
copy of the chart by ``tests/deploy/airflow_standin``, which renders only the service accounts the
real chart creates from the same values. ``helm lint --strict`` and ``helm template`` run on that
copy with each values file (Helm also checks values.schema.json then); the rendered objects are
validated offline with kubernetes-validate here, and against a real API server in
``tests/deploy/test_kube_server.py``.
"""

from __future__ import annotations

import fnmatch
import json
import re
import tomllib
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.deploy.chart import (
    CHART,
    RELEASE,
    ROOT,
    VALUES_FILES,
    chart_copy,
    chart_values,
    documents,
    helm,
    rendered,
    values_args,
)

KUBERNETES_VERSIONS = ("1.29.0", "1.37.0")  # Chart.yaml kubeVersion floor, kubernetes-validate's newest


@pytest.fixture(scope="module")
def chart(tmp_path_factory) -> Path:
    return chart_copy(tmp_path_factory.mktemp("chart"))


@pytest.fixture(scope="module")
def render_all(chart) -> dict[str, list[tuple[str, dict]]]:
    return {values_file: documents(rendered(chart, values_file)) for values_file in VALUES_FILES}


@pytest.fixture(scope="module")
def manifests(render_all):
    """``manifests(values_file)``: the objects of tidal's own templates (not the Airflow stand-in's)."""
    return lambda values_file: [obj for source, obj in render_all[values_file]
                                if source.startswith("tidal/templates/")]


def by_kind(objects: list[dict], kind: str) -> list[dict]:
    return [obj for obj in objects if obj["kind"] == kind]


@pytest.fixture(scope="module")
def schema() -> dict:
    document = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(document)
    return document


def schema_errors(schema: dict, values: dict) -> list[str]:
    validator = jsonschema.Draft202012Validator(schema)
    return [f"{'.'.join(map(str, error.absolute_path))}: {error.message}" for error in validator.iter_errors(values)]


# --- Chart.yaml --------------------------------------------------------------------------------

def test_chart_depends_on_a_pinned_official_airflow_chart():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    (airflow,) = [dep for dep in chart["dependencies"] if dep["name"] == "airflow"]
    assert airflow["repository"] == "https://airflow.apache.org"
    assert re.fullmatch(r"\d+\.\d+\.\d+", airflow["version"]), "pin an exact chart version, not a range"
    # Airflow 3 support arrived in chart 1.16.0; 1.22.0 added workers.kubernetes.serviceAccount.
    assert tuple(map(int, airflow["version"].split("."))) >= (1, 22, 0)


# --- values.schema.json ------------------------------------------------------------------------

@pytest.mark.parametrize("values_file", VALUES_FILES)
def test_values_files_match_the_schema(schema, values_file):
    assert schema_errors(schema, chart_values(values_file)) == []


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda v: v["mlflow"].update(artifactDestination="gs://b/x"), "artifactDestination"),
        (lambda v: v.update(trainig={"namespace": "x"}), "trainig"),
        (lambda v: v["serviceAccounts"]["train"].update(gcpServiceaccount="a@b.iam.gserviceaccount.com"),
         "gcpServiceaccount"),
        (lambda v: v["mlflow"].update(replicas="2"), "mlflow.replicas"),
        (lambda v: v["training"].update(createNamespace="yes"), "training.createNamespace"),
        (lambda v: v["training"]["priority"].update(high=1.5), "training.priority.high"),
        (lambda v: v["training"].update(podSecurity="strict"), "training.podSecurity"),
        (lambda v: v["training"].update(namespace="Tidal_Train"), "training.namespace"),
        (lambda v: v["serviceAccounts"]["mlflow"].update(gcpServiceAccount="tidal-mlflow"),
         "serviceAccounts.mlflow.gcpServiceAccount"),
        (lambda v: v["mlflow"].update(artifactsDestination="/var/mlflow"), "mlflow.artifactsDestination"),
        (lambda v: v["mlflow"]["resources"]["requests"].update(gpu=1), "gpu"),
        (lambda v: v["mlflow"].pop("backendStoreSecret"), "backendStoreSecret"),
        (lambda v: v["mlflow"]["auth"].update(defaultPermission="EDIT"), "mlflow.auth.defaultPermission"),
        (lambda v: v["mlflow"]["auth"].update(adminPassword="hunter2hunter2"), "adminPassword"),
        (lambda v: v["mlflow"]["auth"].pop("secret"), "secret"),
        (lambda v: v["mlflow"]["auth"].update(enabled="true"), "mlflow.auth.enabled"),
        (lambda v: v["networkPolicies"].update(enable=True), "enable"),
        (lambda v: v["networkPolicies"]["mlflow"].update(extraFrom=[{"podSelectr": {}}]), "podSelectr"),
    ],
    ids=["typo-mlflow-key", "typo-top-level-key", "typo-nested-key", "replicas-string", "bool-string",
         "priority-float", "bad-enum", "bad-namespace", "bad-gsa", "local-artifacts", "unknown-resource",
         "missing-secret", "auth-permission", "auth-password-in-values", "auth-missing-secret", "auth-bool-string",
         "netpol-typo", "netpol-peer-typo"],
)
def test_schema_rejects_typos_and_bad_types(schema, mutate, expected):
    values = chart_values("values-prod.yaml")
    mutate(values)
    errors = schema_errors(schema, values)
    assert errors, "expected a validation error"
    assert any(expected in error for error in errors), errors


# --- rendered manifests ------------------------------------------------------------------------

@pytest.mark.parametrize("kubernetes_version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("values_file", VALUES_FILES)
def test_manifests_are_valid_kubernetes(manifests, values_file, kubernetes_version):
    objects = manifests(values_file)
    kinds = sorted(obj["kind"] for obj in objects)
    # NetworkPolicies: MLflow's, and the bundled PostgreSQL's (values.yaml, dev) or PgBouncer's (prod)
    assert kinds == ["ConfigMap", "ConfigMap", "Deployment", "Namespace", "NetworkPolicy", "NetworkPolicy",
                     "PriorityClass", "PriorityClass", "Role", "RoleBinding", "Service", "ServiceAccount",
                     "ServiceAccount"]
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, kubernetes_version, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{values_file}: {obj['kind']}/{obj['metadata']['name']}: {error.message} "
                        f"at {'.'.join(map(str, error.path))}")


@pytest.mark.parametrize("values_file", VALUES_FILES)
def test_helm_lint_passes_strict(chart, values_file):
    result = helm("lint", "--strict", str(chart), *values_args(chart, values_file), chart=chart)
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


def test_helm_refuses_values_the_schema_rejects(chart, tmp_path):
    """Helm itself applies values.schema.json: a typo fails ``helm template`` naming the key."""
    bad = tmp_path / "typo.yaml"
    bad.write_text(yaml.safe_dump({"training": {"podSecurty": "restricted"}}))
    result = helm("template", "tidal", str(chart), "-f", str(bad), chart=chart, check=False)
    assert result.returncode != 0 and "podSecurty" in result.stderr, result.stderr


@pytest.mark.parametrize("values_file", VALUES_FILES)
def test_the_dashboards_are_a_labelled_configmap_of_the_charts_files(manifests, values_file):
    values = chart_values(values_file)["dashboards"]
    (configmap,) = [cm for cm in by_kind(manifests(values_file), "ConfigMap")
                    if cm["metadata"]["name"] == "tidal-dashboards"]  # the other: MLflow's auth settings
    assert configmap["metadata"]["namespace"] == RELEASE["Namespace"]
    assert configmap["metadata"]["labels"][values["label"]] == values["labelValue"] == "1"
    files = sorted(path.name for path in (CHART / "dashboards").glob("*.json"))
    assert sorted(configmap["data"]) == files == ["tidal-operations.json"]
    for name in files:  # byte for byte what the chart ships, and a dashboard Grafana can load
        assert configmap["data"][name] == (CHART / "dashboards" / name).read_text()
        assert json.loads(configmap["data"][name])["panels"]


def test_training_role_is_least_privilege(manifests):
    (role,) = by_kind(manifests("values-prod.yaml"), "Role")
    crud = ["create", "get", "list", "watch", "delete"]
    assert role["metadata"]["namespace"] == chart_values("values-prod.yaml")["training"]["namespace"]
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": crud},
        {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": crud},
        {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"], "verbs": crud},
    ]
    assert not by_kind(manifests("values-prod.yaml"), "ClusterRole")


@pytest.mark.parametrize("values_file", VALUES_FILES)
def test_role_binding_names_the_airflow_service_accounts_the_airflow_chart_creates(render_all, manifests,
                                                                                   values_file):
    """The RoleBinding's subjects are the worker and triggerer accounts configured under airflow:,
    which the Airflow chart (here its stand-in) renders from the same values."""
    values = chart_values(values_file)
    (binding,) = by_kind(manifests(values_file), "RoleBinding")
    created = {(obj["metadata"]["name"], obj["metadata"]["namespace"]) for source, obj in render_all[values_file]
               if source.startswith("tidal/charts/airflow/") and obj["kind"] == "ServiceAccount"}
    assert {(s["name"], s["namespace"]) for s in binding["subjects"]} == created
    subjects = {(s["name"], s["namespace"]) for s in binding["subjects"]}
    airflow = values["airflow"]
    worker = airflow["workers"]["kubernetes"]["serviceAccount"]
    triggerer = airflow["triggerer"]["serviceAccount"]
    assert worker["create"] and triggerer["create"]
    assert subjects == {(worker["name"], RELEASE["Namespace"]), (triggerer["name"], RELEASE["Namespace"])}
    assert binding["metadata"]["namespace"] == values["training"]["namespace"]


@pytest.mark.parametrize("values_file", VALUES_FILES)
def test_service_accounts_carry_workload_identity(manifests, values_file):
    values = chart_values(values_file)
    accounts = by_kind(manifests(values_file), "ServiceAccount")
    airflow_accounts = [values["airflow"]["workers"]["kubernetes"]["serviceAccount"],
                        values["airflow"]["triggerer"]["serviceAccount"]]
    pattern = re.compile(r"^[^@\s]+@[^@\s]+\.iam\.gserviceaccount\.com$")
    for account in [a["metadata"] for a in accounts] + airflow_accounts:
        assert pattern.match(account["annotations"]["iam.gke.io/gcp-service-account"]), account
    assert all(a["automountServiceAccountToken"] is False for a in accounts)
    (train,) = [a for a in accounts if a["metadata"]["namespace"] == values["training"]["namespace"]]
    assert train["metadata"]["name"] == values["serviceAccounts"]["train"]["name"]


def test_priority_classes_for_on_demand_and_spot_training(manifests):
    classes = {pc["metadata"]["name"]: pc for pc in by_kind(manifests("values.yaml"), "PriorityClass")}
    assert set(classes) == {"tidal-train-high", "tidal-train-spot"}
    assert classes["tidal-train-high"]["value"] > classes["tidal-train-spot"]["value"]
    assert classes["tidal-train-spot"]["preemptionPolicy"] == "Never"
    assert not any(pc["globalDefault"] for pc in classes.values())


@pytest.mark.parametrize("values_file", VALUES_FILES)
def test_mlflow_server_postgres_from_secret_artifacts_proxied_to_bucket_hardened(manifests, values_file):
    values = chart_values(values_file)
    objects = manifests(values_file)
    (deployment,) = by_kind(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    ref = env["MLFLOW_BACKEND_STORE_URI"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": values["mlflow"]["backendStoreSecret"]["name"],
                   "key": values["mlflow"]["backendStoreSecret"]["key"]}
    assert "value" not in env["MLFLOW_BACKEND_STORE_URI"]
    assert container["command"] == ["mlflow"] and container["args"][0] == "server"
    assert "--serve-artifacts" in container["args"]
    assert f"--artifacts-destination={values['mlflow']['artifactsDestination']}" in container["args"]
    assert not any("backend-store-uri" in arg for arg in container["args"]), "the URI holds a password"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] > 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    hardened = container["securityContext"]
    assert hardened["allowPrivilegeEscalation"] is False and hardened["readOnlyRootFilesystem"] is True
    assert hardened["capabilities"]["drop"] == ["ALL"]
    assert pod["serviceAccountName"] == values["serviceAccounts"]["mlflow"]["name"]
    (service,) = by_kind(objects, "Service")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["metadata"]["name"] == values["mlflow"]["name"]


# --- the airflow: section (passed to the official chart) ---------------------------------------

@pytest.mark.parametrize("values_file", VALUES_FILES)
def test_airflow_values_kubernetes_executor_pod_launching_statsd_dags(values_file):
    values = chart_values(values_file)
    airflow = values["airflow"]
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    locked = max((p["version"] for p in lock["package"] if p["name"] == "apache-airflow"),
                 key=lambda v: tuple(map(int, v.split("."))))
    assert airflow["airflowVersion"] == locked
    assert airflow["executor"] == "KubernetesExecutor"
    assert airflow["allowPodLaunching"] is True
    assert airflow["statsd"]["enabled"] is True
    assert airflow["defaultAirflowRepository"].endswith("/tidal/airflow")
    git_sync = airflow["dags"]["gitSync"]
    if git_sync["enabled"]:
        assert git_sync["repo"] and git_sync["subPath"] == "dags"
    else:  # baked into the image by images/airflow.Dockerfile
        assert "COPY --chown=50000:0 dags/ /opt/airflow/dags/" in (ROOT / "images/airflow.Dockerfile").read_text()
    env = {e["name"]: e["value"] for e in airflow["env"]}
    # namespace-qualified (release namespace airflow): training pods in training.namespace get this URI
    assert env["MLFLOW_TRACKING_URI"] == f"http://{values['mlflow']['name']}.airflow.svc:{values['mlflow']['port']}"
    host = env["MLFLOW_TRACKING_URI"].split("://")[1]
    allowed = values["mlflow"]["allowedHosts"].split(",")  # the MLflow server must accept that Host
    assert any(fnmatch.fnmatchcase(host, pattern) for pattern in allowed), (host, allowed)
    assert env["TIDAL_TRAIN_NAMESPACE"] == values["training"]["namespace"]


def test_readme_deploy_guide_covers_node_pools_chart_and_first_run():
    guide = (ROOT / "docs" / "how-to" / "deploy-gke.md").read_text()
    for step in ("--machine-type ct5lp-hightpu-4t --tpu-topology 2x4", "--accelerator type=nvidia-h100-80gb,count=8",
                 "--spot", "--workload-pool=", "roles/iam.workloadIdentityUser", "helm dependency build helm/tidal",
                 "helm install tidal helm/tidal", "airflow dags trigger tidal_tiny"):
        assert step in guide, step


# --- the bucket: a gs:// root with HMAC keys from a Secret -------------------------------------

def test_prod_values_share_a_gs_root_with_hmac_keys_from_a_secret():
    from tidal.launch.pods import pod_secret_env, storage_env
    from tidal.storage import open_storage
    from tidal.storage.s3 import GCS_S3_ENDPOINT, S3Storage

    airflow = chart_values("values-prod.yaml")["airflow"]
    env = {e["name"]: e["value"] for e in airflow["env"]}
    root = env["TIDAL_STORAGE_ROOT"]
    storage = open_storage(root)
    assert isinstance(storage, S3Storage) and storage.uri == root.rstrip("/")
    assert storage.settings.endpoint_url == GCS_S3_ENDPOINT and storage.step_uri("s-1").startswith("gs://")
    secrets = pod_secret_env(env["TIDAL_POD_SECRET_ENV"])  # the training pods: secretKeyRef only
    assert set(secrets) >= {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
    task_secrets = {s["envName"]: (s["secretName"], s["secretKey"]) for s in airflow["secret"]}  # Airflow task pods
    assert task_secrets["AWS_ACCESS_KEY_ID"] == secrets["AWS_ACCESS_KEY_ID"]
    plain = storage_env(root, None, None)
    assert plain == {"TIDAL_STORAGE_ROOT": root} and not any(k.startswith("AWS_") for k in plain)
    # an emulator of GCS's JSON API (checkpoints, handed-over objects) reaches the pods of a gs:// root only
    assert storage_env(root, None, None, "http://gcs:4443")["TIDAL_GCS_ENDPOINT_URL"] == "http://gcs:4443"
    assert "TIDAL_GCS_ENDPOINT_URL" not in storage_env("s3://b/t", None, None, "http://gcs:4443")
