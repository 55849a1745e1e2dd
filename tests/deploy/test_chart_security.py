"""helm/tidal's MLflow behind MLflow's basic-auth app, and the NetworkPolicies around its servers.

As in test_chart.py, real Helm renders a copy of the chart (the Airflow dependency replaced by
``tests/deploy/airflow_standin``). The NetworkPolicies are judged by what they let through:
:func:`reaches` applies Kubernetes' ingress rules (a pod no policy selects takes everything; a
selected one only what a rule of a selecting policy allows) to client pods carrying the labels
the Airflow chart gives its pods (tier: airflow, component: ..., release: <release>) and the
labels tidal.launch.pods gives the training pods, built by that module itself.
"""

from __future__ import annotations

import configparser
import importlib.util
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import kubernetes_validate
import mlflow.environment_variables as mlflow_env
import pytest
import yaml

from tests.deploy.chart import CHART, RELEASE, VALUES_FILES, chart_copy, chart_values, documents, helm, rendered
from tidal.launch.config import ResourceConfig
from tidal.launch.hardening import violations
from tidal.launch.pods import SECRET_NAME_PATTERN, pod_secret_env, workload

AIRFLOW_COMPONENTS = ("scheduler", "dag-processor", "api-server", "triggerer", "worker")
SETUP_SCRIPT = CHART / "files" / "mlflow_auth_setup.py"


@pytest.fixture(scope="module")
def chart(tmp_path_factory) -> Path:
    return chart_copy(tmp_path_factory.mktemp("chart"))


@pytest.fixture(scope="module")
def texts(chart) -> dict[str, str]:
    """What ``helm template`` prints for each values file."""
    return {values_file: rendered(chart, values_file) for values_file in VALUES_FILES}


@pytest.fixture(scope="module")
def render_all(texts) -> dict[str, list[dict]]:
    return {values_file: [obj for _, obj in documents(text)] for values_file, text in texts.items()}


def render_with(chart: Path, tmp_path: Path, overrides: dict) -> list[dict]:
    """``helm template`` with values.yaml and then ``overrides`` as one more values file."""
    extra = tmp_path / "overrides.yaml"
    extra.write_text(yaml.safe_dump(overrides))
    text = helm("template", RELEASE["Name"], str(chart), "-n", RELEASE["Namespace"], "-f", str(extra),
                chart=chart).stdout
    return [obj for _, obj in documents(text)]


def one(objects: list[dict], kind: str, name: str | None = None) -> dict:
    (found,) = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    return found


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env") or []}


def secret_ref(entry: dict) -> tuple[str, str]:
    assert "value" not in entry, entry
    ref = entry["valueFrom"]["secretKeyRef"]
    return ref["name"], ref["key"]


# --- NetworkPolicy semantics --------------------------------------------------------------------

@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: dict[str, str] = field(default_factory=dict)


def selects(selector: dict | None, labels: dict[str, str]) -> bool:
    selector = selector or {}
    assert set(selector) <= {"matchLabels"}, f"only matchLabels is modelled here: {selector}"
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def peer_admits(peer: dict, policy_namespace: str, client: Pod) -> bool:
    if "ipBlock" in peer:
        return False  # pod IPs are not modelled; the chart's peers are selectors
    if "namespaceSelector" in peer:
        namespace_ok = selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": client.namespace})
    else:
        namespace_ok = client.namespace == policy_namespace
    return namespace_ok and selects(peer.get("podSelector"), client.labels)


def port_admits(rule: dict, port: int) -> bool:
    ports = rule.get("ports")
    return not ports or any(p.get("protocol", "TCP") == "TCP" and p["port"] == port for p in ports)


def selecting(policies: list[dict], server: Pod) -> list[dict]:
    return [p for p in policies if p["metadata"]["namespace"] == server.namespace
            and "Ingress" in p["spec"]["policyTypes"] and selects(p["spec"]["podSelector"], server.labels)]


def reaches(policies: list[dict], client: Pod, server: Pod, port: int) -> bool:
    """Whether Kubernetes lets ``client`` open a TCP connection to ``server``:``port``."""
    chosen = selecting(policies, server)
    if not chosen:
        return True
    return any(port_admits(rule, port)
               and (not rule.get("from") or any(peer_admits(peer, p["metadata"]["namespace"], client)
                                                for peer in rule["from"]))
               for p in chosen for rule in p["spec"].get("ingress") or [])


def airflow_pod(component: str, release: str = RELEASE["Name"], namespace: str = RELEASE["Namespace"]) -> Pod:
    return Pod(namespace, {"tier": "airflow", "component": component, "release": release})


def training_pods(namespace: str) -> list[Pod]:
    """The pods tidal.launch.pods launches: a single Pod and the pods of a multi-node JobSet."""
    single = workload(ResourceConfig(namespace=namespace), name="t", step_uri="gs://b/s",
                      labels={"tidal.dev/step": "s"})
    multi = workload(ResourceConfig(namespace=namespace, accelerator={"kind": "cpu", "nodes": 2}), name="t",
                     step_uri="gs://b/s")
    assert single["kind"] == "Pod" and multi["kind"] == "JobSet"
    job = multi["spec"]["replicatedJobs"][0]["template"]
    return [Pod(namespace, single["metadata"]["labels"]),
            Pod(namespace, job["spec"]["template"]["metadata"]["labels"])]


def policies_of(objects: list[dict]) -> list[dict]:
    return [o for o in objects if o["kind"] == "NetworkPolicy"]


def mlflow_pod(objects: list[dict]) -> Pod:
    deployment = one(objects, "Deployment")
    return Pod(deployment["metadata"]["namespace"], deployment["spec"]["template"]["metadata"]["labels"])


# --- MLflow's basic auth ------------------------------------------------------------------------

@pytest.mark.parametrize("values_file", VALUES_FILES)
def test_mlflow_runs_the_basic_auth_app_with_credentials_from_the_secret(render_all, values_file):
    values = chart_values(values_file)
    auth = values["mlflow"]["auth"]
    assert auth["enabled"] is True and auth["defaultPermission"] in ("READ", "NO_PERMISSIONS")
    objects = render_all[values_file]
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    (server,) = pod["containers"]
    (init,) = pod["initContainers"]
    assert server["command"] == ["mlflow"] and "--app-name=basic-auth" in server["args"]
    env = env_of(server)
    # the names MLflow itself reads (mlflow.environment_variables of the locked mlflow)
    for var in (mlflow_env.MLFLOW_AUTH_ADMIN_USERNAME, mlflow_env.MLFLOW_AUTH_ADMIN_PASSWORD,
                mlflow_env.MLFLOW_FLASK_SERVER_SECRET_KEY):
        assert secret_ref(env[var.name])[0] == auth["secret"], var.name
    assert secret_ref(env["MLFLOW_AUTH_ADMIN_PASSWORD"]) == (auth["secret"], "admin_password")
    init_env = env_of(init)
    assert secret_ref(init_env["MLFLOW_AUTH_DATABASE_URI"]) == (auth["secret"], "database_uri")
    # The ini the server reads is the one the init container writes, on a volume only they share, in memory.
    config_path = env[mlflow_env.MLFLOW_AUTH_CONFIG_PATH.name]["value"]
    assert init_env["MLFLOW_AUTH_CONFIG_PATH"]["value"] == config_path
    volumes = {v["name"]: v for v in pod["volumes"]}
    server_mounts = {m["name"]: m for m in server["volumeMounts"]}
    init_mounts = {m["name"]: m for m in init["volumeMounts"]}
    (shared,) = [name for name, m in server_mounts.items() if config_path.startswith(m["mountPath"] + "/")]
    assert volumes[shared]["emptyDir"]["medium"] == "Memory"
    assert server_mounts[shared]["readOnly"] is True and not init_mounts[shared].get("readOnly")
    assert init_mounts[shared]["mountPath"] == server_mounts[shared]["mountPath"]
    # The init container runs the chart's script from the auth ConfigMap, byte for byte.
    configmap = one(objects, "ConfigMap", f"{values['mlflow']['name']}-auth")
    (setup,) = [name for name, v in volumes.items()
                if v.get("configMap", {}).get("name") == configmap["metadata"]["name"]]
    assert init["command"] == ["python", f"{init_mounts[setup]['mountPath']}/mlflow_auth_setup.py"]
    assert init_env["MLFLOW_AUTH_CONFIG_TEMPLATE"]["value"] == f"{init_mounts[setup]['mountPath']}/basic_auth.ini"
    assert configmap["data"]["mlflow_auth_setup.py"].strip() == SETUP_SCRIPT.read_text().strip()
    ini = configparser.ConfigParser(interpolation=None)
    ini.read_string(configmap["data"]["basic_auth.ini"])
    assert dict(ini["mlflow"]) == {"default_permission": auth["defaultPermission"],
                                   "authorization_function": "mlflow.server.auth:authenticate_request_basic_auth",
                                   "grant_default_workspace_access": "false"}
    assert violations({"kind": "Pod", "spec": pod}) == []  # tidal's hardening rules, init container included


@pytest.mark.parametrize("values_file", VALUES_FILES)
def test_no_credential_is_a_literal_in_the_rendered_manifests(texts, render_all, values_file):
    assert not re.search(r"://[^/\s:@'\"]+:[^/\s@'\"]+@", texts[values_file]), "a URI with a password in it"
    credential = re.compile(rf"{SECRET_NAME_PATTERN.pattern}|DATABASE_URI$|STORE_URI$", re.IGNORECASE)
    checked = set()
    for obj in render_all[values_file]:
        template = obj.get("spec", {}).get("template", {}).get("spec", {})
        for container in [*(template.get("initContainers") or []), *(template.get("containers") or [])]:
            for entry in container.get("env") or []:
                if credential.search(entry["name"]):
                    secret_ref(entry)
                    checked.add(entry["name"])
    assert checked == {"MLFLOW_BACKEND_STORE_URI", "MLFLOW_AUTH_DATABASE_URI", "MLFLOW_AUTH_ADMIN_PASSWORD",
                       "MLFLOW_FLASK_SERVER_SECRET_KEY", "MLFLOW_AUTH_CLIENT_PASSWORD"}


@pytest.mark.parametrize("values_file", VALUES_FILES)
def test_airflow_and_training_pods_log_in_as_the_clients_user_from_the_secret(render_all, values_file):
    values = chart_values(values_file)
    secret = values["mlflow"]["auth"]["secret"]
    init_env = env_of(one(render_all[values_file], "Deployment")["spec"]["template"]["spec"]["initContainers"][0])
    user = {mlflow_env.MLFLOW_TRACKING_USERNAME.name: secret_ref(init_env["MLFLOW_AUTH_CLIENT_USERNAME"]),
            mlflow_env.MLFLOW_TRACKING_PASSWORD.name: secret_ref(init_env["MLFLOW_AUTH_CLIENT_PASSWORD"])}
    assert set(user.values()) == {(secret, "username"), (secret, "password")}
    airflow = values["airflow"]
    # Airflow's pods: the Airflow chart's `secret` list (secretKeyRef env in every Airflow container)
    task_secrets = {s["envName"]: (s["secretName"], s["secretKey"]) for s in airflow["secret"]}
    assert {name: task_secrets.get(name) for name in user} == user
    # training pods: TIDAL_POD_SECRET_ENV, which tidal.launch.pods turns into secretKeyRef env
    env = {e["name"]: e["value"] for e in airflow["env"]}
    pod_secrets = pod_secret_env(env["TIDAL_POD_SECRET_ENV"])
    assert {name: pod_secrets.get(name) for name in user} == user
    pod = workload(ResourceConfig(namespace=values["training"]["namespace"]), name="t", step_uri="gs://b/s",
                   secret_env=pod_secrets)
    (container,) = pod["spec"]["containers"]
    assert {name: secret_ref(env_of(container)[name]) for name in user} == user
    assert violations(pod) == []


def test_auth_and_network_policies_switch_off(chart, tmp_path):
    objects = render_with(chart, tmp_path, {"mlflow": {"auth": {"enabled": False}},
                                            "networkPolicies": {"enabled": False}})
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert "initContainers" not in pod and not any("app-name" in a for a in pod["containers"][0]["args"])
    assert not [e for e in pod["containers"][0]["env"] if e["name"].startswith("MLFLOW_AUTH")]
    assert [o["metadata"]["name"] for o in objects if o["kind"] == "ConfigMap"] == ["tidal-dashboards"]
    assert not policies_of(objects)


# --- the set-up script, run for real on MLflow's auth store -----------------------------------

@pytest.fixture
def setup_script(monkeypatch):
    """files/mlflow_auth_setup.py as a module (mlflow[auth] is in uv.lock: Flask-WTF for the app)."""
    for var in ("MLFLOW_AUTH_CONFIG_PATH", "MLFLOW_AUTH_ADMIN_USERNAME", "MLFLOW_AUTH_ADMIN_PASSWORD"):
        monkeypatch.delenv(var, raising=False)
    spec = importlib.util.spec_from_file_location("mlflow_auth_setup", SETUP_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    for name in [n for n in sys.modules if n.startswith("mlflow.server.auth.")]:
        del sys.modules[name]


def test_setup_script_writes_the_ini_mlflow_reads_and_keeps_the_clients_user(render_all, setup_script, tmp_path,
                                                                          monkeypatch):
    configmap = one(render_all["values.yaml"], "ConfigMap", "tidal-mlflow-auth")
    template = tmp_path / "basic_auth.ini"
    template.write_text(configmap["data"]["basic_auth.ini"])
    target = tmp_path / "auth" / "basic_auth.ini"
    target.parent.mkdir()
    uri = "postgresql://mlflow:p%40ss%25word@db:5432/mlflow_auth"  # URL-encoded, as a password with @ and % is
    setup_script.write_config(str(template), str(target), uri)
    assert target.stat().st_mode & 0o077 == 0
    monkeypatch.setenv("MLFLOW_AUTH_CONFIG_PATH", str(target))
    from mlflow.server.auth.config import read_auth_config

    config = read_auth_config()  # MLflow's own reading of the written file
    assert config.database_uri == uri
    assert config.default_permission == "READ" and config.admin_password is None
    tampered = tmp_path / "tampered.ini"
    tampered.write_text(template.read_text() + "admin_password = in-a-configmap\n")
    with pytest.raises(SystemExit, match="from the Secret"):
        setup_script.write_config(str(tampered), str(target), uri)

    from mlflow.server.auth.sqlalchemy_store import SqlAlchemyStore

    database = f"sqlite:///{tmp_path / 'auth.db'}"
    first, second = "first-password-123", "second-password-456"
    assert setup_script.ensure_client_user(database, "tidal", first, "admin") == "created"
    assert setup_script.ensure_client_user(database, "tidal", first, "admin") == "unchanged"
    store = SqlAlchemyStore()
    store.init_db(database)
    assert store.get_user("tidal").is_admin is False and store.authenticate_user("tidal", first)
    assert setup_script.ensure_client_user(database, "tidal", second, "admin") == "password updated"
    assert store.authenticate_user("tidal", second) and not store.authenticate_user("tidal", first)
    with pytest.raises(SystemExit, match="is the admin user"):
        setup_script.ensure_client_user(database, "admin", second, "admin")
    store.update_user("tidal", is_admin=True)
    with pytest.raises(SystemExit, match="is an MLflow admin"):
        setup_script.ensure_client_user(database, "tidal", second, "admin")


# --- NetworkPolicies ----------------------------------------------------------------------------

@pytest.mark.parametrize("values_file", VALUES_FILES)
def test_only_airflow_and_training_pods_reach_mlflow(render_all, values_file):
    values = chart_values(values_file)
    objects = render_all[values_file]
    policies = policies_of(objects)
    server = mlflow_pod(objects)
    port = values["mlflow"]["port"]
    assert values["networkPolicies"]["enabled"] is True and port == 5000
    (policy,) = selecting(policies, server)
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    for obj in policies:
        kubernetes_validate.validate(obj, "1.29.0", strict=True)
    training = values["training"]["namespace"]
    for component in AIRFLOW_COMPONENTS:
        assert reaches(policies, airflow_pod(component), server, port), component
        assert not reaches(policies, airflow_pod(component), server, 8080)  # the port only
    for pod in training_pods(training):
        assert reaches(policies, pod, server, port), pod
        # the same pod anywhere else (here the release namespace) is no training pod
        assert not reaches(policies, Pod(RELEASE["Namespace"], pod.labels), server, port)
        assert not reaches(policies, Pod("default", pod.labels), server, port)
    outsiders = [Pod(training), Pod(training, {"app.kubernetes.io/name": "tidal"}), Pod(RELEASE["Namespace"]),
                 Pod("default", {"tier": "airflow", "release": RELEASE["Name"]}),
                 airflow_pod("worker", release="other-release"), Pod("kube-system", {"k8s-app": "kube-dns"})]
    for pod in outsiders:
        assert not reaches(policies, pod, server, port), pod


@pytest.mark.parametrize("values_file", VALUES_FILES)
def test_only_airflow_and_mlflow_reach_postgres(render_all, values_file):
    """The Airflow chart's bundled PostgreSQL (Bitnami's pod labels); PgBouncer where it is on."""
    values = chart_values(values_file)
    objects = render_all[values_file]
    policies = policies_of(objects)
    training = values["training"]["namespace"]
    airflow = values["airflow"]
    postgres = Pod(RELEASE["Namespace"], {"app.kubernetes.io/name": "postgresql",
                                          "app.kubernetes.io/instance": RELEASE["Name"],
                                          "app.kubernetes.io/component": "primary"})
    bundled = airflow.get("postgresql", {}).get("enabled", True)  # the Airflow chart's default: true
    assert bool(selecting(policies, postgres)) == bundled
    if bundled:
        for client in [*map(airflow_pod, AIRFLOW_COMPONENTS), airflow_pod("run-airflow-migrations"),
                       mlflow_pod(objects)]:
            assert reaches(policies, client, postgres, 5432), client
        for outsider in [*training_pods(training), Pod(training), Pod(RELEASE["Namespace"]),
                         airflow_pod("scheduler", release="other-release")]:
            assert not reaches(policies, outsider, postgres, 5432), outsider
    pgbouncer = airflow_pod("pgbouncer")
    assert bool(selecting(policies, pgbouncer)) == airflow.get("pgbouncer", {}).get("enabled", False)
    assert airflow.get("pgbouncer", {}).get("enabled", False) == (values_file == "values-prod.yaml")
    if values_file == "values-prod.yaml":
        assert reaches(policies, airflow_pod("scheduler"), pgbouncer, 6543)
        for outsider in [*training_pods(training), mlflow_pod(objects), Pod(RELEASE["Namespace"])]:
            assert not reaches(policies, outsider, pgbouncer, 6543), outsider
        assert reaches(policies, Pod("monitoring"), pgbouncer, 9127)  # the exporter's metrics only


@pytest.mark.parametrize("values_file", VALUES_FILES)
def test_redis_is_not_deployed_so_has_no_policy(render_all, values_file):
    assert "Celery" not in chart_values(values_file)["airflow"]["executor"]
    redis = airflow_pod("redis")
    assert not selecting(policies_of(render_all[values_file]), redis)


def test_with_a_celery_executor_only_its_broker_clients_reach_redis(chart, tmp_path):
    objects = render_with(chart, tmp_path, {"airflow": {"executor": "CeleryExecutor"}})
    policies = policies_of(objects)
    redis = airflow_pod("redis")
    (policy,) = selecting(policies, redis)
    kubernetes_validate.validate(policy, "1.29.0", strict=True)
    for client in ("worker", "scheduler", "flower"):
        assert reaches(policies, airflow_pod(client), redis, 6379), client
    for outsider in [airflow_pod("api-server"), airflow_pod("triggerer"), *training_pods("tidal"),
                     mlflow_pod(objects), airflow_pod("worker", release="other-release")]:
        assert not reaches(policies, outsider, redis, 6379), outsider


def test_extra_peers_reach_mlflow(chart, tmp_path):
    ingress = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}
    objects = render_with(chart, tmp_path, {"networkPolicies": {"mlflow": {"extraFrom": [ingress]}}})
    policies = policies_of(objects)
    server = mlflow_pod(objects)
    assert reaches(policies, Pod("ingress-nginx", {"app": "controller"}), server, 5000)
    assert reaches(policies, airflow_pod("worker"), server, 5000)
    assert not reaches(policies, Pod("default"), server, 5000)


def test_the_evaluator_matches_kubernetes_semantics():
    """:func:`reaches` on hand-made policies, so the tests above cannot pass by a lenient model."""
    server = Pod("ns", {"app": "db"})
    deny_all = {"metadata": {"namespace": "ns"}, "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}
    assert reaches([], Pod("other"), server, 1)  # not selected: open
    assert not reaches([deny_all], Pod("ns", {"app": "db"}), server, 1)
    both = {"metadata": {"namespace": "ns"}, "spec": {
        "podSelector": {"matchLabels": {"app": "db"}}, "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "a"}},
                               "podSelector": {"matchLabels": {"x": "1"}}}], "ports": [{"port": 1}]}]}}
    assert reaches([both], Pod("a", {"x": "1"}), server, 1)
    assert not reaches([both], Pod("a", {"x": "2"}), server, 1)
    assert not reaches([both], Pod("ns", {"x": "1"}), server, 1)  # a podSelector beside a namespaceSelector
    assert not reaches([both], Pod("a", {"x": "1"}), server, 2)
    assert reaches([deny_all, both], Pod("a", {"x": "1"}), server, 1)  # policies add up


def test_values_document_the_secret_keys_the_templates_read():
    """Every key of mlflow.auth.secret that a template reads is named in values.yaml's comment and the guide."""
    templates = (CHART / "templates" / "mlflow.yaml").read_text()
    keys = set(re.findall(r"name: \{\{ \$auth\.secret \}\}\s+key: (\w+)", templates))
    assert keys == {"database_uri", "admin_username", "admin_password", "flask_secret_key", "username", "password"}
    values_text = (CHART / "values.yaml").read_text()
    guide = (CHART.parents[1] / "docs" / "how-to" / "deploy-gke.md").read_text()
    for key in keys:
        assert key in values_text, key
        assert f"--from-literal={key}=" in guide, key
    assert "Dataplane V2" in guide


def test_the_charts_basic_auth_server_refuses_strangers_and_the_clients_user_cannot_delete_others_runs(
        render_all, setup_script, tmp_path, monkeypatch):
    """The chart's MLflow auth for real: the set-up script's ini and clients' user, then ``mlflow server`` with
    the chart's ``--app-name`` and the env the chart gives it. No credentials: 401; the clients' user (not an
    admin, default permission READ) reads the admin's experiment but may not delete it, and manages its own."""
    import os
    import subprocess
    import time
    import urllib.error
    import urllib.request

    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from tests.ports import free_port

    server = one(render_all["values.yaml"], "Deployment", "tidal-mlflow")["spec"]["template"]["spec"]["containers"][0]
    app = [a for a in server["args"] if a.startswith("--app-name")]
    assert app == ["--app-name=basic-auth"]
    configmap = one(render_all["values.yaml"], "ConfigMap", "tidal-mlflow-auth")
    (tmp_path / "template.ini").write_text(configmap["data"]["basic_auth.ini"])
    ini, auth_db = tmp_path / "basic_auth.ini", f"sqlite:///{tmp_path / 'auth.db'}"
    setup_script.write_config(str(tmp_path / "template.ini"), str(ini), auth_db)
    assert setup_script.ensure_client_user(auth_db, "tidal", "client-password-1", "admin") == "created"
    port = free_port()
    env = {**os.environ, "MLFLOW_AUTH_CONFIG_PATH": str(ini), "MLFLOW_AUTH_ADMIN_USERNAME": "admin",
           "MLFLOW_AUTH_ADMIN_PASSWORD": "admin-password-1", "MLFLOW_FLASK_SERVER_SECRET_KEY": "k" * 32}
    env = {k: v for k, v in env.items() if not k.startswith("MLFLOW_TRACKING")}
    proc = subprocess.Popen([str(Path(sys.executable).with_name("mlflow")), "server", "--host", "127.0.0.1",
                             "--port", str(port), "--workers", "1", "--backend-store-uri",
                             f"sqlite:///{tmp_path / 'mlflow.db'}", "--default-artifact-root",
                             str(tmp_path / "artifacts"), *app], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/2.0/mlflow/experiments/search?max_results=1", timeout=2)
                raise AssertionError("an anonymous request was answered")
            except urllib.error.HTTPError as err:
                assert err.code == 401, err.code  # no credentials: refused
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()[-3000:]
                time.sleep(0.3)

        def client(user: str, password: str) -> MlflowClient:
            monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", user)
            monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)
            return MlflowClient(tracking_uri=url)

        theirs = client("admin", "admin-password-1").create_experiment("admins")
        tidal = client("tidal", "client-password-1")
        assert tidal.get_experiment(theirs).name == "admins"  # default_permission READ
        with pytest.raises(MlflowException, match="Permission denied"):
            tidal.delete_experiment(theirs)
        own = tidal.create_experiment("tidal-tiny")  # its creator manages it
        tidal.delete_experiment(own)
        with pytest.raises(MlflowException):
            client("tidal", "wrong-password").search_experiments()
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()
