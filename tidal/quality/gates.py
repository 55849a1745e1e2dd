"""The ``gate`` step kind: a Great Expectations suite over the stats table stops bad data.

Input: ``stats.parquet`` of the ``stats`` step, the tidy table ``(source, metric, value)``
described in ``docs/contracts.md``. The gate pivots it to **one row per source** (the
``source`` column, plus one float column per metric; ``source == "all"`` is the row of
whole-pipeline totals) and validates that frame as one whole-dataframe batch of a pandas
datasource in an ephemeral GX context. Every expectation is an
``ExpectColumnValuesToBeBetween`` on one metric column, restricted to one source's row with a
GX row condition (``Column("source") == src``), so each result names one (source, metric):

=================================  ===========================  ======================================
metric column                      rows (sources)               bound
=================================  ===========================  ======================================
``total_tokens``                   ``all``                      ``>= min_total_tokens`` (tokens)
``quarantine_rate``                ``all`` + each clean source  ``<= max_quarantine_rate`` (fraction)
``duplicate_rate``                 each clean source            ``<= max_duplicate_rate`` (if not null)
``mixture_weight_realized``        each source in ``weights``   requested ± ``mixture_tolerance``
``mixture_unused_token_fraction``  ``all``                      ``<= max_unused_token_fraction`` (if
                                                                not null)
``contaminated_rate``              ``all`` + each decontaminated ``<= max_contaminated_fraction`` (if
                                   source                       not null)
=================================  ===========================  ======================================

``contaminated_rate`` is the share of a training source's documents that held at least one paragraph
contaminated by an eval source (:mod:`tidal.data.decontaminate`; removed before tokenizing, so the bound
is on how much eval text reached the cleaned source, not on what trains); a *decontaminated source* is
one with a ``documents_contaminated`` row.

``mixture_unused_token_fraction`` is the share of the training sources' packed tokens that the
mixture never takes (a ``smallest_source`` mixture leaves the rest of the larger sources unused;
``tidal plan`` prints the table per source).

A *clean source* is any source other than ``all`` with a ``documents_in`` row. Requested
weights are the config's ``weights`` normalized to sum to 1 (the mixture's proportions);
the tolerance is absolute (0.02 means ±2 percentage points). A source with weight 0 is
checked only if the mixture wrote a row for it. All thresholds come from the recipe's
``gate`` section (:class:`tidal.quality.gate_config.GateSettings`, whose defaults are the only ones); the
step config is :class:`tidal.quality.gate_config.GateConfig`.

Before GX runs, every (source, metric) cell the suite reads must be present and finite;
otherwise :class:`StatsIncomplete` is raised, since a between-expectation silently ignores
missing values and would pass.

Outputs in ``ctx.out_dir``: ``gate_result.json`` (see :func:`run`), ``gate_summary.html`` (the
verdict as one static page that renders offline, :mod:`tidal.quality.gate_html`) and
``data_docs/`` (the GX Data Docs static site, built by GX's ``UpdateDataDocsAction`` into that
directory; open ``data_docs/index.html``; its styles come from CDNs, so it needs network access to
render styled). The validation run id is (step name, the real run time): the gate's output is
compared across runs by ``gate_result.json``, not by bytes (its Data Docs carry render times).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidal.context import StepContext
from tidal.quality.gate_config import GateConfig
from tidal.quality.gate_html import write_summary_html

if TYPE_CHECKING:
    import pandas as pd  # imported where a table is read (the step runs; planning imports only gate_config)

STEP_VERSION = 2  # 2: gate_summary.html, Data Docs at the real run time
STATS_FILE = "stats.parquet"
RESULT_FILE = "gate_result.json"
DOCS_DIR = "data_docs"
ALL = "all"


class GateFailed(RuntimeError):
    """The stats failed one or more expectations.

    ``str(err)`` is a multi-line summary, one line per failed expectation (what, expected,
    got). ``err.result`` is the full ``gate_result.json`` payload, so a caller can record it
    even though the runner discards a failed step's scratch directory.
    """

    def __init__(self, summary: str, result: dict[str, Any]):
        super().__init__(summary)
        self.result = result


class StatsIncomplete(ValueError):
    """The stats table lacks a row (or has a NaN value) that the gate needs; names file and rows."""


def plan_checks(stats: pd.DataFrame, cfg: GateConfig) -> list[dict[str, Any]]:
    """The checks the suite will hold: ``[{"source", "metric", "min", "max"}]`` (bounds may be None).

    Args:
        stats: the tidy stats table (columns source, metric, value).
        cfg: the gate config (see module docstring).
    """
    clean_sources = sorted(set(stats.loc[stats["metric"] == "documents_in", "source"]) - {ALL})
    checks = [
        {"source": ALL, "metric": "total_tokens", "min": float(cfg.min_total_tokens), "max": None},
        {"source": ALL, "metric": "quarantine_rate", "min": None, "max": cfg.max_quarantine_rate},
    ]
    checks += [{"source": s, "metric": "quarantine_rate", "min": None, "max": cfg.max_quarantine_rate}
               for s in clean_sources]
    if cfg.max_duplicate_rate is not None:
        checks += [{"source": s, "metric": "duplicate_rate", "min": None, "max": cfg.max_duplicate_rate}
                   for s in clean_sources]
    if cfg.max_unused_token_fraction is not None:
        checks.append({"source": ALL, "metric": "mixture_unused_token_fraction", "min": None,
                       "max": cfg.max_unused_token_fraction})
    if cfg.max_contaminated_fraction is not None:
        decontaminated = sorted(set(stats.loc[stats["metric"] == "documents_contaminated", "source"]) - {ALL})
        checks += [{"source": s, "metric": "contaminated_rate", "min": None, "max": cfg.max_contaminated_fraction}
                   for s in [ALL, *decontaminated]]
    tol = cfg.mixture_tolerance
    mixed = set(stats.loc[stats["metric"] == "mixture_weight_realized", "source"])
    checks += [{"source": s, "metric": "mixture_weight_realized", "min": w - tol, "max": w + tol}
               for s, w in cfg.requested.items() if w > 0 or s in mixed]  # weight 0 may have no row
    return checks


def pivot_stats(stats: pd.DataFrame, checks: list[dict[str, Any]], path: str | Path) -> pd.DataFrame:
    """One row per source, one float column per metric; checks every cell ``checks`` reads.

    Raises:
        StatsIncomplete: a needed (source, metric) row is absent or its value is NaN/inf,
            or a (source, metric) pair appears more than once; names ``path`` and the rows.
    """
    missing_cols = {"source", "metric", "value"} - set(stats.columns)
    if missing_cols:
        raise StatsIncomplete(f"{path}: columns {sorted(missing_cols)} missing; has {list(stats.columns)}")
    dup = stats[stats.duplicated(["source", "metric"], keep=False)]
    if len(dup):
        pairs = sorted(set(zip(dup["source"], dup["metric"])))
        raise StatsIncomplete(f"{path}: duplicate (source, metric) rows {pairs}")
    wide = stats.pivot(index="source", columns="metric", values="value").astype("float64")
    wide.columns.name = None
    bad = []
    for check in checks:
        src, metric = check["source"], check["metric"]
        value = wide.at[src, metric] if src in wide.index and metric in wide.columns else float("nan")
        if not math.isfinite(value):
            bad.append(f"(source={src!r}, metric={metric!r})")
    if bad:
        raise StatsIncomplete(
            f"{path}: the gate needs these stats rows, which are missing or not finite: " + ", ".join(bad)
        )
    return wide.reset_index()


def _expected_text(check: dict[str, Any]) -> str:
    lo, hi = check["min"], check["max"]
    if lo is not None and hi is not None:
        return f"between {lo:.6g} and {hi:.6g}"
    return f">= {lo:.6g}" if lo is not None else f"<= {hi:.6g}"


def validate(wide: pd.DataFrame, checks: list[dict[str, Any]], docs_dir: Path | None,
             run_name: str, run_time: dt.datetime | None = None) -> list[dict[str, Any]]:
    """Run the checks as a GX suite over ``wide``; build Data Docs into ``docs_dir`` if given.

    ``run_time``: the validation's time (timezone-aware; default now), shown in the Data Docs.

    Returns:
        One result per check, in order: ``{"expectation", "source", "column", "observed",
        "expected", "min", "max", "success"}``; ``observed`` is the cell's value.
    """
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")  # read by GX before any context exists
    import great_expectations as gx
    from great_expectations.core.run_identifier import RunIdentifier
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )
    from great_expectations.expectations.row_conditions import Column

    sites = {}
    if docs_dir is not None:
        sites["tidal"] = {
            "class_name": "SiteBuilder",
            "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(docs_dir)},
            "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
        }
    context = gx.get_context(mode="ephemeral", project_config=DataContextConfig(
        store_backend_defaults=InMemoryStoreBackendDefaults(),
        analytics_enabled=False,
        progress_bars=ProgressBarsConfig(globally=False),
        data_docs_sites=sites,
    ))
    batch = (context.data_sources.add_pandas("stats").add_dataframe_asset("stats_by_source")
             .add_batch_definition_whole_dataframe("whole_table"))
    suite = context.suites.add(gx.ExpectationSuite(name="tidal_gate"))
    for i, check in enumerate(checks):
        suite.add_expectation(gx.expectations.ExpectColumnValuesToBeBetween(
            column=check["metric"], min_value=check["min"], max_value=check["max"],
            row_condition=Column("source") == check["source"],
            meta={"tidal_check": i, "source": check["source"]},
        ))
    definition = context.validation_definitions.add(gx.ValidationDefinition(name="gate", data=batch, suite=suite))
    actions = [gx.checkpoint.UpdateDataDocsAction(name="data_docs")] if docs_dir is not None else []
    checkpoint = context.checkpoints.add(gx.Checkpoint(
        name="gate", validation_definitions=[definition], actions=actions, result_format="SUMMARY",
    ))
    run_id = RunIdentifier(run_name=run_name, run_time=run_time or dt.datetime.now(dt.UTC))
    outcome = checkpoint.run(batch_parameters={"dataframe": wide}, run_id=run_id)
    (validation,) = outcome.run_results.values()
    by_check = {r.expectation_config.meta["tidal_check"]: r for r in validation.results}
    results = []
    for i, check in enumerate(checks):
        gx_result = by_check.get(i)
        if gx_result is None or gx_result.exception_info.get("raised_exception"):
            info = None if gx_result is None else gx_result.exception_info.get("exception_message")
            raise RuntimeError(f"GX did not evaluate check {check}: {info or 'no result'}")
        observed = float(wide.loc[wide["source"] == check["source"], check["metric"]].iloc[0])
        results.append({
            "expectation": gx_result.expectation_config.type, "source": check["source"],
            "column": check["metric"], "observed": observed, "expected": _expected_text(check),
            "min": check["min"], "max": check["max"], "success": bool(gx_result.success),
        })
    return results


# What a failed check means and what to change, for checks whose metric name alone does not say.
HINTS = {
    "mixture_unused_token_fraction": lambda r: (
        f"the mixture leaves {100 * r['observed']:.1f} % of the training sources' tokens unused "
        f"(gate.max_unused_token_fraction {r['max']:g}); `tidal plan` shows the tokens per source: size the "
        "mixture with mixture.size {mode: token_budget, tokens: N, max_epochs: E} or change mixture.weights"),
    "contaminated_rate": lambda r: (
        f"{100 * r['observed']:.2f} % of the documents held eval text (gate.max_contaminated_fraction {r['max']:g}); "
        "the decontaminate step removed it, but check the source: removed.parquet of decontaminate-<source> "
        "lists each paragraph and its eval source"),
}


def summarize(results: list[dict[str, Any]]) -> str:
    """A readable summary: a headline, then one line per failed expectation (what, expected, got;
    what it means for the checks in :data:`HINTS`)."""
    failed = [r for r in results if not r["success"]]
    if not failed:
        return f"gate passed: {len(results)} expectations"
    lines = [f"gate failed: {len(failed)} of {len(results)} expectations"]
    for r in failed:
        hint = HINTS.get(r["column"])
        lines.append(f"  {r['column']} [source={r['source']}]: expected {r['expected']}, got {r['observed']:.6g}"
                     + (f": {hint(r)}" if hint else ""))
    return "\n".join(lines)


def run(ctx: StepContext) -> dict[str, Any]:
    """Validate the stats step's table; write ``gate_result.json``, ``gate_summary.html`` and ``data_docs/``.

    ``gate_result.json`` = ``{"success": bool, "results": [...], "summary": str}`` with the
    results of :func:`validate`; when the statistics are incomplete it is still written, with no
    results, ``"error": "stats_incomplete"`` and the reason as its summary.

    Returns:
        ``{"gate_success": 1, "expectations": n, "failed": 0}``.

    Raises:
        GateFailed: some expectation failed (files are still written; ``err.result`` holds them).
        StatsIncomplete: a stats row the suite needs is missing or not finite (``gate_result.json`` says so).
    """
    import pandas as pd

    cfg: GateConfig = ctx.config  # parsed once, at plan time
    files = ctx.input_files(cfg.stats)  # read in place: one small parquet file
    path = files.uri_of(STATS_FILE)
    try:
        if not files.exists(STATS_FILE):
            raise StatsIncomplete(f"{path}: no stats table (input {cfg.stats!r} has no {STATS_FILE})")
        with files.open_input(STATS_FILE) as source:
            stats = pd.read_parquet(source)
        checks = plan_checks(stats, cfg)
        wide = pivot_stats(stats, checks, path)
    except StatsIncomplete as err:  # the reason stays with the failed attempt, for report and on-call
        result = {"success": False, "results": [], "error": "stats_incomplete",
                  "summary": f"gate failed: statistics incomplete: {err}"}
        (ctx.out_dir / RESULT_FILE).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
        write_summary_html(ctx.out_dir, result, dt.datetime.now(dt.UTC), ctx.name, path)
        raise
    ctx.log.info("gate: %d expectations over %d sources from %s", len(checks), len(wide), path)
    run_time = dt.datetime.now(dt.UTC)
    results = validate(wide, checks, ctx.out_dir / DOCS_DIR, run_name=ctx.name, run_time=run_time)
    success = all(r["success"] for r in results)
    result = {"success": success, "results": results, "summary": summarize(results)}
    (ctx.out_dir / RESULT_FILE).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    write_summary_html(ctx.out_dir, result, run_time, ctx.name, path)
    if not success:
        raise GateFailed(result["summary"], result)
    ctx.log.info("%s", result["summary"])
    return {"gate_success": 1, "expectations": len(results), "failed": 0}
