"""The end-of-run summary: steps run and skipped, tokens seen, losses, gate verdict, locations.

Read from what the run left behind: committed step directories (the truth about what
exists) and the MLflow parent run (what this particular DAG run did: ``run`` or ``skip``).
Tracking calls that earlier tasks buffered while MLflow was down (objects under the storage
root, :meth:`tidal.tracking.Tracker.replay_pending`) are sent first, so the run the report
reads is as complete as MLflow allows; failed gate attempts are read as objects of the root,
so a report in a fresh pod sees the evidence of a gate that failed in another.
A recipe has one ``train`` step; a scaling suite (tidal/core/suite_pipeline.py) has a grid of
train steps and a ``fit`` step instead, and its report lists each grid run and the fit.
"""

from __future__ import annotations

import json
from typing import Any

from tidal.core.mixture import mixture_table
from tidal.eval.chance import reference
from tidal.scaling.suite import FIT_STEP
from tidal.storage.layout import STEP_JSON, SUMMARY_JSON
from tidal.tracking import TrackingUnavailable, child_runs, parent_run, safe_uri, store_exists


def build_report(pipe: Any, run_key: str | None = None, finish: bool = False) -> dict[str, Any]:
    """Summarize the DAG run ``run_key`` of ``pipe`` (a :class:`tidal.core.pipeline.Pipeline`).

    Args:
        run_key: MLflow parent-run key; None picks the newest parent run of the recipe.
        finish: also mark the MLflow parent run FINISHED (or FAILED when steps are missing), with
            the run's final metrics (:meth:`tidal.core.pipeline.Pipeline.finish_run`).

    Returns:
        A flat dict: ``steps_run``, ``steps_skipped`` (names), ``missing`` (uncommitted
        step names), ``tokens_seen``, ``final_train_loss``, ``eval_loss``, ``evals``
        (:func:`eval_curves`), ``gate``,
        ``mlflow_uri``, ``mlflow_run_id``, ``checkpoints``, ``overrides`` (the run's dotted recipe
        overrides: load ``pipe`` with :func:`tidal.audit.catalog.pipeline_of_run` to get them),
        ``replayed`` (buffered tracking calls
        sent now; ``replay_error`` if the buffer could not be read), and for a failed gate
        ``gate_evidence`` and ``gate_data_docs`` (URIs of the kept attempt), ``mixture`` (the mixture
        table's lines once the mix step is committed, :mod:`tidal.core.mixture`). For a scaling suite, instead of
        the train-step keys: ``kind`` (``scaling_suite``), ``base`` (the base recipe's name),
        ``grid`` (one dict per train step, :func:`_grid_runs`) and ``fit`` (:func:`_fit_result`); with a committed
        eval step, ``downstream`` (:func:`downstream`).
    """
    graph, storage = pipe.graph, pipe.storage
    suite = getattr(pipe, "suite", None)
    missing = [s.name for s in graph if not storage.is_committed(s.step_id)]
    report: dict[str, Any] = {"recipe": pipe.recipe.name if suite is None else suite.name,
                              "missing": missing, "run_key": run_key, "overrides": dict(pipe.overrides)}
    _replay_pending(pipe, report)
    statuses = _mlflow_statuses(pipe, run_key, report)
    report["steps_run"] = [n for n, st in statuses.items() if st == "run"]
    report["steps_skipped"] = [n for n, st in statuses.items() if st == "skip"]

    if suite is not None:
        report.update(kind="scaling_suite", base=pipe.recipe.name, grid=_grid_runs(pipe), fit=_fit_result(pipe))
    elif storage.is_committed(graph["train"].step_id):
        train_id = graph["train"].step_id
        record = json.loads(storage.read_text(train_id, STEP_JSON))
        summary = record["summary"]
        for key in ("tokens_seen", "final_train_loss", "eval_loss", "steps", "checkpoint_root_hash"):
            report[key] = summary.get(key)
        if sizing := sizing_of(record):
            report["sizing"] = sizing
        report["evals"] = eval_curves(summary)
        report["checkpoints"] = storage.step_uri(train_id).rstrip("/") + "/checkpoints"
    if suite is None and "eval" in graph.by_name and storage.is_committed(graph["eval"].step_id):
        report["downstream"] = downstream(json.loads(storage.read_text(graph["eval"].step_id, "results.json")))
    gate = graph["gate"]
    gate_text = _committed_text(storage, gate.step_id, "gate_result.json")
    if gate_text is not None:
        report["gate"] = "passed" if json.loads(gate_text)["success"] else "failed"
    else:
        report["gate"] = "not passed (gate step not committed)"
        for attempt in reversed(storage.failed_attempts(gate.step_id)):  # newest first
            data = storage.read_object(attempt + "gate_result.json")
            if data is None:
                continue
            result = json.loads(data)
            report["gate_evidence"] = storage.object_uri(attempt)
            if storage.read_object(attempt + "data_docs/index.html") is not None:
                report["gate_data_docs"] = storage.object_uri(attempt + "data_docs/index.html")
            report["gate"] = (f"FAILED ({report['gate_evidence']})\n    "
                              + result["summary"].replace("\n", "\n    "))
            break
    if storage.is_committed(graph["mix"].step_id):
        report["mixture"] = mixture_table(pipe).lines()  # per source: tokens, weight, taken, epochs, unused
    if finish and report.get("mlflow_run_id"):
        pipe.finish_run(report["mlflow_run_id"], "FAILED" if missing else "FINISHED")
    return report


def eval_curves(summary: dict[str, Any]) -> dict[str, list[float | None]]:
    """``{eval set: [loss at step 0, final loss]}`` (nats/token) from a trainer ``summary.json``
    (``initial_eval_loss/<set>``, ``eval_loss/<set>``); the first is None for a run trained before
    step-0 evals existed. Sets in name order: ``heldout/<source>`` (in distribution), then sources."""
    curves = {}
    for key, last in sorted(summary.items()):
        if key.startswith("eval_loss/"):
            name = key.removeprefix("eval_loss/")
            curves[name] = [summary.get(f"initial_eval_loss/{name}"), last]
    return dict(sorted(curves.items(), key=lambda kv: (not kv[0].startswith("heldout/"), kv[0])))


def _replay_pending(pipe: Any, report: dict[str, Any]) -> None:
    """Send the tracking calls buffered under the storage root (or the store's pending dir) before
    reading MLflow; ``report["replayed"]`` counts them. Never raises: the report stands without."""
    try:
        report["replayed"] = pipe.tracker().replay_pending()
    except Exception as err:  # noqa: BLE001 - a bucket or disk error: tracking never takes the report down
        report["replayed"] = 0
        report["replay_error"] = f"{type(err).__name__}: {err}"


def _grid_runs(pipe: Any) -> list[dict[str, Any]]:
    """One dict per train step of a suite's grid, in graph order: ``name``, ``step_id``,
    ``committed`` and, when committed, ``tokens_seen``, ``final_train_loss``, ``eval_loss`` and
    ``steps`` from the trainer's ``summary.json`` (what the fit step reads too)."""
    runs = []
    for step in pipe.graph:
        if step.kind != "train":
            continue
        run: dict[str, Any] = {"name": step.name, "step_id": step.step_id,
                               "committed": pipe.storage.is_committed(step.step_id)}
        text = _committed_text(pipe.storage, step.step_id, SUMMARY_JSON)
        if text is not None:
            summary = json.loads(text)
            run.update({k: summary.get(k) for k in ("tokens_seen", "final_train_loss", "eval_loss", "steps")})
        runs.append(run)
    return runs


def _fit_result(pipe: Any) -> dict[str, Any]:
    """A suite's ``fit`` step: ``step_id``, ``committed`` and, when committed, its summary
    (``n_runs``, ``n_flags``, ``alpha``, ``beta``, ``E``, ``holdout_rel_error``, ...)."""
    step = pipe.graph[FIT_STEP]
    fit: dict[str, Any] = {"step_id": step.step_id, "committed": pipe.storage.is_committed(step.step_id)}
    text = _committed_text(pipe.storage, step.step_id, STEP_JSON)
    if text is not None:
        fit["summary"] = json.loads(text).get("summary") or {}
    return fit


def _committed_text(storage: Any, step_id: str, name: str) -> str | None:
    """A file of a committed step (local or object store), or None if uncommitted or absent."""
    if not storage.is_committed(step_id):
        return None
    try:
        return storage.read_text(step_id, name)
    except FileNotFoundError:
        return None


def _mlflow_statuses(pipe: Any, run_key: str | None, report: dict[str, Any]) -> dict[str, str]:
    """Step name -> ``run``/``skip`` from the nested runs of the parent run (empty when tracking is
    unreachable: ``report["mlflow_error"]`` then says so, and the rest of the report stands)."""
    uri = pipe.tracking_uri
    report["mlflow_uri"] = safe_uri(uri)
    if not store_exists(uri):
        report["mlflow_error"] = "no MLflow store yet (nothing has run with tracking)"
        return {}
    try:
        # parent runs carry tidal.run_key; nested step runs carry the recipe hash too, but no key
        parent = parent_run(uri, pipe.experiment, run_key, recipe_hash=pipe.recipe_hash)
        if parent is None:
            report["mlflow_error"] = (
                f"no MLflow run with key {run_key!r} for this recipe" if run_key
                else "no MLflow run of this exact recipe yet (runs of other versions are not shown)"
            )
            return {}
        report["mlflow_run_id"] = parent.run_id
        report["run_key"] = parent.run_key
        report["run_status"] = {"FINISHED": "succeeded", "FAILED": "failed", "KILLED": "killed"}.get(
            parent.status, parent.status.lower())
        children = child_runs(uri, parent)
    except (TrackingUnavailable, ValueError) as err:  # tracking never takes the report down
        report["mlflow_error"] = str(err)
        return {}
    order = {s.name: i for i, s in enumerate(pipe.graph)}
    found = {c.name: c.tags.get("tidal.status", "") for c in children}
    return dict(sorted(((n, st) for n, st in found.items() if n in order), key=lambda kv: order[kv[0]]))


def format_report(report: dict[str, Any]) -> str:
    """The report as the few lines ``make demo`` ends with."""

    def fmt(value: Any) -> str:
        return f"{value:.4f}" if isinstance(value, float) else str(value)

    what = (f"scaling suite {report['recipe']} on base recipe {report['base']}" if report.get("kind") == "scaling_suite"
            else f"recipe {report['recipe']}")
    overrides = ", ".join(f"{k}={v}" for k, v in (report.get("overrides") or {}).items())
    key = report.get("run_key")
    head = (f"run key {key}, {report.get('run_status', 'status unknown')}" if key else "no run yet: the recipe as "
            "written") + f"; overrides: {overrides or 'none'}"
    lines = [
        f"tidal run of {what} ({head})",
        f"  steps run:     {len(report['steps_run'])}  {' '.join(report['steps_run'])}",
        f"  steps skipped: {len(report['steps_skipped'])}",
        f"  gate:          {report['gate']}",
    ]
    lines += [f"  {line}" for line in report.get("mixture", [])]
    if "tokens_seen" in report:
        lines += [
            f"  tokens seen:   {report['tokens_seen']:,} over {report.get('steps')} training steps",
            f"  train loss:    {fmt(report.get('final_train_loss'))} (final)",
        ]
        lines += _format_evals(report, fmt)
        lines += [f"  {line}" for line in sizing_lines(report.get("sizing"))]
        lines.append(f"  checkpoints:   {report['checkpoints']}")
    lines += _format_downstream(report.get("downstream") or {})
    if "grid" in report:
        lines += _format_suite(report, fmt)
    if report.get("gate_data_docs"):
        lines.append(f"  data docs:     {report['gate_data_docs']}")
    lines.append(f"  MLflow:        {report['mlflow_uri']} run {report.get('mlflow_run_id', '(none)')}")
    if report.get("replayed"):
        lines.append(f"  MLflow replay: {report['replayed']} buffered call(s) sent now")
    if report.get("replay_error"):
        lines.append(f"  MLflow replay: buffer not read: {report['replay_error']}")
    if report.get("mlflow_error"):
        lines.append(f"  MLflow error:  {report['mlflow_error']}")
    if report["missing"]:
        lines.append(f"  NOT COMMITTED: {', '.join(report['missing'])}")
    return "\n".join(lines)


def sizing_of(record: dict[str, Any]) -> dict[str, Any] | None:
    """What the GKE launch sized a train step as (``provenance.sizing`` of its ``step.json``,
    :func:`tidal.train.preflight.sizing_record`) with ``"measured"``: the trainer's ``step_time_s``, ``mfu`` and
    ``tokens_per_second`` from the same record; None for a step that was not sized (a local or CPU run)."""
    sizing = (record.get("provenance") or {}).get("sizing")
    if not sizing:
        return None
    summary = record.get("summary") or {}
    return {**sizing, "measured": {k: summary.get(k) for k in ("step_time_s", "mfu", "tokens_per_second")}}


def sizing_lines(sizing: dict[str, Any] | None) -> list[str]:
    """:func:`sizing_of` as text (the report and the on-call page): HBM per chip, and the step time and MFU
    predicted (from the compiled program, or an analytical sizing's estimated traffic) beside the measured ones;
    two lines, or none when not sized."""
    if not sizing:
        return []
    m, measured = sizing["mesh"], sizing["measured"]
    lines = [(f"sizing:        {sizing['where']}, mesh data={m['data']} fsdp={m['fsdp']} tensor={m['tensor']}, "
             f"{sizing['hbm_per_chip_bytes'] / 2**30:.2f} of {sizing['hbm_capacity_bytes'] / 2**30:.2f} GiB HBM per "
             f"chip ({sizing['method']})")]
    step_s, mfu = measured.get("step_time_s"), measured.get("mfu")
    got = (f"measured {step_s * 1e3:.1f} ms per step" + (f", MFU {mfu:.1%}" if mfu is not None else "")
           if step_s is not None else "no step time measured")
    if "predicted_step_s" in sizing:
        lines.append(f"step time:     predicted {sizing['predicted_step_s'] * 1e3:.1f} ms, MFU "
                     f"{sizing['predicted_mfu']:.1%}; {got}")
    else:
        lines.append(f"step time:     not predicted (a record written before sizings predicted one); {got}")
    return lines


def _format_evals(report: dict[str, Any], fmt: Any) -> list[str]:
    """One line per eval set, ``first -> last`` (step 0, before any update, -> the final step), marked
    in or out of distribution; the mean alone when the report has no per-set values."""
    evals = report.get("evals") or {}
    if not evals:
        return [f"  eval loss:     {fmt(report.get('eval_loss'))} (held out)"]
    lines = [f"  eval loss:     nats/token, step 0 -> {report.get('steps')} (mean {fmt(report.get('eval_loss'))})"]
    width = max(len(name) for name in evals)
    for name, (first, last) in evals.items():
        where = ("in distribution: held-out documents of a training source" if name.startswith("heldout/")
                 else "out of distribution: a source kept out of the mixture")
        lines.append(f"    {name:<{width}}  {fmt(first)} -> {fmt(last)}  ({where})")
    return lines


def downstream(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{task: {metric: value, "n_examples": n}}`` from an eval step's ``results.json`` (tidal/eval/step.py).

    Raises:
        ValueError: ``results`` is not of that shape (a damaged file), naming what is missing.
    """
    tasks = results.get("tasks", {}) if isinstance(results, dict) else None
    if not isinstance(tasks, dict):
        raise ValueError("results.json: 'tasks' is not a mapping of task name to results")  # noqa: TRY004 - a damaged file
    out = {}
    for name, entry in sorted(tasks.items()):
        if not isinstance(entry, dict) or not isinstance(entry.get("metrics"), dict) or "n_examples" not in entry:
            raise ValueError(f"results.json: task {str(name)[:80]!r} has no 'metrics' mapping and 'n_examples'")
        out[str(name)] = {**entry["metrics"], "n_examples": entry["n_examples"]}
    return out


def _format_downstream(tasks: dict[str, dict[str, Any]]) -> list[str]:
    """One line per downstream task: its metrics (lm-eval's names, 6 significant digits) and the number of
    examples."""
    if not tasks:
        return []
    width = max(len(name) for name in tasks)
    lines = [("  downstream:    lm-evaluation-harness on the final checkpoint (zero-shot; chance levels and notes: "
              "tidal/eval/chance.py)")]
    notes: dict[tuple[str, str], str] = {}  # (metric, note) -> the first task it is shown for
    for name, values in tasks.items():
        shown = []
        for key, value in values.items():
            if key == "n_examples":
                continue
            ref = reference(name, key)
            text = f"{key} {value:.6g}" if isinstance(value, float) else f"{key} {value}"
            if ref is not None and ref.chance is not None:
                text += f" (chance {ref.chance:.3g})"
            if ref is not None:
                notes.setdefault((key, ref.note), name)
            shown.append(text)
        lines.append(f"    {name:<{width}}  {'  '.join(shown)}  (n={values['n_examples']})")
    lines += [f"    {key} ({task}): {note}" for (key, note), task in notes.items()]
    return lines


def _format_suite(report: dict[str, Any], fmt: Any) -> list[str]:
    """The grid (one line per train step) and the fit of a scaling suite's report."""
    grid = report["grid"]
    lines = [f"  grid:          {sum(r['committed'] for r in grid)} of {len(grid)} train steps committed"]
    width = max((len(r["name"]) for r in grid), default=0)
    for run in grid:
        if run["committed"]:
            tokens = run.get("tokens_seen")
            lines.append(f"    {run['name']:<{width}}  tokens {tokens if tokens is None else format(tokens, ',')}  "
                         f"train loss {fmt(run.get('final_train_loss'))}  eval loss {fmt(run.get('eval_loss'))}")
        else:
            lines.append(f"    {run['name']:<{width}}  not committed")
    fit = report["fit"]
    if not fit["committed"]:
        lines.append(f"  fit:           {fit['step_id']} not committed (it needs every train step of the grid)")
        return lines
    summary = fit.get("summary", {})
    laws = ", ".join(f"{key} {fmt(summary[key])}" for key in ("alpha", "beta", "E", "alpha_C") if key in summary)
    lines.append(f"  fit:           {fit['step_id']}: {summary.get('n_runs')} runs, {laws or 'no law fitted'}, "
                 f"{summary.get('n_flags', 0)} flag(s)")
    if "holdout_rel_error" in summary:
        lines.append(f"                 hold-out budget {summary.get('holdout_budget'):.3g}: predicted "
                     f"{fmt(summary.get('holdout_predicted'))}, actual {fmt(summary.get('holdout_actual'))} "
                     f"({100 * summary['holdout_rel_error']:+.1f} %)")
    lines.append("                 forecasts: tidal forecast SUITE --flops C")
    return lines
