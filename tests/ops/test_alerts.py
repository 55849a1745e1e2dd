"""Alerts reach a real local HTTP server in Slack and PagerDuty v2 form; StatsD lines reach a real UDP socket."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest


class Webhook:
    """A local HTTP server that records every JSON body POSTed to it."""

    def __init__(self, status: int = 200):
        received = self.received = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                received.append({"path": self.path, "type": self.headers["Content-Type"], "body": json.loads(body)})
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def webhook():
    hook = Webhook()
    yield hook
    hook.close()


def _gate_record():
    from tidal.quality.gates import GateFailed
    from tidal.tracking.failures import build_record

    result = {"success": False, "summary": "gate failed: 1 of 1 expectations", "results": [
        {"source": "all", "column": "total_tokens", "observed": 99.0, "expected": ">= 1000", "success": False}]}
    try:
        raise GateFailed(result["summary"], result)
    except GateFailed as err:
        return build_record(err, dag_id="tidal_tiny", task_id="gate", run_id="manual__1", try_number=2,
                            recipe="tiny", recipe_hash="ab" * 32, step_id="gate-0123456789ab",
                            mlflow_link="http://mlflow:5000/#/experiments/1/runs/r1", log_tail=["line 1", "line 2"])


def test_slack_alert_is_posted_with_the_failed_expectations(webhook):
    from operators.alerts import send_alert

    record = _gate_record()
    status = send_alert(record, {"TIDAL_ALERT_WEBHOOK_URL": webhook.url})
    assert status == 200
    [got] = webhook.received
    assert got["type"] == "application/json" and got["path"] == "/hook"
    body = got["body"]
    assert body["text"].startswith("tidal tidal_tiny.gate gate failed: gate failed: 1 of 1")
    section = body["blocks"][0]["text"]["text"]
    assert "total_tokens [source=all]: expected >= 1000, got 99" in section
    assert record["fingerprint"] in section and "<http://mlflow:5000/#/experiments/1/runs/r1|MLflow run>" in section


def test_pagerduty_alert_follows_events_v2(webhook):
    from operators.alerts import send_alert

    record = _gate_record()
    env = {"TIDAL_ALERT_WEBHOOK_URL": webhook.url, "TIDAL_ALERT_FORMAT": "pagerduty",
           "TIDAL_PAGERDUTY_ROUTING_KEY": "R0UT1NGKEY"}
    assert send_alert(record, env) == 200
    assert send_alert(record, env) == 200
    first, second = (r["body"] for r in webhook.received)
    assert first["routing_key"] == "R0UT1NGKEY" and first["event_action"] == "trigger"
    assert first["dedup_key"] == second["dedup_key"] == f"tidal-tidal_tiny-{record['fingerprint']}"
    payload = first["payload"]
    assert set(payload) >= {"summary", "source", "severity"} and len(payload["summary"]) <= 1024
    assert payload["severity"] == "error" and payload["source"] == "airflow/tidal_tiny"
    assert payload["custom_details"]["failed_expectations"][0]["column"] == "total_tokens"
    assert payload["custom_details"]["step_id"] == "gate-0123456789ab"


def test_an_unreachable_webhook_never_raises():
    from operators.alerts import send_alert

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound but not listening: connection refused
        assert send_alert(_gate_record(), {"TIDAL_ALERT_WEBHOOK_URL": f"http://127.0.0.1:{port}/x",
                                           "TIDAL_ALERT_TIMEOUT_S": "2"}) is None
    assert send_alert(_gate_record(), {}) is None


def test_statsd_lines_reach_a_udp_socket():
    from tidal.tracking import statsd as m

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as server:
        server.bind(("127.0.0.1", 0))
        server.settimeout(5)
        client = m.StatsdClient("127.0.0.1", server.getsockname()[1], prefix="tidal")
        tags = {"recipe": "tiny", "step": "clean-brown", "kind": "clean"}
        client.incr(m.STEP_RUN, tags=tags)
        client.timing(m.STEP_DURATION, 1.5, tags=tags)
        client.gauge(m.TOKENS_PER_SECOND, 51234.5, tags={"recipe": "tiny"})
        client.incr(m.GATE_FAILED, tags={"recipe": "a|b,c#d:e"})
        lines = [server.recv(4096).decode() for _ in range(4)]
        client.close()
    assert lines == [
        "tidal.step.run:1|c|#kind:clean,recipe:tiny,step:clean-brown",
        "tidal.step.duration:1500|ms|#kind:clean,recipe:tiny,step:clean-brown",
        "tidal.train.tokens_per_second:51234.5|g|#recipe:tiny",
        "tidal.gate.failed:1|c|#recipe:a_b_c_d_e",
    ]


def test_statsd_off_or_unresolvable_is_a_no_op():
    from tidal.tracking.statsd import StatsdClient

    assert not StatsdClient(None).enabled
    off = StatsdClient("no-such-host.invalid")
    assert not off.enabled
    off.incr("step.run")  # nothing to send to, nothing raised


def test_the_grafana_dashboard_queries_the_metrics_tidal_sends():
    import json

    from tests.conftest import REPO
    from tidal.tracking import statsd as m

    dashboard = json.loads((REPO / "helm" / "tidal" / "dashboards" / "tidal-operations.json").read_text())
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    sent = [m.STEP_RUN, m.STEP_SKIPPED, m.STEP_FAILED, m.STEP_DURATION, m.GATE_FAILED, m.TOKENS_PER_SECOND,
            m.CHECKPOINT_TIME, m.BASELINE_DIFFERENCES]
    for name in sent:  # the statsd_exporter turns `tidal.step.run` into `tidal_step_run`
        assert "tidal_" + name.replace(".", "_") in exprs, name
    for airflow_metric in ("airflow_scheduler_heartbeat", "airflow_triggerer_heartbeat", "airflow_pool_open_slots",
                           "airflow_dagrun_duration_success", "airflow_ti_failures"):
        assert airflow_metric in exprs
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
