"""Suite files: planning the grid, sharing the base recipe's data steps, growing the grid,
the Airflow DAG with a mapped training task, and the fit step on stand-in training runs."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import yaml

from tests.conftest import REPO, TINY, seal

SUITE = REPO / "recipes" / "suite-tiny.yaml"


def write_suite(tmp_path, budgets=None, **changes):
    data = yaml.safe_load(SUITE.read_text())
    data["base"] = str(TINY)
    data["storage_root"] = str(tmp_path / "storage")
    if budgets is not None:
        data["budgets"] = budgets
    for key, value in changes.items():
        data[key] = value
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_suite_shares_the_base_recipes_data_steps():
    from tidal.core.planner import build_graph, build_suite_graph, train_step_names
    from tidal.recipe import load_recipe
    from tidal.scaling.suite import load_suite

    suite, base = load_suite(SUITE)
    graph = build_suite_graph(suite, base)
    tiny = build_graph(load_recipe(TINY))
    data = {s.name: s.step_id for s in tiny if s.kind not in ("train", "eval")}  # a suite has no eval step
    assert {s.name: s.step_id for s in graph if s.name in data} == data
    names = train_step_names(graph)
    assert len(names) == 20 and "train-c1p25e11-d4l2" in names and "train-c1e12-d32l2" in names
    fit = graph["fit"]
    assert fit.kind == "scaling_fit" and [s.name for s in fit.inputs] == names
    assert fit.config["loss"] == "train_loss_tail" and fit.config["n_params"] == "total"
    train = graph["train-c1e12-d32l2"]
    assert {d.name for d in train.inputs} == {d.name for d in tiny["train"].inputs}
    assert train.config["model"] == {"d_model": 32, "n_layers": 2, "n_heads": 8, "d_ff": 128}
    assert train.config["log_every"] == 1


def test_growing_the_grid_adds_only_new_train_steps_and_the_fit(tmp_path):
    from tidal.core.load import load_pipeline

    budgets = [{"flops": 5e11, "models": ["d32l2", "d64l2", "d96l2"]},
               {"flops": 1e12, "models": ["d32l2", "d64l2", "d96l2"]}]
    small = load_pipeline(write_suite(tmp_path, budgets))
    before = {s.name: s.step_id for s in small.graph}
    grown = load_pipeline(write_suite(tmp_path, [*budgets, {"flops": 2e12, "models": ["d64l2", "d128l2"]}]))
    after = {s.name: s.step_id for s in grown.graph}
    changed = {n for n in after if before.get(n) != after[n]}
    assert changed == {"fit", "train-c2e12-d64l2", "train-c2e12-d128l2"}
    # a rule change retrains the grid but keeps every data step
    other = load_pipeline(write_suite(tmp_path, budgets, rules={"lr_width_exponent": 1.0}))
    changed = {s.name for s in other.graph if before[s.name] != s.step_id}
    assert changed == {n for n in before if n.startswith("train-")} | {"fit"}


def test_tokens_steps_and_rules_follow_the_trainer_formulas():
    from tidal.scaling.suite import load_suite, plan_grid
    from tidal.train.model import ModelConfig, flops_per_token, param_count

    suite, base = load_suite(SUITE)
    context = base.tokenize.seq_len - 1
    for p in plan_grid(suite, base):
        cfg = ModelConfig.model_validate(p.model).shape(base.tokenizer.vocab_size)
        assert p.flops_per_token == flops_per_token(cfg, context) and p.n_params == param_count(cfg)
        assert p.tokens == p.steps * p.batch_size * context
        assert abs(p.flops / p.budget - 1) < 0.5 * p.batch_size * context * p.flops_per_token / p.budget + 1e-9
        assert p.lr == pytest.approx(base.train.optimizer.lr * (128 / p.model["d_model"]) ** 0.5, rel=1e-5)
        assert p.warmup_steps == round(p.steps * 20 / 400)
        assert p.batch_size % 4 == 0  # rules.batch_multiple: 4
        assert p.tokens <= 36769 * context  # every run sees < 1 epoch of the tiny mixture


@pytest.mark.parametrize(("budgets", "message"), [
    ([{"flops": 1e9, "models": ["d64l2"]}], "below rules.min_steps"),
    ([{"flops": 1e12, "models": ["d62l2"]}], "multiple of the even head_dim"),
    ([{"flops": 1e12, "models": ["big"]}], "do not match"),
    ([{"flops": 1e12, "models": ["d64l2"]}, {"flops": 1.0001e12, "models": ["d32l2"]}], "listed twice"),
])
def test_bad_suites_are_refused_clearly(tmp_path, budgets, message):
    from tidal.scaling.suite import SuiteError, load_suite

    with pytest.raises(SuiteError, match=message):
        load_suite(write_suite(tmp_path, budgets))


def test_dag_maps_training_over_the_grid_without_heavy_imports():
    code = (
        "import sys; from pathlib import Path; from operators.dag_factory import build_dags\n"
        "dags = build_dags(Path('recipes'))\n"
        "dag = dags['tidal_suite_tiny']\n"
        "train = dag.get_task('train'); fit = dag.get_task('fit')\n"
        "print(type(train).__name__, len(train.expand_input.value['step_name']),\n"
        "      sorted(t.task_id for t in train.upstream_list), [t.task_id for t in fit.upstream_list],\n"
        "      any(m in sys.modules for m in ('jax', 'scipy', 'matplotlib')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                         check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "MappedOperator" in out.stdout and " 20 " in out.stdout
    assert "'gate'" in out.stdout and "'mix'" in out.stdout and "['train']" in out.stdout
    assert out.stdout.strip().endswith("False")


def _fake_train(pipe, law):
    """Commit stand-in train steps whose summaries follow ``law`` (no training)."""
    from tidal.scaling.suite import plan_grid

    for p in plan_grid(pipe.suite, pipe.recipe):
        step = pipe.graph[p.name]
        out = pipe.storage.step_dir(step.step_id)
        out.mkdir(parents=True)
        loss = law["E"] + law["A"] * p.n_params ** -law["alpha"] + law["B"] * p.tokens ** -law["beta"]
        summary = {"param_count": p.n_params, "tokens_seen": p.tokens, "flops_per_token": p.flops_per_token,
                   "eval_loss": loss * (1 + 0.002 * np.sin(p.n_params)), "final_train_loss": loss,
                   "steps": p.steps}
        (out / "summary.json").write_text(json.dumps(summary))
        # training losses around the law in the tail (mean = loss), above it before the tail
        in_tail = [s > p.steps * (1.0 - 0.2) for s in range(1, p.steps + 1)]
        records = [{"step": s, "loss": loss + (0.01 * (-1) ** s if tail else 1.0)}
                   for s, tail in zip(range(1, p.steps + 1), in_tail, strict=True)]
        if sum(in_tail) % 2:
            records[-1]["loss"] = loss
        (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        seal(out)


def test_fit_step_writes_results_and_forecast_cli_reads_them(tmp_path, monkeypatch):
    from tidal.cli import main
    from tidal.core.load import load_pipeline
    from tidal.scaling.forecast import forecast_suite

    monkeypatch.delenv("TIDAL_STORAGE_ROOT", raising=False)
    budgets = [{"flops": c, "models": ["d32l2", "d48l2", "d64l2", "d96l2", "d128l2"]} for c in (5e11, 1e12, 2e12, 4e12)]
    path = write_suite(tmp_path, budgets, fit={"n_boot": 10, "forecast_flops": [1e21]})
    pipe = load_pipeline(path)
    assert type(pipe).__name__ == "SuitePipeline" and pipe.status("fit") == "blocked"
    assert main(["forecast", str(path), "--flops", "1e21"]) == 1  # not fitted yet: clear error
    # a law whose isoFLOP minima fall inside d32 … d128 at these budgets
    _fake_train(pipe, {"E": 1.5, "A": 1000.0, "B": 100.0, "alpha": 0.5, "beta": 0.3})
    result = pipe.run("fit")
    out = result.out_dir
    for name in ("fits.json", "runs.parquet", "params.parquet", "forecasts.parquet", "bootstrap.parquet",
                 "plots/isoflop.png", "plots/frontier.png", "plots/residuals.png", "plots/forecast.png"):
        assert (out / name).is_file(), name
    import pandas as pd

    runs = pd.read_parquet(out / "runs.parquet")
    assert len(runs) == 20 and {"n_params", "tokens", "flops", "loss", "loss_fit3", "epochs"} <= set(runs.columns)
    law = {"E": 1.5, "A": 1000.0, "B": 100.0, "alpha": 0.5, "beta": 0.3}
    expected = law["E"] + law["A"] * runs.n_params ** -law["alpha"] + law["B"] * runs.tokens ** -law["beta"]
    np.testing.assert_allclose(runs.loss, expected, rtol=1e-6)  # train_loss_tail: the mean of the tail
    fits = json.loads((out / "fits.json").read_text())
    assert fits["loss"] == "train_loss_tail" and fits["approach3"]["degenerate"] is False
    assert result.summary["n_runs"] == 20 and "holdout_rel_error" in result.summary
    assert "a_N" in result.summary and "alpha_C" in result.summary  # approach 2 and the frontier fitted
    fc = forecast_suite(pipe, 1e21)["forecast"]
    slack = 1e-9 * fc["loss3"]["estimate"]  # a replicate can refit the same runs: equal up to rounding
    assert fc["loss3"]["lo95"] - slack <= fc["loss3"]["estimate"] <= fc["loss3"]["hi95"] + slack
    assert main(["forecast", str(path), "--flops", "1e21"]) == 0
    assert pipe.run("fit").status == "skip"


def test_suite_parent_run_records_the_base_recipes_licences(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from tidal.core.load import load_pipeline

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    pipe = load_pipeline(write_suite(tmp_path))
    run_id = pipe.parent_run("suite-licences")
    tags = MlflowClient(pipe.tracking_uri).get_run(run_id).data.tags
    assert tags["tidal.intended_use"] == "research"
    assert tags["tidal.licence.brown"] == "LicenseRef-Brown-Corpus"
    assert tags["tidal.licence.gcide"] == "GPL-2.0-or-later"
