"""The gate step kind over a real Great Expectations ephemeral context, on small stats tables."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from pydantic import ValidationError

from tidal.context import StepContext
from tidal.quality import gates
from tidal.quality.gate_config import GateConfig, GateSettings

WEIGHTS = {"brown": 0.7, "udhr": 0.3}
CONFIG = {
    "stats": "stats", "min_total_tokens": 1000, "weights": WEIGHTS,
    "mixture_tolerance": 0.02, "max_quarantine_rate": 0.05, "max_duplicate_rate": 0.5,
}


def stats_rows(**override: float) -> list[tuple[str, str, float]]:
    """Good stats rows; ``override`` keys are ``"{source}__{metric}"``."""
    rows = {("all", "total_tokens"): 50_000.0, ("all", "quarantine_rate"): 0.01,
            ("all", "documents_in"): 300.0, ("all", "documents_kept"): 280.0}
    for src, w in WEIGHTS.items():
        rows |= {(src, "documents_in"): 150.0, (src, "quarantine_rate"): 0.01, (src, "duplicate_rate"): 0.02,
                 (src, "tokens"): 25_000.0, (src, "mixture_weight_requested"): w,
                 (src, "mixture_weight_realized"): w + 0.005}
    for key, value in override.items():
        src, metric = key.split("__")
        rows[(src, metric)] = value
    return [(s, m, v) for (s, m), v in sorted(rows.items())]


def make_ctx(tmp_path: Path, rows: list[tuple[str, str, float]]) -> StepContext:
    stats_dir, out_dir = tmp_path / "stats", tmp_path / "out"
    stats_dir.mkdir()
    out_dir.mkdir()
    pd.DataFrame(rows, columns=["source", "metric", "value"]).to_parquet(stats_dir / "stats.parquet")
    return StepContext(step_id="gate-0123456789ab", name="gate", kind="gate", config=CONFIG,
                       out_dir=out_dir, inputs={"stats": stats_dir}, input_ids={"stats": "stats-x"})


def test_passing_stats_writes_result_and_data_docs(tmp_path):
    ctx = make_ctx(tmp_path, stats_rows())
    summary = gates.run(ctx)
    # all: total_tokens + quarantine; per clean source: quarantine + duplicate; per weight: realized
    assert summary == {"gate_success": 1, "expectations": 8, "failed": 0}
    result = json.loads((ctx.out_dir / "gate_result.json").read_text())
    assert result["success"] is True and len(result["results"]) == 8
    assert all(r["success"] for r in result["results"])
    assert {r["expectation"] for r in result["results"]} == {"expect_column_values_to_be_between"}
    brown = next(r for r in result["results"] if r["source"] == "brown" and r["column"] == "mixture_weight_realized")
    assert brown["observed"] == pytest.approx(0.705) and brown["min"] == pytest.approx(0.68)
    assert (ctx.out_dir / "data_docs" / "index.html").is_file()
    assert list((ctx.out_dir / "data_docs" / "validations").rglob("*.html"))


def test_gate_summary_page_renders_offline_with_the_run_time(tmp_path):
    """Issue 21, item 10: GX's Data Docs need CDNs and showed 1970; tidal's page needs nothing."""
    import datetime as dt
    import re

    ctx = make_ctx(tmp_path, stats_rows(brown__mixture_weight_realized=0.9))
    with pytest.raises(gates.GateFailed):
        gates.run(ctx)
    page = (ctx.out_dir / "gate_summary.html").read_text()
    assert not re.search(r"https?://", page) and "<script" not in page and "<link" not in page
    assert "1970" not in page and f"Run time: {dt.datetime.now(dt.UTC):%Y-%m-%d}" in page
    assert page.count("<tr>") == 9 and page.count('"fail">FAIL</td>') == 1 and page.count('"pass">PASS</td>') == 7
    assert '<span class="fail">FAIL</span>' in page
    assert re.search(r"<td>brown</td><td>mixture_weight_realized</td>.*?<td class=\"num\">0\.9</td>", page)
    assert not [p for p in (ctx.out_dir / "data_docs").rglob("*") if "1970" in p.name]


def test_failed_expectations_raise_readable_summary(tmp_path):
    ctx = make_ctx(tmp_path, stats_rows(brown__mixture_weight_realized=0.9, udhr__quarantine_rate=0.4))
    with pytest.raises(gates.GateFailed) as err:
        gates.run(ctx)
    message = str(err.value)
    lines = message.splitlines()
    assert lines[0] == "gate failed: 2 of 8 expectations"
    weight_line = next(line for line in lines if "mixture_weight_realized" in line)
    assert "brown" in weight_line and "between 0.68 and 0.72" in weight_line and "got 0.9" in weight_line
    quarantine_line = next(line for line in lines if "quarantine_rate" in line)
    assert "udhr" in quarantine_line and "<= 0.05" in quarantine_line and "got 0.4" in quarantine_line
    result = err.value.result
    assert result["success"] is False and result["summary"] == message
    assert sorted((r["source"], r["column"]) for r in result["results"] if not r["success"]) == [
        ("brown", "mixture_weight_realized"), ("udhr", "quarantine_rate")]


def test_missing_metric_row_is_a_clear_error(tmp_path):
    rows = [r for r in stats_rows() if r[:2] != ("udhr", "mixture_weight_realized")]
    ctx = make_ctx(tmp_path, rows)
    with pytest.raises(gates.StatsIncomplete, match=r"stats\.parquet.*source='udhr', metric='mixture_weight_realized'"):
        gates.run(ctx)
    # issue 22, item 9: the reason is kept where report and on-call read it
    result = json.loads((ctx.out_dir / "gate_result.json").read_text())
    assert result["success"] is False and result["error"] == "stats_incomplete" and result["results"] == []
    assert result["summary"].startswith("gate failed: statistics incomplete: ") and "mixture_weight_realized" in \
        result["summary"]


def test_nan_value_counts_as_missing(tmp_path):
    ctx = make_ctx(tmp_path, stats_rows(all__total_tokens=float("nan")))
    with pytest.raises(gates.StatsIncomplete, match="total_tokens"):
        gates.run(ctx)


def test_config_without_threshold_is_refused(tmp_path):
    """The config is parsed into GateConfig once, when the step's context is made (before run)."""
    ctx = make_ctx(tmp_path, stats_rows())
    with pytest.raises(ValidationError, match="min_total_tokens\n  Field required"):
        StepContext(**{**ctx.__dict__, "config": {k: v for k, v in CONFIG.items() if k != "min_total_tokens"}})
    for weights, rule in (({}, "weights\n  Dictionary should have at least 1 item"),
                          ({"brown": 0.0}, "weights sum to 0.0; need > 0"),
                          ({"brown": -1.0}, "weights.brown\n  Input should be greater than or equal to 0")):
        with pytest.raises(ValidationError, match=rule):
            StepContext(**{**ctx.__dict__, "config": {**CONFIG, "weights": weights}})


def test_recipe_defaults_are_the_gate_config_defaults():
    config = GateConfig.model_validate({"min_total_tokens": 10, "weights": {"a": 3.0, "b": 1.0}})
    assert (config.stats, config.mixture_tolerance, config.max_quarantine_rate) == ("stats", 0.02, 0.05)
    assert config.requested == {"a": 0.75, "b": 0.25}
    assert set(GateSettings.model_fields) < set(GateConfig.model_fields)


def test_unused_token_bound_fails_with_the_share_and_the_fix(tmp_path):
    """Issue 21, item 4: the gate can bound the training tokens a mixture leaves unused."""
    rows = stats_rows(all__mixture_unused_token_fraction=0.83)
    bounded = {**CONFIG, "max_unused_token_fraction": 0.5}
    ctx = make_ctx(tmp_path, rows)
    ctx = StepContext(**{**ctx.__dict__, "config": bounded})
    with pytest.raises(gates.GateFailed) as err:
        gates.run(ctx)
    lines = str(err.value).splitlines()
    assert lines[0] == "gate failed: 1 of 9 expectations"
    assert lines[1] == (
        "  mixture_unused_token_fraction [source=all]: expected <= 0.5, got 0.83: the mixture leaves 83.0 % of the "
        "training sources' tokens unused (gate.max_unused_token_fraction 0.5); `tidal plan` shows the tokens per "
        "source: size the mixture with mixture.size {mode: token_budget, tokens: N, max_epochs: E} or change "
        "mixture.weights")
    check = next(r for r in err.value.result["results"] if r["column"] == "mixture_unused_token_fraction")
    assert check["source"] == "all" and check["max"] == 0.5 and check["success"] is False


def test_unused_token_bound_passes_and_is_off_by_default(tmp_path):
    ctx = make_ctx(tmp_path, stats_rows(all__mixture_unused_token_fraction=0.2))
    assert gates.run(StepContext(**{**ctx.__dict__, "config": {**CONFIG, "max_unused_token_fraction": 0.25}})) == {
        "gate_success": 1, "expectations": 9, "failed": 0}
    assert GateSettings(min_total_tokens=1).max_unused_token_fraction is None
    other = tmp_path / "default"
    other.mkdir()
    assert gates.run(make_ctx(other, stats_rows()))["expectations"] == 8  # no row needed without the bound
    missing = tmp_path / "missing"
    missing.mkdir()
    ctx = make_ctx(missing, stats_rows())  # a bound but no row (stats v2): refused, not passed
    with pytest.raises(gates.StatsIncomplete, match="metric='mixture_unused_token_fraction'"):
        gates.run(StepContext(**{**ctx.__dict__, "config": {**CONFIG, "max_unused_token_fraction": 0.25}}))


def test_contaminated_fraction_bound_checks_each_decontaminated_source_and_all(tmp_path):
    """Issue 23, item 3: the gate can bound the share of documents that held eval text."""
    rows = stats_rows(brown__documents_contaminated=3.0, brown__contaminated_rate=0.02,
                      all__documents_contaminated=3.0, all__contaminated_rate=0.01)
    ctx = make_ctx(tmp_path, rows)
    bounded = StepContext(**{**ctx.__dict__, "config": {**CONFIG, "max_contaminated_fraction": 0.015}})
    with pytest.raises(gates.GateFailed) as err:
        gates.run(bounded)
    lines = str(err.value).splitlines()
    assert lines[0] == "gate failed: 1 of 10 expectations"
    assert lines[1].startswith("  contaminated_rate [source=brown]: expected <= 0.015, got 0.02: 2.00 % of the "
                               "documents held eval text (gate.max_contaminated_fraction 0.015)")
    passing = tmp_path / "passing"
    passing.mkdir()
    ctx = make_ctx(passing, rows)
    assert gates.run(StepContext(**{**ctx.__dict__, "config": {**CONFIG, "max_contaminated_fraction": 0.05}}))[
        "expectations"] == 10
    assert "max_contaminated_fraction" not in GateSettings(min_total_tokens=1).model_dump()  # ids unchanged
