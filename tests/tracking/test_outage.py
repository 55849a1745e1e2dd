"""A tracking outage: every caller that reads MLflow degrades instead of crashing.

A real ``mlflow server`` (loopback, SQLite store; one per module, it takes ~10 s to start) is
up while a DAG run's parent run is recorded through it, then killed with its process group.
``tidal report``, ``tidal baseline --from-run``, ``tidal lineage RUN_KEY``, the on-call page's
data and the failure callback then meet the dead URI: each answers within MLflow's bounded
retries (tidal.tracking.tracker.HTTP_DEFAULTS), names the URI (without the user:password the
tracking URI carries) and exits as documented. A port nobody listens on covers the lookups
themselves and the unreachable hold they share with the Tracker.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import yaml

from tests.conftest import TINY, seal
from tests.storage.servers import free_port, start_mlflow_server
from tidal.tracking import (
    PENDING_PREFIX,
    Tracker,
    TrackingUnavailable,
    close_run,
    experiment_name,
    parent_run,
    run_link,
    safe_uri,
    ui_url,
)
from tidal.tracking import client as tracking_client
from tidal.tracking import tracker as tracking

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
DAG_ID, RUN_ID = "tidal_tiny", "manual__outage"
RUN_KEY = f"{DAG_ID}__{RUN_ID}"
PASSWORD = "s3cret"


def commit_stand_in_fetch(pipe) -> str:
    """Commit ``fetch-brown`` as a stand-in (step.json and _SUCCESS, no download); its id."""
    step = pipe.graph["fetch-brown"]
    out = pipe.storage.step_dir(step.step_id)
    out.mkdir(parents=True)
    record = {"hash_input": {"name": step.name, "kind": "fetch", "inputs": {}, "config": dict(step.config)},
              "manifest_root_hash": "ab" * 32, "summary": {}}
    (out / "step.json").write_text(json.dumps(record))
    seal(out)
    return step.step_id


@pytest.fixture(scope="module")
def outage(tmp_path_factory):
    """A tiny recipe whose tracking server was up (a parent run recorded, links checked) and is now dead."""
    from operators.callbacks import mlflow_link
    from tidal.core.load import load_pipeline

    tmp = tmp_path_factory.mktemp("outage")
    port = free_port()
    proc = start_mlflow_server(port, tmp / "mlflow")
    shown = f"http://127.0.0.1:{port}"
    try:
        with pytest.MonkeyPatch.context() as env:
            for var in ("TIDAL_STORAGE_ROOT", "TIDAL_MLFLOW_UI_URL", "TIDAL_ALERT_WEBHOOK_URL", "TIDAL_STATSD_HOST"):
                env.delenv(var, raising=False)
            env.setenv("MLFLOW_TRACKING_URI", f"http://alice:{PASSWORD}@127.0.0.1:{port}")
            env.setattr(tracking_client, "_unreachable_until", {})
            for key, value in tracking.HTTP_DEFAULTS.items():  # what a deployment gets when it sets none
                env.setenv(key, value)
            data = yaml.safe_load(TINY.read_text())
            data["storage_root"] = str(tmp / "store")
            data["tracking_uri"] = f"http://alice:{PASSWORD}@127.0.0.1:{port}"  # in the recipe too: a param
            recipe = tmp / "tiny.yaml"
            recipe.write_text(yaml.safe_dump(data, sort_keys=False))
            pipe = load_pipeline(recipe)
            parent = pipe.parent_run(RUN_KEY)  # through the Tracker, as a DAG run does
            assert parent and not parent.startswith(PENDING_PREFIX)
            # issue 22, item 6: no credential in the parent run's params, nor on the on-call page's data
            from mlflow.tracking import MlflowClient

            from operators.oncall import recipe_status

            params = MlflowClient(pipe.tracking_uri).get_run(parent).data.params
            assert params["tracking_uri"] == shown and not [k for k, v in params.items() if PASSWORD in v]
            assert PASSWORD not in json.dumps(recipe_status(recipe), default=str)
            found = parent_run(pipe.tracking_uri, pipe.experiment, RUN_KEY)
            assert mlflow_link(pipe, RUN_KEY) == (
                parent, f"{shown}/#/experiments/{found.experiment_id}/runs/{parent}?workflowType=machine_learning")
            fetched = commit_stand_in_fetch(pipe)
            os.killpg(proc.pid, signal.SIGKILL)  # the server and its uvicorn worker
            proc.wait()
            yield SimpleNamespace(recipe=recipe, shown=shown, pipe=pipe, fetched=fetched, tmp=tmp)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_cli_report_baseline_and_lineage_degrade_and_name_the_uri(outage, capsys):
    """Three ``tidal`` processes at once (each pays one bounded round of retries), then one in this one."""
    recipe, store = str(outage.recipe), str(outage.pipe.storage.root)
    commands = {
        "report": ["report", recipe],
        "baseline": ["baseline", recipe, "--from-run", RUN_KEY, "--out", str(outage.tmp / "baseline.json")],
        "lineage": ["lineage", RUN_KEY, "--recipe", recipe],
    }
    started = time.monotonic()
    procs = {name: subprocess.Popen([sys.executable, "-m", "tidal.cli", *args], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True) for name, args in commands.items()}
    done = {name: (p.communicate(timeout=120), p.returncode) for name, p in procs.items()}
    assert time.monotonic() - started < 120
    unreachable = f"tracking is unreachable at {outage.shown}: "
    for name, ((out, err), _) in done.items():
        assert "Traceback" not in err and PASSWORD not in out + err, (name, err[-3000:])

    (out, err), code = done["report"]
    assert code == 0, err[-2000:]
    assert out.startswith("tidal run of recipe tiny") and "NOT COMMITTED:" in out
    assert f"  MLflow:        {outage.shown} run (none)" in out
    assert [ln for ln in out.splitlines() if "unreachable" in ln] == [
        next(ln for ln in out.splitlines() if ln.startswith(f"  MLflow error:  {unreachable}"))]

    (out, err), code = done["baseline"]
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 1 and len(errors) == 1, err[-2000:]
    assert errors[0].startswith(f"error: baseline from run {RUN_KEY}: {unreachable}")
    assert not (outage.tmp / "baseline.json").exists()

    (out, err), code = done["lineage"]
    assert code == 0, err[-2000:]
    assert "steps (inputs first):" in out and outage.fetched in out
    warnings = [ln for ln in err.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: {unreachable}") and RUN_KEY in warnings[0]

    from tidal.cli import main

    capsys.readouterr()
    code = main(["lineage", RUN_KEY, "--storage-root", store])  # no recipe: no steps to show instead
    errors = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    assert code == 1 and len(errors) == 1 and unreachable in errors[0] and PASSWORD not in errors[0], errors


def test_oncall_page_renders_with_a_tracking_unreachable_note(outage):
    from operators.oncall import mlflow_run_links, recipe_status, render_page

    status = recipe_status(outage.recipe)
    assert status["dag_id"] == DAG_ID and "error" not in status
    assert mlflow_run_links(status, [RUN_KEY]) == {}
    assert status["mlflow"]["error"].startswith(f"tracking is unreachable at {outage.shown}: ")
    page = render_page([status], {DAG_ID: [{"run_id": RUN_ID, "run_type": "manual", "state": "failed", "start": None,
                                            "end": None, "failed_tasks": ["train"], "mlflow_link": None}]})
    assert "tracking unreachable" in page and outage.shown in page and PASSWORD not in page


class Recorder(logging.Handler):
    """Keeps every record (Airflow's structlog set-up bypasses pytest's caplog)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_failure_callback_records_the_failure_without_mlflow_fields(outage, monkeypatch):
    from operators import callbacks
    from tidal.tracking.failures import list_failures

    recorder, logger = Recorder(), logging.getLogger("tests.tracking.outage.callbacks")
    logger.handlers, logger.propagate = [recorder], False
    logger.setLevel(logging.DEBUG)
    monkeypatch.setattr(callbacks, "log", logger)
    context = {"ti": SimpleNamespace(task_id="train", try_number=1, map_index=-1),
               "task": SimpleNamespace(recipe_path=str(outage.recipe), step_name="train"),
               "dag_run": SimpleNamespace(dag_id=DAG_ID, run_id=RUN_ID), "params": {},
               "exception": RuntimeError("trainer died")}
    callbacks.on_failure_callback(context)
    records = list_failures(outage.pipe.storage, "tiny")
    assert len(records) == 1 and records[0]["message"] == "trainer died"
    assert records[0]["mlflow_run_id"] is None and records[0]["mlflow_link"] is None
    assert records[0]["step_id"] == outage.pipe.graph["train"].step_id
    warnings = [r.getMessage() for r in recorder.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and f"tracking is unreachable at {outage.shown}: " in warnings[0], warnings
    assert PASSWORD not in " ".join(r.getMessage() for r in recorder.records)


def test_a_port_nobody_listens_on_fails_once_then_at_once_for_lookups_and_tracker(tmp_path, monkeypatch):
    monkeypatch.setattr(tracking_client, "_unreachable_until", {})
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    port = free_port()
    uri = f"http://bob:{PASSWORD}@127.0.0.1:{port}"
    with pytest.raises(TrackingUnavailable) as first:
        parent_run(uri, experiment_name("tiny"), "k")
    assert str(first.value) == f"tracking is unreachable at http://127.0.0.1:{port}: [Errno 111] Connection refused"
    started = time.monotonic()
    with pytest.raises(TrackingUnavailable, match=f"^tracking is unreachable at http://127.0.0.1:{port}: it did not "):
        close_run(uri, "0123abcd")
    tracker = Tracker(uri, experiment_name("tiny"), pending_dir=tmp_path)
    assert tracker.parent_run("k", {}, {}) == PENDING_PREFIX + "k"  # buffered, not raised: the Tracker's rule
    assert time.monotonic() - started < 1.0  # the hold: no new connection attempts
    assert PASSWORD not in json.loads(next(tmp_path.glob("*.json")).read_text())["error"]
    with pytest.raises(ValueError, match="single quote"):
        parent_run(uri, "tidal-tiny", "it's")


def test_links_names_and_redaction(monkeypatch):
    from tidal.tracking import TrackedRun

    monkeypatch.delenv("TIDAL_MLFLOW_UI_URL", raising=False)
    run = TrackedRun("r1", "7", "k", "FAILED", 0, {"tidal.run_key": "k"})
    assert experiment_name("tiny") == "tidal-tiny" and run.run_key == "k"
    assert run_link("sqlite:////tmp/x/mlflow.db", run) == "runs:/r1"
    assert run_link("https://u:p@mlflow.example:5000/", run) == \
        "https://mlflow.example:5000/#/experiments/7/runs/r1?workflowType=machine_learning"
    monkeypatch.setenv("TIDAL_MLFLOW_UI_URL", "https://ui.example/")
    assert ui_url("sqlite:////tmp/x/mlflow.db") == "https://ui.example"
    text = "postgresql://tidal:pw@db:5432/mlflow and http://a:b@h"
    assert safe_uri(text) == "postgresql://db:5432/mlflow and http://h"
