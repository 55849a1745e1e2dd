"""`tidal report` on a scaling suite: the grid's train steps and the fit, not the recipe's one
`train` step (a suite has none). Stand-in train steps are committed as in test_scaling_suite.py;
the fit step runs for real."""

from __future__ import annotations

import json

import numpy as np
import yaml

from tests.conftest import REPO, TINY, seal

SUITE = REPO / "recipes" / "suite-tiny.yaml"
LAW = {"E": 1.5, "A": 1000.0, "B": 100.0, "alpha": 0.5, "beta": 0.3}
BUDGETS = [{"flops": c, "models": ["d32l2", "d48l2", "d64l2", "d96l2", "d128l2"]} for c in (5e11, 1e12, 2e12, 4e12)]


def write_suite(tmp_path):
    data = yaml.safe_load(SUITE.read_text())
    data.update(base=str(TINY), storage_root=str(tmp_path / "storage"), budgets=BUDGETS,
                fit={"n_boot": 10, "forecast_flops": [1e21]})
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def commit_stand_in_run(pipe, point) -> float:
    """Commit one train step whose summary and tail losses follow LAW (no training); its loss."""
    out = pipe.storage.step_dir(pipe.graph[point.name].step_id)
    out.mkdir(parents=True)
    loss = LAW["E"] + LAW["A"] * point.n_params ** -LAW["alpha"] + LAW["B"] * point.tokens ** -LAW["beta"]
    summary = {"param_count": point.n_params, "tokens_seen": point.tokens, "flops_per_token": point.flops_per_token,
               "eval_loss": loss + 0.1, "final_train_loss": loss, "steps": point.steps}
    (out / "summary.json").write_text(json.dumps(summary))
    tail = [s for s in range(1, point.steps + 1) if s > point.steps * 0.8]
    (out / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": loss}) + "\n" for s in tail))
    seal(out)
    return loss


def test_report_of_a_suite_lists_grid_runs_and_the_fit(tmp_path, monkeypatch, capsys):
    from tidal.cli import main
    from tidal.core.load import load_pipeline
    from tidal.core.report import build_report
    from tidal.scaling.suite import plan_grid

    for var in ("TIDAL_STORAGE_ROOT", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(var, raising=False)
    path = write_suite(tmp_path)
    pipe = load_pipeline(path)
    points = plan_grid(pipe.suite, pipe.recipe)

    # nothing committed: every grid run and the fit are listed as such
    assert main(["report", str(path)]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"tidal run of scaling suite {pipe.suite.name} on base recipe tiny")
    assert f"grid:          0 of {len(points)} train steps committed" in text
    assert f"    {points[0].name}" in text and "not committed" in text
    assert f"fit:           {pipe.graph['fit'].step_id} not committed" in text

    # two grid runs committed: their tokens and losses are shown, the others still missing
    losses = {p.name: commit_stand_in_run(pipe, p) for p in points[:2]}
    report = build_report(pipe)
    committed = [r for r in report["grid"] if r["committed"]]
    assert [r["name"] for r in committed] == [p.name for p in points[:2]]
    assert [r["tokens_seen"] for r in committed] == [p.tokens for p in points[:2]]
    np.testing.assert_allclose([r["final_train_loss"] for r in committed], list(losses.values()))
    assert report["kind"] == "scaling_suite" and report["base"] == "tiny" and not report["fit"]["committed"]
    assert set(report["missing"]) >= {p.name for p in points[2:]} | {"fit"}

    # the whole grid and the fit: the report carries the fitted law and the hold-out check
    for p in points[2:]:
        commit_stand_in_run(pipe, p)
    fit = pipe.run("fit")
    assert main(["report", str(path)]) == 0
    text = capsys.readouterr().out
    assert f"grid:          {len(points)} of {len(points)} train steps committed" in text
    line = next(ln for ln in text.splitlines() if ln.strip().startswith(points[-1].name))
    assert f"tokens {points[-1].tokens:,}" in line and "train loss" in line and "eval loss" in line
    assert f"fit:           {fit.step_id}: {len(points)} runs, alpha " in text
    assert "hold-out budget 4e+12" in text and "tidal forecast SUITE --flops C" in text
    report = build_report(pipe)
    assert report["fit"]["summary"]["n_runs"] == len(points)
    assert abs(report["fit"]["summary"]["alpha"] - LAW["alpha"]) < 0.1  # the law the stand-ins follow

    # issue 21, item 7: the suite's parent run is closed with the fit's numbers (the runs table compares suites)
    from mlflow.tracking import MlflowClient

    parent = pipe.parent_run("suite__closing")
    pipe.finish_run(parent, "FINISHED")
    run = MlflowClient(pipe.tracking_uri).get_run(parent)
    assert run.info.status == "FINISHED"
    assert run.data.metrics["alpha"] == report["fit"]["summary"]["alpha"] and "n_runs" in run.data.metrics


def test_suite_dag_ends_in_the_report_task(tmp_path):
    """The report task closes the suite's MLflow parent run whatever happened (it was left RUNNING)."""
    from operators.suite_factory import build_suite_dag

    dag = build_suite_dag(write_suite(tmp_path))
    report = dag.task_dict["report"]
    assert {"fit", "train"} <= report.upstream_task_ids and report.trigger_rule == "all_done"
    assert set(dag.task_dict) - {"report"} <= report.upstream_task_ids
