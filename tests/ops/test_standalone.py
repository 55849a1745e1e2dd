"""Operating tidal through a real `airflow standalone` (PostgreSQL, REST API v2 with a JWT).

In order: the dag-processor reports no import errors; the trigger form refuses invalid values
over REST; a run with a per-run override and an injected fault fails at one step, is recorded
in the failure catalog (and alerted, and counted in StatsD), and after the fault is removed
clearing that task recomputes only it and its downstream tasks; a plain run skips every
committed step in well under a second each; `airflow backfill create` on the scheduled recipe
makes runs that reuse every step and pass the baseline; a drifted baseline fails validation
with a readable difference.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.ops.conftest import VENV_BIN

CI_DAG, NIGHTLY_DAG = "tidal_ops_ci", "tidal_ops_nightly"
DATA_STEPS = ["fetch-brown", "fetch-udhr", "clean-brown", "clean-udhr", "tokenizer", "tokenize-brown",
              "tokenize-udhr"]
# A committed step is skipped after one `stat` of its marker; on an idle machine that takes
# milliseconds. 0.5 s leaves room for a loaded shared machine and is still "well under a second".


def test_dag_processor_reports_no_import_errors(airflow_server):
    deadline = time.monotonic() + 300
    dag_ids: set[str] = set()
    while time.monotonic() < deadline and not {CI_DAG, NIGHTLY_DAG} <= dag_ids:
        dags = airflow_server.api("GET", "/dags", params={"dag_id_pattern": "tidal_ops", "limit": 100}).json()
        dag_ids = {d["dag_id"] for d in dags["dags"]}
        time.sleep(3)
    assert {CI_DAG, NIGHTLY_DAG} <= dag_ids, airflow_server.log_tail()
    errors = airflow_server.api("GET", "/importErrors").json()
    assert errors["total_entries"] == 0, errors
    details = airflow_server.api("GET", f"/dags/{NIGHTLY_DAG}/details").json()
    assert "Schedule:** @daily" in details["doc_md"] and "| `train` | train |" in details["doc_md"]
    for dag_id in (CI_DAG, NIGHTLY_DAG):
        airflow_server.api("PATCH", f"/dags/{dag_id}", json={"is_paused": False})


@pytest.mark.parametrize("conf,field", [
    ({"train_steps": 0}, "train_steps"),
    ({"seed": -5}, "seed"),
    ({"force_steps": "train"}, "force_steps"),  # a string, not a list (or null)
    ({"force_steps": ["no-such-step"]}, "force_steps"),
    ({"dry_run": "yes"}, "dry_run"),
])
def test_rest_trigger_refuses_invalid_form_values(airflow_server, conf, field):
    response = airflow_server.api("POST", f"/dags/{CI_DAG}/dagRuns", expect=400,
                                  json={"logical_date": None, "conf": conf})
    assert field in response.text, response.text
    runs = airflow_server.api("GET", f"/dags/{CI_DAG}/dagRuns", params={"limit": 100}).json()
    assert not [r for r in runs["dag_runs"] if r["conf"] == conf]


def test_a_failed_step_is_cleared_and_only_it_and_its_downstream_compute(airflow_server):
    from tidal.core.load import load_pipeline
    from tidal.tracking.failures import list_failures

    recipe = airflow_server.recipes / "ops_ci.yaml"
    pipe = load_pipeline(recipe, {"seed": 7})  # the run overrides the seed: mix and later get new ids
    fault = airflow_server.faults / "stats"
    fault.write_text("disk full (drill)")
    run_id = "ops_fault_seed7"
    airflow_server.api("POST", f"/dags/{CI_DAG}/dagRuns",
                       json={"dag_run_id": run_id, "logical_date": None, "conf": {"seed": 7}})
    run = airflow_server.wait_run(CI_DAG, run_id)
    states = airflow_server.task_states(CI_DAG, run_id)
    assert run["state"] == "failed", states
    assert states["stats"] == "failed"
    assert states["gate"] == states["train"] == "upstream_failed"
    # data steps committed by an earlier test's run are skipped by the plan task, without a worker
    assert all(states[s] in ("success", "skipped") for s in DATA_STEPS) and states["mix"] == "success", states
    assert airflow_server.xcom(CI_DAG, run_id, "mix")["step_id"] == pipe.graph["mix"].step_id

    # the failure catalog, the alert and the StatsD counters saw it
    from tidal.storage import LocalStorage

    [record] = [r for r in list_failures(LocalStorage(airflow_server.storage), "ops_ci") if r["task_id"] == "stats"]
    assert states["report"] == "failed"  # it ran (all_done) and failed, but records no derived second entry
    assert [r["task_id"] for r in list_failures(LocalStorage(airflow_server.storage), "ops_ci")
            if r["run_id"] == run_id] == ["stats"]
    assert record["exception_type"] == "InjectedFault" and "disk full (drill)" in record["message"]
    assert record["step_id"] == pipe.graph["stats"].step_id and record["try_number"] == 1
    assert record["run_id"] == run_id and record["recipe_hash"] == pipe.recipe_hash
    assert any("InjectedFault: injected fault for step 'stats'" in line for line in record["log_tail"]), \
        record["log_tail"]
    assert record["mlflow_run_id"] and record["mlflow_link"].endswith(record["mlflow_run_id"])
    alerts = [p for p in airflow_server.receivers.posts if "tidal_ops_ci.stats" in p.get("text", "")]
    assert alerts and record["fingerprint"] in alerts[0]["blocks"][0]["text"]["text"]
    lines = airflow_server.receivers.statsd_lines
    assert any(line.startswith("tidal.step.failed:1|c|") and "step:stats" in line for line in lines), lines[-20:]
    assert any(line.startswith("tidal.step.run:1|c|") and "step:mix" in line for line in lines), lines[-20:]

    # remove the fault; clear the failed task and its downstream tasks only
    fault.unlink()
    tries_before = {name: ti["try_number"] for name, ti in airflow_server.task_instances(CI_DAG, run_id).items()}
    cleared = airflow_server.api("POST", f"/dags/{CI_DAG}/clearTaskInstances", json={
        "dry_run": False, "dag_run_id": run_id, "task_ids": ["stats"], "only_failed": True,
        "include_downstream": True, "reset_dag_runs": True}).json()
    assert {ti["task_id"] for ti in cleared["task_instances"]} == {"stats", "gate", "train", "report"}
    run = airflow_server.wait_run(CI_DAG, run_id)
    tis = airflow_server.task_instances(CI_DAG, run_id)
    assert run["state"] == "success", {k: v["state"] for k, v in tis.items()}
    # only the cleared tasks ran again (upstream_failed tasks had never started: try 0 -> 1)
    from tidal.tracking.failures import group_failures

    storage = LocalStorage(airflow_server.storage)
    [group] = [g for g in group_failures(list_failures(storage, "ops_ci"), storage.is_committed)
               if g["fingerprint"] == record["fingerprint"]]
    assert group["resolved"] is True  # the failure stays in the catalog, marked: its step is committed now
    rerun = {name for name, ti in tis.items() if ti["try_number"] > tries_before[name]}
    assert rerun == {"stats", "gate", "train", "report"}, {n: (tries_before[n], ti["try_number"])
                                                           for n, ti in tis.items()}
    assert all(tis[name]["try_number"] <= 1 for name in DATA_STEPS) and tis["mix"]["try_number"] == 1
    for name in ("stats", "gate", "train"):
        out = airflow_server.xcom(CI_DAG, run_id, name)
        assert out["status"] == "run" and out["step_id"] == pipe.graph[name].step_id, (name, out)
    assert all(pipe.storage.is_committed(s.step_id) for s in pipe.graph)


def test_a_plain_run_skips_committed_steps_in_well_under_a_second(airflow_server):
    run_id = "ops_plain"
    airflow_server.api("POST", f"/dags/{CI_DAG}/dagRuns", json={"dag_run_id": run_id, "logical_date": None})
    run = airflow_server.wait_run(CI_DAG, run_id)
    assert run["state"] == "success", airflow_server.why_failed(CI_DAG, run_id)
    states = airflow_server.task_states(CI_DAG, run_id)
    # committed by the earlier run (the seed does not reach them): skipped by the plan task, no worker each
    assert all(states[name] == "skipped" for name in DATA_STEPS), airflow_server.why_failed(CI_DAG, run_id)
    assert states["plan"] == "success", states


def _baseline(airflow_server) -> subprocess.CompletedProcess:
    env = {k: v for k, v in airflow_server.env.items() if not k.startswith("AIRFLOW")}
    return subprocess.run([str(VENV_BIN / "tidal"), "baseline", str(airflow_server.recipes / "ops_nightly.yaml")],
                          env=env, capture_output=True, text=True, timeout=300, check=False)


def test_backfill_of_the_scheduled_recipe_reuses_every_step_and_passes_the_baseline(airflow_server):
    made = _baseline(airflow_server)
    assert made.returncode == 0, made.stderr[-3000:]
    backfill = airflow_server.cli("backfill", "create", "--dag-id", NIGHTLY_DAG, "--from-date", "2026-11-01",
                                  "--to-date", "2026-11-02", "--max-active-runs", "1")
    assert backfill.returncode == 0, (backfill.stdout + backfill.stderr)[-4000:]
    runs = airflow_server.api("GET", f"/dags/{NIGHTLY_DAG}/dagRuns", params={"run_type": "backfill", "limit": 100})
    run_ids = sorted(r["dag_run_id"] for r in runs.json()["dag_runs"])
    assert len(run_ids) == 2, runs.json()
    for run_id in run_ids:
        run = airflow_server.wait_run(NIGHTLY_DAG, run_id)
        assert run["state"] == "success", airflow_server.task_states(NIGHTLY_DAG, run_id)
        tis = airflow_server.task_instances(NIGHTLY_DAG, run_id)
        # every step committed: the plan task skipped them all, none got a worker
        steps = {name: ti["state"] for name, ti in tis.items() if name not in ("plan", "report")}
        assert set(steps.values()) == {"skipped"} and tis["plan"]["state"] == "success", (run_id, steps)
        log = airflow_server.task_log(NIGHTLY_DAG, run_id, "report", tis["report"]["try_number"])
        assert "every metric within tolerance" in log, log[-3000:]


def test_a_drifted_baseline_fails_validation_with_a_readable_difference(airflow_server):
    path = airflow_server.recipes / "baselines" / "ops_nightly.json"
    good = path.read_text()
    baseline = json.loads(good)
    step, loss = baseline["loss_curve"][-1]
    baseline["loss_curve"][-1][1] = loss + 1.0
    path.write_text(json.dumps(baseline))
    try:
        runs = airflow_server.api("GET", f"/dags/{NIGHTLY_DAG}/dagRuns", params={"run_type": "backfill"}).json()
        run_id = min(r["dag_run_id"] for r in runs["dag_runs"])
        airflow_server.api("POST", f"/dags/{NIGHTLY_DAG}/clearTaskInstances", json={
            "dry_run": False, "dag_run_id": run_id, "task_ids": ["report"], "only_failed": False,
            "reset_dag_runs": True})
        run = airflow_server.wait_run(NIGHTLY_DAG, run_id)
        assert run["state"] == "failed"
        tis = airflow_server.task_instances(NIGHTLY_DAG, run_id)
        log = airflow_server.task_log(NIGHTLY_DAG, run_id, "report", tis["report"]["try_number"])
        assert f"loss at step {step}: expected {loss + 1.0:.6g}, got {loss:.6g} (tolerance 0.05)" in log, log[-3000:]
    finally:
        path.write_text(good)
