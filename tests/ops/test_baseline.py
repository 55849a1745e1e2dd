"""Scheduled validation: schedule and baseline are not hashed; `tidal baseline` writes a baseline from
committed outputs; a run that drifts fails with metric, expected, got and tolerance."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.conftest import REPO
from tests.ops.recipes import write_ops_recipe

VENV_BIN = Path(sys.executable).parent
STATS = [("all", "total_tokens", 52_000.0), ("all", "quarantine_rate", 0.01), ("brown", "tokens", 52_000.0),
         ("brown", "mixture_weight_realized", 1.0)]
CURVE = [(5, 6.91), (10, 6.52)]


def _commit(pipe, name: str, files: dict[str, str | pd.DataFrame], summary: dict) -> Path:
    """Commit ``files`` as step ``name`` through the runner's real commit protocol."""
    from tidal.core.commit import write_commit

    step = pipe.graph[name]
    out = pipe.storage.step_dir(step.step_id)
    out.mkdir(parents=True)
    for fname, content in files.items():
        if isinstance(content, pd.DataFrame):
            content.to_parquet(out / fname)
        else:
            (out / fname).write_text(content)
    write_commit(step, pipe.storage, out, summary, started_at="2026-01-01T00:00:00+00:00", seconds=1.0)
    assert pipe.storage.is_committed(step.step_id)
    return out


@pytest.fixture
def scheduled(tmp_path):
    plain = write_ops_recipe(tmp_path / "plain.yaml", tmp_path / "storage")
    path = write_ops_recipe(tmp_path / "nightly.yaml", tmp_path / "storage", name="ops_nightly",
                            schedule="0 3 * * *", baseline={"file": "baselines/nightly.json", "loss_tolerance": 0.05,
                                                            "stats_tolerance": 0.01})
    from tidal.core.load import load_pipeline

    pipe = load_pipeline(path)
    _commit(pipe, "stats", {"stats.parquet": pd.DataFrame(STATS, columns=["source", "metric", "value"])}, {})
    metrics = "".join(json.dumps({"step": s, "loss": loss, "lr": 0.001}) + "\n" for s, loss in CURVE)
    metrics += json.dumps({"step": 10, "eval_loss/udhr": 7.1}) + "\n"
    summary = {"eval_loss": 7.1, "steps": 10, "tokens_seen": 320}
    _commit(pipe, "train", {"metrics.jsonl": metrics, "summary.json": json.dumps(summary)}, summary)
    return {"plain": plain, "nightly": path, "pipe": pipe}


def test_schedule_and_baseline_never_enter_a_step_id(scheduled):
    from tidal.core.load import load_pipeline

    plain, nightly = load_pipeline(scheduled["plain"]), scheduled["pipe"]
    assert nightly.recipe.schedule == "0 3 * * *"
    assert [s.step_id for s in plain.graph] == [s.step_id for s in nightly.graph]


def test_invalid_schedule_is_refused_naming_the_field(tmp_path):
    from tidal.recipe import RecipeError, load_recipe

    path = write_ops_recipe(tmp_path / "bad.yaml", tmp_path / "s", schedule="every night")
    with pytest.raises(RecipeError, match=r"schedule: schedule 'every night': write a 5-field cron"):
        load_recipe(path)
    path = write_ops_recipe(tmp_path / "range.yaml", tmp_path / "s", schedule="61 * * * *")
    with pytest.raises(RecipeError, match=r"schedule: schedule '61 \* \* \* \*': not a valid cron expression"):
        load_recipe(path)


def test_baseline_from_committed_run_then_drift_is_readable(scheduled):
    from operators.step import _compare_baseline
    from tidal.quality.baseline import BaselineMismatch, check_pipeline

    pipe = scheduled["pipe"]
    out = subprocess.run([str(VENV_BIN / "tidal"), "baseline", str(scheduled["nightly"])], cwd=REPO,
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    path = scheduled["nightly"].parent / "baselines" / "nightly.json"
    baseline = json.loads(path.read_text())
    assert baseline["stats"]["all/total_tokens"] == 52_000.0
    assert baseline["loss_curve"] == [list(p) for p in CURVE] and baseline["eval_loss"] == 7.1
    assert pipe.graph["train"].step_id in baseline["source"]
    assert check_pipeline(pipe) == []

    # within tolerance: 0.5 % on a stat (tolerance 1 %), 0.04 nats on a loss point (tolerance 0.05)
    baseline["stats"]["all/total_tokens"] = 52_000.0 * 1.005
    baseline["loss_curve"][0][1] = CURVE[0][1] + 0.04
    path.write_text(json.dumps(baseline))
    assert check_pipeline(pipe) == []

    # a hand-written baseline the run does not match
    baseline["stats"]["all/total_tokens"] = 60_000.0
    baseline["loss_curve"][1][1] = 5.0
    baseline["loss_curve"].append([20, 4.0])
    path.write_text(json.dumps(baseline))
    with pytest.raises(BaselineMismatch) as err:
        check_pipeline(pipe)
    text = str(err.value)
    assert "3 difference(s) from baseline" in text
    assert "stats all/total_tokens: expected 60000, got 52000 (tolerance 600)" in text
    assert "loss at step 10: expected 5, got 6.52 (tolerance 0.05)" in text
    assert "loss at step 20: expected 4, got missing (tolerance 0.05)" in text

    from airflow.sdk.exceptions import AirflowFailException

    with pytest.raises(AirflowFailException, match="stats all/total_tokens: expected 60000, got 52000"):
        _compare_baseline(pipe, logging.getLogger("test"))


def test_a_malformed_baseline_names_the_file(scheduled):
    from tidal.quality.baseline import BaselineError, check_pipeline

    path = scheduled["nightly"].parent / "baselines" / "nightly.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{not json")
    with pytest.raises(BaselineError, match=r"nightly.json: baseline is not JSON: line 1"):
        check_pipeline(scheduled["pipe"])
    data = yaml.safe_load(scheduled["nightly"].read_text())
    assert data["baseline"]["file"] == "baselines/nightly.json"


def test_report_task_closes_the_parent_run_failed_with_the_final_metrics(scheduled, monkeypatch):
    """Issue 21, item 7 (the Airflow path): the report task ends the parent run, FAILED when the
    DAG run fails there (steps not committed here), and puts the run's final metrics on it."""
    from types import SimpleNamespace

    from airflow.sdk.exceptions import AirflowFailException
    from mlflow.tracking import MlflowClient

    from operators.step import TidalReportOperator

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    pipe = scheduled["pipe"]
    parent = pipe.parent_run("tidal_ops_nightly__manual__closing")
    context = {"dag_run": SimpleNamespace(dag_id="tidal_ops_nightly", run_id="manual__closing"), "params": {}}
    with pytest.raises(AirflowFailException, match="steps not committed"):
        TidalReportOperator(task_id="report", recipe_path=str(scheduled["nightly"])).execute(context)
    run = MlflowClient(pipe.tracking_uri).get_run(parent)
    assert run.info.status == "FAILED" and run.data.metrics == {"eval_loss": 7.1, "steps": 10, "tokens_seen": 320}
    assert [m.step for m in MlflowClient(pipe.tracking_uri).get_metric_history(parent, "eval_loss")] == [10]
