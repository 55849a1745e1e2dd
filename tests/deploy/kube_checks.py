"""What the deploy tests and ``bench/k8s_box.py`` ask a real API server: install, admission, RBAC.

Every answer comes from the upstream kube-apiserver of :mod:`tests.cluster.kube`: ``kubectl apply``
of what ``helm template`` rendered, server-side dry-run creates of every workload of the hardware
matrix (admission: Pod Security, priority classes, service accounts; validation: the core types and
the JobSet CRD's schema), and requests made with real service-account tokens.
"""

from __future__ import annotations

import json
import re
import time

import yaml

from tests.cluster.kube import KubeServer
from tests.deploy.chart import RELEASE, chart_values, documents, rendered
from tidal.launch.hardening import pod_specs
from tidal.launch.pods import workload
from tidal.recipe import ResourceConfig

STEP_URI = "s3://tidal-runs/tiny/train-0123456789ab"
SECRET_ENV = {"MLFLOW_TRACKING_TOKEN": ("tidal-mlflow", "token")}
LAUNCH = {"create", "get", "list", "watch", "delete"}
LAUNCHED = ("pods", "jobs.batch", "jobsets.jobset.x-k8s.io")
CREATED = re.compile(r"^(\S+?)/(\S+) created \(server dry run\)$", re.MULTILINE)


def install(kube: KubeServer, chart, values_file: str) -> dict:
    """``helm template`` the chart with ``values_file`` and ``kubectl apply`` it for real, with the
    JobSet CRD and the release namespace first; returns the values. Raises RuntimeError on a refusal."""
    kube.kubectl("apply", "--server-side", "-f", str(kube.tools["JOBSET_CRD"]))
    wait_established(kube, "jobsets.jobset.x-k8s.io")
    kube.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(namespace(RELEASE["Namespace"])))
    text = rendered(chart, values_file)
    namespaces = [obj for _, obj in documents(text) if obj["kind"] == "Namespace"]
    kube.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(namespaces))
    kube.kubectl("apply", "-f", "-", stdin=text)
    return chart_values(values_file)


def wait_established(kube: KubeServer, crd: str, timeout_s: float = 60) -> None:
    """Block until the CRD ``crd`` is served (condition Established); RuntimeError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        conditions = kube.get_json("crd", crd).get("status", {}).get("conditions") or []
        if any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
            return
        time.sleep(0.2)
    raise RuntimeError(f"CRD {crd} not established after {timeout_s:.0f} s")


def namespace(name: str, labels: dict[str, str] | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}}


def matrix_objects(cases: list[tuple[str, dict]], namespace_name: str) -> dict[str, tuple[str, dict]]:
    """Each case's workload (Pod or JobSet) in ``namespace_name``, plus, for a JobSet, the Job and
    Pod its controllers would create from each replicated job (Pod Security is enforced on Pods
    only, so the pods inside a JobSet are admitted as Pods). Keyed ``kind/name``; names ``w<i>...``."""
    objects: dict[str, tuple[str, dict]] = {}
    for i, (case, resources) in enumerate(cases):
        config = ResourceConfig.model_validate({**resources, "namespace": namespace_name})
        manifest = workload(config, name=f"w{i}", step_uri=STEP_URI, secret_env=SECRET_ENV)
        objects[f"{manifest['kind'].lower()}/w{i}"] = (case, manifest)
        if manifest["kind"] == "JobSet":
            for rjob in manifest["spec"]["replicatedJobs"]:
                job_name = f"w{i}-{rjob['name']}-0"
                template = rjob["template"]
                objects[f"job/{job_name}"] = (case, {
                    "apiVersion": "batch/v1", "kind": "Job",
                    "metadata": {"name": job_name, "namespace": namespace_name, **template.get("metadata", {})},
                    "spec": template["spec"]})
                pod_template = template["spec"]["template"]
                objects[f"pod/{job_name}-0"] = (case, {
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": f"{job_name}-0", "namespace": namespace_name,
                                 **pod_template.get("metadata", {})},
                    "spec": pod_template["spec"]})
    return objects


def dry_run_create(kube: KubeServer, objects: list[dict], token: str | None = None) -> tuple[set[str], str]:
    """``kubectl create --dry-run=server`` of ``objects`` in one List: the ``kind/name`` of each
    object the server accepted, and its refusals (stderr) for the rest."""
    listing = {"apiVersion": "v1", "kind": "List", "items": objects}
    result = kube.kubectl("create", "--dry-run=server", "-f", "-", stdin=json.dumps(listing), token=token,
                          check=False)
    kinds = {"jobset.jobset.x-k8s.io": "jobset", "job.batch": "job"}
    accepted = {f"{kinds.get(kind, kind)}/{name}" for kind, name in CREATED.findall(result.stdout)}
    return accepted, result.stderr


def admit_matrix(kube: KubeServer, cases: list[tuple[str, dict]], namespace_name: str) -> tuple[int, int, str]:
    """(cases all of whose objects the server accepted, cases, refusals) for ``cases`` in ``namespace_name``."""
    objects = matrix_objects(cases, namespace_name)
    accepted, refusals = dry_run_create(kube, [obj for _, obj in objects.values()])
    refused_cases = {case for key, (case, _) in objects.items() if key not in accepted}
    return len(cases) - len(refused_cases), len(cases), refusals


def privileged(manifest: dict) -> dict:
    """A copy of ``manifest`` whose first container asks for ``privileged: true``."""
    bad = json.loads(json.dumps(manifest))
    _, spec = next(pod_specs(bad))
    spec["containers"][0]["securityContext"]["privileged"] = True
    spec["containers"][0]["securityContext"].pop("allowPrivilegeEscalation", None)
    return bad


def service_account_token(kube: KubeServer, name: str, namespace_name: str) -> str:
    """A token the API server signs for ``namespace_name/name`` (TokenRequest, ``kubectl create token``)."""
    return kube.kubectl("create", "token", name, "-n", namespace_name, "--duration=10m").stdout.strip()


def worker_connection(kube: KubeServer, values: dict, host: str | None = None) -> str:
    """The ``kubernetes_default`` Airflow connection (JSON, for ``AIRFLOW_CONN_KUBERNETES_DEFAULT``) of
    the chart's Airflow worker: a kubeconfig inline (``kube_config``; no file a node would lack) whose
    user is a token the server signed for the worker's service account, so the chart's RBAC decides.
    ``host``: where the worker dials the server (a test cluster's gateway, :meth:`Cluster.reach_loopback`)
    instead of 127.0.0.1; the certificate is then checked for ``kubernetes.default.svc``, a name it
    carries, as an in-cluster client checks it."""
    token = kube.kubectl("create", "token", values["training"]["launchers"]["worker"], "-n", RELEASE["Namespace"],
                         "--duration=2h").stdout.strip()
    config = yaml.safe_load(kube.kubeconfig.read_text())
    config["users"] = [{"name": config["users"][0]["name"], "user": {"token": token}}]
    if host is not None:
        cluster = config["clusters"][0]["cluster"]
        cluster["server"] = f"https://{host}:{kube.port}"
        cluster["tls-server-name"] = "kubernetes.default.svc"
    return json.dumps({"conn_type": "kubernetes", "extra": {"kube_config": json.dumps(config)}})


def can_i(kube: KubeServer, token: str, verb: str, resource: str, namespace_name: str | None,
          subresource: str | None = None) -> bool:
    """The server's SelfSubjectAccessReview answer for the token's holder (``kubectl auth can-i``)."""
    args = ["auth", "can-i", verb, resource]
    args += ["-n", namespace_name] if namespace_name else []
    args += [f"--subresource={subresource}"] if subresource else []
    answer = kube.kubectl(*args, token=token, check=False).stdout.strip()
    if answer not in ("yes", "no"):
        raise RuntimeError(f"kubectl auth can-i {' '.join(args[2:])}: {answer!r}")
    return answer == "yes"


def launcher_grants(training_ns: str) -> list[tuple[str, str, str | None, str | None]]:
    """(verb, resource, namespace, subresource) the training Role must allow its launchers."""
    grants = [(verb, resource, training_ns, None) for resource in LAUNCHED for verb in sorted(LAUNCH)]
    return [*grants, ("get", "pods", training_ns, "log")]


def launcher_denials(training_ns: str, release_ns: str) -> list[tuple[str, str, str | None, str | None]]:
    """What the launchers must not do: change or exec into pods, read secrets or config, touch other
    namespaces, nodes or the RBAC itself."""
    return [
        ("update", "pods", training_ns, None), ("patch", "pods", training_ns, None),
        ("create", "pods", training_ns, "exec"), ("create", "pods", training_ns, "attach"),
        ("get", "secrets", training_ns, None), ("list", "secrets", training_ns, None),
        ("get", "configmaps", training_ns, None), ("create", "services", training_ns, None),
        ("create", "pods", "default", None), ("create", "jobsets.jobset.x-k8s.io", "default", None),
        ("create", "pods", release_ns, None), ("list", "secrets", release_ns, None),
        ("list", "nodes", None, None), ("delete", "namespaces", None, None),
        ("create", "rolebindings.rbac.authorization.k8s.io", training_ns, None),
        ("patch", "jobsets.jobset.x-k8s.io", training_ns, None),
    ]


def rbac_report(kube: KubeServer, values: dict) -> dict[str, list[str]]:
    """For each Airflow launcher account and the training pods' own account: the grants it lacks
    and the denials it escapes, as ``verb resource[/sub] -n ns`` strings (all empty when right)."""
    training_ns, release_ns = values["training"]["namespace"], RELEASE["Namespace"]
    report: dict[str, list[str]] = {}
    grants, denials = launcher_grants(training_ns), launcher_denials(training_ns, release_ns)
    for account in (values["training"]["launchers"]["worker"], values["training"]["launchers"]["triggerer"]):
        token = service_account_token(kube, account, release_ns)
        report[f"{account} lacks"] = [_check(g) for g in grants if not can_i(kube, token, *g)]
        report[f"{account} escapes"] = [_check(d) for d in denials if can_i(kube, token, *d)]
    train = values["serviceAccounts"]["train"]["name"]  # the pods' own account: no API rights at all
    token = service_account_token(kube, train, training_ns)
    report[f"{train} escapes"] = [_check(g) for g in grants if can_i(kube, token, *g)]
    return report


def _check(check: tuple[str, str, str | None, str | None]) -> str:
    verb, resource, ns, sub = check
    return f"{verb} {resource}{'/' + sub if sub else ''}{' -n ' + ns if ns else ''}"
