"""A moto S3 server and a fake-gcs-server GCS emulator on loopback, and a fault-injecting HTTP proxy in front
of moto (tests only).

The proxy forwards every request to moto unchanged (it is HTTP-aware: it reads the whole
request, so it can count requests and answer some of them itself) and, as its
:class:`FaultPlan` says, answers every k-th request with a real S3 error (500 InternalError
or 503 SlowDown, the XML body S3 sends) or closes the connection halfway through an upload
body. boto3 then sees exactly what a flaky endpoint does, and its real retry logic runs.
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.ports import free_port

ERRORS = {
    403: ("AccessDenied", "Access Denied"),
    500: ("InternalError", "We encountered an internal error. Please try again."),
    503: ("SlowDown", "Please reduce your request rate."),
}


def wait_for_port(port: int, timeout_s: float, proc: subprocess.Popen | None = None, host: str = "127.0.0.1") -> None:
    """Block until host:port accepts connections; RuntimeError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {host}:{port} after {timeout_s} s")


def stop_group(proc: subprocess.Popen | None) -> None:
    """Stop a server started in its own process group: SIGTERM to the group, SIGKILL after 10 s."""
    if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


class MotoServer:
    """``python -m moto.server`` on a free port of ``host`` (default loopback), in its own process group."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = free_port()
        self.endpoint = f"http://{host}:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 60) -> MotoServer:
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", self.host, "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        wait_for_port(self.port, timeout_s, self.proc, self.host)
        return self

    def stop(self) -> None:
        stop_group(self.proc)


class FakeGcsServer:
    """fake-gcs-server (GCS's JSON API, built by ``tools/k8s/install.sh``) on a free loopback port, objects in
    memory, in its own process group. ``env`` is what a tidal process needs to use it for ``gs://``."""

    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    @property
    def env(self) -> dict[str, str]:
        # No credentials here, and nothing should look for them slowly: GOOGLE_AUTH_TOKEN_FOR_TESTING is
        # TensorStore's own hook for a test server, NO_GCE_CHECK google-auth's switch that skips probing a
        # GCE metadata server (seconds of timeouts, then anonymous)
        return {"TIDAL_GCS_ENDPOINT_URL": self.endpoint, "GOOGLE_AUTH_TOKEN_FOR_TESTING": "test",
                "NO_GCE_CHECK": "True"}

    def start(self, timeout_s: float = 60) -> FakeGcsServer:
        from tests.cluster.kube import tool_paths

        self.proc = subprocess.Popen([str(tool_paths()["FAKE_GCS_SERVER"]), "-scheme", "http", "-host", "127.0.0.1",
                                      "-port", str(self.port), "-backend", "memory", "-log-level", "error",
                                      "-public-host", f"127.0.0.1:{self.port}"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        wait_for_port(self.port, timeout_s, self.proc)
        return self

    def create_bucket(self, name: str) -> None:
        request = urllib.request.Request(f"{self.endpoint}/storage/v1/b", method="POST",
                                         data=f'{{"name": "{name}"}}'.encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200, answer.status

    def keys(self, bucket: str, prefix: str = "") -> dict[str, int]:
        """Every object under ``prefix``: key -> bytes (the JSON API's listing, all pages)."""
        import json
        from urllib.parse import quote

        out: dict[str, int] = {}
        token = ""
        while True:
            url = f"{self.endpoint}/storage/v1/b/{bucket}/o?prefix={quote(prefix)}&pageToken={quote(token)}"
            with urllib.request.urlopen(url, timeout=10) as answer:
                page = json.load(answer)
            out.update({item["name"]: int(item["size"]) for item in page.get("items", [])})
            token = page.get("nextPageToken", "")
            if not token:
                return out

    def read(self, bucket: str, key: str) -> bytes:
        from urllib.parse import quote

        with urllib.request.urlopen(f"{self.endpoint}/download/storage/v1/b/{bucket}/o/{quote(key, safe='')}"
                                    "?alt=media", timeout=10) as answer:
            return answer.read()

    def stop(self) -> None:
        stop_group(self.proc)


@dataclass
class FaultPlan:
    """What the proxy breaks. Counters say what it actually did (tests assert on them).

    Attributes:
        every: answer every ``every``-th request (0: none) with an error, cycling ``statuses``.
        statuses: HTTP statuses to answer with (500 InternalError, 503 SlowDown).
        drop_uploads: close the connection halfway through the body of this many upload
            requests (PUT with a body of at least ``drop_min_bytes``).
        drop_min_bytes: smallest body that counts as an upload to drop (bytes).
        log: ``(method, path)`` of every request that reached moto, in order.
        get_bytes: body bytes of every GET answer sent back (what clients fetched from the bucket).
        put_bytes: body bytes of every PUT and POST forwarded (what clients wrote to the bucket).
    """

    every: int = 0
    statuses: tuple[int, ...] = (500, 503)
    drop_uploads: int = 0
    drop_min_bytes: int = 1 << 20
    requests: int = 0
    injected: dict[int, int] = field(default_factory=dict)
    dropped: int = 0
    log: list[tuple[str, str]] = field(default_factory=list)
    get_bytes: int = 0
    put_bytes: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class FaultProxy:
    """A threaded HTTP/1.1 proxy on a free port of ``host`` (default loopback) that forwards to
    ``host:upstream_port``."""

    def __init__(self, upstream_port: int, plan: FaultPlan | None = None, host: str = "127.0.0.1"):
        self.plan = plan or FaultPlan()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    data = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return data
                        data += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _handle(self) -> None:
                plan = proxy.plan
                length = int(self.headers.get("Content-Length") or 0)
                with plan.lock:
                    plan.requests += 1
                    number = plan.requests
                    drop = (self.command == "PUT" and length >= plan.drop_min_bytes
                            and plan.dropped < plan.drop_uploads)
                    if drop:
                        plan.dropped += 1
                if drop:  # read half the body, then hang up without answering
                    self.rfile.read(length // 2)
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                body = self._body()
                if plan.every and number % plan.every == 0:
                    with plan.lock:
                        status = plan.statuses[sum(plan.injected.values()) % len(plan.statuses)]
                        plan.injected[status] = plan.injected.get(status, 0) + 1
                    code, message = ERRORS[status]
                    payload = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                               f"<Message>{message}</Message><RequestId>tidal-fault-{number}</RequestId></Error>").encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(payload)
                    return
                with plan.lock:
                    plan.log.append((self.command, self.path))
                    if self.command in ("PUT", "POST"):
                        plan.put_bytes += len(body)
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("transfer-encoding", "content-length")}
                headers["Content-Length"] = str(len(body))
                upstream = http.client.HTTPConnection(host, upstream_port, timeout=120)
                try:
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    response = upstream.getresponse()
                    payload = response.read()
                finally:
                    upstream.close()
                self.send_response(response.status, response.reason)
                for key, value in response.getheaders():
                    if key.lower() not in ("transfer-encoding", "content-length", "connection", "date", "server"):
                        self.send_header(key, value)
                length = response.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)
                if self.command == "GET":
                    with plan.lock:
                        plan.get_bytes += len(payload)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _handle

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.endpoint = f"http://{host}:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> FaultProxy:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def hostname_mlflow_server(tmp: Path) -> Iterator[str]:
    """A real ``mlflow server`` (SQLite store under ``tmp``) reached by host name, not loopback
    (a loopback URI is refused for pods: there it would be the pod itself); yields its URI."""
    import urllib.request

    host = socket.gethostname()
    address = socket.gethostbyname(host)
    with socket.socket() as sock:
        sock.bind((address, 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen([str(Path(sys.executable).with_name("mlflow")), "server", "--backend-store-uri",
                               f"sqlite:///{tmp / 'mlflow.db'}", "--default-artifact-root", str(tmp / "artifacts"),
                               "--host", address, "--port", str(port), "--workers", "1",
                               "--allowed-hosts", f"{host}:{port}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    uri = f"http://{host}:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, "mlflow server did not come up"
                time.sleep(0.5)
        yield uri
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def start_mlflow_server(port: int, store: Path) -> subprocess.Popen:
    """``mlflow server`` (SQLite store and artifacts under ``store``) on 127.0.0.1:``port`` in its own
    process group, returned once ``/health`` answers; stop it with :func:`kill_mlflow_server`.

    Raises:
        RuntimeError: it did not answer within 180 s (or exited first).
    """
    proc = subprocess.Popen([str(Path(sys.executable).with_name("mlflow")), "server", "--backend-store-uri",
                             f"sqlite:///{store / 'mlflow.db'}", "--default-artifact-root", str(store / "artifacts"),
                             "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return proc
        except OSError:
            time.sleep(0.3)
    kill_mlflow_server(proc)
    raise RuntimeError(f"mlflow server on port {port} did not come up (exit code {proc.returncode})")


def kill_mlflow_server(proc: subprocess.Popen) -> None:
    """Kill the server and its uvicorn worker at once (its process group), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
