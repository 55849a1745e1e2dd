"""What the on-call page shows for one recipe, read from the storage root (no Airflow DB here).

The Airflow side (latest DAG runs and task states) is added by the plugin
(plugins/tidal_oncall.py), which runs inside the API server. Everything here is read from what
runs left behind: committed step directories, kept failed attempts, the failure catalog and
checkpoint manifests, so the page is right even when MLflow is down.
"""

from __future__ import annotations

import html
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from tidal.scaling.suite import is_suite_file
from tidal.train import CHECKPOINT_MANIFEST  # light: no JAX (see tidal/train/__init__.py)


def recipe_files(recipes_dir: Path) -> list[Path]:
    """Pipeline recipes in ``recipes_dir`` (scaling suites excluded), sorted by name."""
    return [p for p in sorted(Path(recipes_dir).glob("*.yaml")) if not is_suite_file(p)]


NONE_READABLE = "No recipe to show: your Airflow permissions let you read none of the tidal DAGs."
NO_RECIPES = "No recipe to show: the recipes folder has none."


def recipe_dag_id(recipe_path: Path) -> str | None:
    """The DAG id ``tidal_<name>`` of a recipe file from its top-level ``name`` alone: one YAML read, no
    pipeline load, so the on-call page checks a user's access before it does any per-recipe work. None
    when the file cannot be read so cheaply or has no string ``name`` (then it does not load either)."""
    from tidal.config import RecipeError
    from tidal.recipe.yaml_file import read_yaml

    try:
        data = read_yaml(recipe_path)
    except RecipeError:
        return None
    name = data.get("name") if isinstance(data, dict) else None
    return f"tidal_{name}" if isinstance(name, str) else None


def visible_statuses(statuses: list[dict[str, Any]], can_read: Callable[[str], bool],
                     can_read_all: bool) -> list[dict[str, Any]]:
    """The recipes of ``statuses`` (from :func:`recipe_status`) that a user may see on the on-call page, in order.

    The rule (issue 43, item 5): a user who may read every DAG (``can_read_all``: the auth manager's GET
    permission on DAGs with no DAG named) sees every recipe. Anyone else sees a recipe only when they may
    read its DAG (``can_read(dag_id)``), and no recipe that does not load: its entry (``{"path", "error"}``)
    has no DAG id to check and shows a file path and an error.
    """
    if can_read_all:
        return list(statuses)
    return [st for st in statuses
            if "error" not in st and isinstance(st.get("dag_id"), str) and can_read(st["dag_id"])]


def recipe_status(recipe_path: Path) -> dict[str, Any]:
    """The storage-side status of one recipe.

    Returns:
        ``{"recipe", "dag_id", "path", "schedule", "recipe_hash", "storage_root", "steps": [{"name",
        "kind", "step_id", "status"}], "failing_gates": [{"step_id", "attempt" (URI), "data_docs" (URI of
        the attempt's Data Docs index, or None), "failed": [...]}],
        "failures": groups from tidal.tracking.failures.group_failures, "checkpoint": {"path", "step",
        "age_s", "root_hash"} | {"error"} | None, "sizing": :func:`tidal.core.report.sizing_of` of the committed train
        step (None when it was not sized), "downstream": {task: {metric: value, "n_examples"}} | None (the
        committed eval step's results.json, :func:`tidal.core.report.downstream`; None and ``"downstream_error"`` when
        that file is damaged), "mlflow": {"uri", "link"}}``
        (:func:`mlflow_run_links` adds ``"error"`` when tracking is unreachable), or ``{"path", "error"}`` when
        the recipe does not load.
    """
    from tidal.core.load import load_pipeline
    from tidal.tracking.failures import group_failures, list_failures

    try:
        pipe = load_pipeline(recipe_path)
    except Exception as err:  # noqa: BLE001 - a broken recipe is shown, not hidden
        return {"path": str(recipe_path), "error": f"{type(err).__name__}: {err}"}
    steps = [{"name": s.name, "kind": s.kind, "step_id": s.step_id, "status": pipe.status(s.name)} for s in pipe.graph]
    failing_gates = []
    for step in pipe.graph:
        if step.kind != "gate" or pipe.storage.is_committed(step.step_id):
            continue
        for attempt in pipe.storage.failed_attempts(step.step_id)[-3:]:  # objects: any pod's attempts
            data = pipe.storage.read_object(attempt + "gate_result.json")
            try:
                result = json.loads(data) if data is not None else None
                if result is not None and not isinstance(result, dict):
                    raise ValueError("not a JSON object")
            except ValueError as err:
                result = {"results": [{"column": "gate_result.json", "observed": f"unreadable: {err}"}]}
            if result is not None:
                docs = attempt + "data_docs/index.html"
                failing_gates.append({"step_id": step.step_id, "attempt": pipe.storage.object_uri(attempt),
                                      "data_docs": pipe.storage.object_uri(docs)
                                      if pipe.storage.read_object(docs) is not None else None,
                                      "failed": [r for r in result.get("results") or []
                                                 if isinstance(r, dict) and not r.get("success")]})
    checkpoint = None
    if "train" in pipe.graph.by_name:
        manifest = pipe.storage.step_dir(pipe.graph["train"].step_id) / CHECKPOINT_MANIFEST
        if manifest.is_file():
            try:
                data = json.loads(manifest.read_text())
                checkpoint = {"path": str(manifest.parent / "checkpoints" / str(data.get("step"))),
                              "step": data.get("step"), "age_s": time.time() - manifest.stat().st_mtime,
                              "root_hash": data.get("root_hash")}
            except (OSError, ValueError, AttributeError) as err:  # being rewritten, or damaged
                checkpoint = {"error": f"{manifest}: {type(err).__name__}: {str(err)[:300]}"}
    sizing = None
    if "train" in pipe.graph.by_name and pipe.storage.is_committed(pipe.graph["train"].step_id):
        from tidal.core.report import sizing_of
        from tidal.storage.layout import STEP_JSON

        try:  # what the GKE launch predicted, beside what the trainer measured (tidal/train/preflight.py)
            sizing = sizing_of(json.loads(pipe.storage.read_text(pipe.graph["train"].step_id, STEP_JSON)))
        except (OSError, ValueError, AttributeError):  # a damaged record: the checkpoint and step rows say more
            sizing = None
    downstream, downstream_error = None, None
    if "eval" in pipe.graph.by_name and pipe.storage.is_committed(pipe.graph["eval"].step_id):
        from tidal.core.report import downstream as downstream_of

        try:
            from tidal.files.step_files import StepFiles

            eval_id = pipe.graph["eval"].step_id
            location = pipe.storage.step_uri(eval_id)  # a local root: the step's directory
            # checked against the step's manifest: a results.json edited after its commit is a note, not figures
            downstream = downstream_of(json.loads(StepFiles.open(location).read_verified("results.json")))
        except (OSError, ValueError) as err:  # a damaged file is a note on this recipe, not a broken page
            downstream_error = f"{pipe.graph['eval'].step_id}/results.json: {type(err).__name__}: {str(err)[:300]}"
    from tidal.tracking import experiments_link, safe_uri

    return {
        "recipe": pipe.recipe.name, "dag_id": f"tidal_{pipe.recipe.name}", "path": str(recipe_path),
        "schedule": pipe.recipe.schedule, "recipe_hash": pipe.recipe_hash, "storage_root": pipe.storage.uri,
        "steps": steps, "failing_gates": failing_gates,
        "failures": group_failures(list_failures(pipe.storage, pipe.recipe.name),
                                   pipe.storage.is_committed)[:20],
        "checkpoint": checkpoint, "downstream": downstream, "sizing": sizing,
        **({"downstream_error": downstream_error} if downstream_error else {}),
        "mlflow": {"uri": safe_uri(pipe.tracking_uri), "link": experiments_link(pipe.tracking_uri)},
    }


def mlflow_run_links(status: dict[str, Any], run_keys: list[str]) -> dict[str, str]:
    """run key (``{dag_id}__{run_id}``) -> link of its MLflow parent run, for the runs found.

    The link opens the MLflow UI (``TIDAL_MLFLOW_UI_URL``, or an http(s) tracking URI); with the
    embedded SQLite store there is no UI and the link is the ``runs:/<id>`` URI. Tracking errors
    give no links (the page never fails because MLflow is down): when tracking is unreachable,
    ``status["mlflow"]["error"]`` says so and the page shows it.
    """
    if not run_keys or "mlflow" not in status:
        return {}
    from tidal.tracking import (
        TrackingUnavailable,
        experiment_name,
        parent_runs_with_prefix,
        run_link,
    )

    uri = status["mlflow"]["uri"]
    try:
        runs = parent_runs_with_prefix(uri, experiment_name(status["recipe"]),
                                       status["dag_id"].replace("'", "") + "__")
    except TrackingUnavailable as err:
        status["mlflow"]["error"] = str(err)
        return {}
    except Exception:  # noqa: BLE001 - tracking never takes the page down
        return {}
    wanted = set(run_keys)
    return {r.run_key: run_link(uri, r) for r in runs if r.run_key in wanted}


def runs_progress(status: dict[str, Any], run_keys: list[str]) -> dict[str, dict[str, Any]]:
    """run key -> how far that run got by its own plan in the storage root (its trigger form's
    overrides give other step ids than the recipe as written; tidal/audit/catalog.py), for the
    runs that have a plan. Never raises: a storage error gives no progress, not a broken page."""
    if not run_keys or "path" not in status or "error" in status:
        return {}
    from tidal.audit.catalog import run_progress
    from tidal.core.load import load_pipeline

    try:
        storage = load_pipeline(status["path"]).storage
        found = {key: run_progress(storage, status["recipe"], key) for key in run_keys}
    except Exception:  # noqa: BLE001 - the bucket never takes the page down
        return {}
    return {key: progress for key, progress in found.items() if progress is not None}


def _progress_cell(progress: dict[str, Any] | None) -> str:
    """``12/17 (missing train, report); train.steps=200`` for a run's plan, ``""`` without one."""
    if not progress:
        return ""
    text = f"{progress['committed']}/{progress['planned']}"
    if progress["missing"]:
        text += f" (missing {', '.join(progress['missing'][:4])}{', ...' if len(progress['missing']) > 4 else ''})"
    if progress["overrides"]:
        text += "; " + ", ".join(f"{k}={v}" for k, v in progress["overrides"].items())
    return text


def _when(value: Any) -> str:
    """A run's start or end to the second, in UTC (``2026-12-06 22:32:20 UTC``); ``-`` when unset; a value that is
    not a time is shown as it is."""
    from datetime import UTC, datetime

    if value is None or value == "":
        return "-"
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return value
    if not isinstance(value, datetime):
        return str(value)
    if value.tzinfo is not None:
        value = value.astimezone(UTC)
    return value.strftime("%Y-%m-%d %H:%M:%S UTC")


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def render_page(statuses: list[dict[str, Any]], runs: dict[str, list[dict[str, Any]]], *,
                hidden: bool = False) -> str:
    """The on-call page as one HTML document (no scripts; every value escaped).

    Args:
        statuses: from :func:`recipe_status`, one per recipe.
        runs: dag_id -> latest runs ``[{"run_id", "run_type", "state", "start", "end", "failed_tasks",
            "upstream_failed", "mlflow_link", "progress"}]`` (from the Airflow DB, newest first;
            ``progress`` from :func:`runs_progress`, optional).
        hidden: whether recipes were left out because the user may not read their DAGs
            (:func:`visible_statuses`); with none left, the page says so in one line.

    A recipe whose status cannot be shown (a damaged file behind it) gets a note in its own section;
    the other recipes' sections are whole.
    """
    e = html.escape
    out = ["<!doctype html><html><head><meta charset='utf-8'><title>tidal on-call</title><style>",
           ("body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;margin:.5em 0 1em}"
           "td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px;text-align:left}"
           ".failed,.blocked{background:#fdd}.resolved{color:#777}.success,.skip{background:#dfd}.run,.running,.queued{background:#ffd}"
           "code{font-size:12px}h2{border-top:2px solid #246;padding-top:.5em}"),
           "</style></head><body><h1>tidal on-call</h1>"]
    if not statuses:
        out.append(f"<p class='none'>{e(NONE_READABLE if hidden else NO_RECIPES)}</p>")
    for st in statuses:
        if "error" in st:
            out.append(f"<h2>{e(str(st.get('path')))}</h2><p class='failed'>recipe does not load: "
                       f"{e(str(st['error']))}</p>")
            continue
        section: list[str] = []
        try:
            _render_recipe(section, st, runs)
        except Exception as err:  # noqa: BLE001 - one recipe's damaged status never takes the page down
            section = [(f"<h2>{e(str(st.get('recipe')))} <small>(DAG <code>{e(str(st.get('dag_id')))}</code>)"
                        f"</small></h2><p class='failed'>this recipe's status could not be shown: "
                        f"{e(type(err).__name__)}: {e(str(err)[:300])}</p>")]
        out += section
    out.append("</body></html>")
    return "\n".join(out)


def _render_recipe(out: list[str], st: dict[str, Any], runs: dict[str, list[dict[str, Any]]]) -> None:
    """Append one recipe's section of :func:`render_page` to ``out`` (every value escaped)."""
    from tidal.tracking import safe_uri

    e = html.escape
    dag_id = st["dag_id"]
    dag_link = f"/dags/{quote(dag_id, safe='')}"  # Airflow 3's UI: the DAG's own page, its runs under it
    out.append(f"<h2 id='{e(dag_id)}'>{e(st['recipe'])} <small>(DAG <a href='{e(dag_link)}'><code>{e(dag_id)}"
               f"</code></a>, schedule "
               f"{e(st['schedule'] or 'manual')}, recipe hash "
               f"<code>{e(st['recipe_hash'][:12])}</code>)</small></h2>")
    out.append("<h3>Latest runs</h3><table class='runs'><tr><th>run</th><th>type</th><th>state</th><th>start</th>"
               "<th>end</th><th>steps committed (this run's ids)</th><th>failed tasks</th>"
               "<th>not run: upstream failed</th><th>MLflow</th></tr>")
    for run in runs.get(dag_id, []):
        link = run.get("mlflow_link") or ""
        link = f"<a href='{e(link)}'>run</a>" if link.startswith("http") else f"<code>{e(link)}</code>"
        run_link = f"{dag_link}/runs/{quote(str(run['run_id']), safe='')}"
        out.append(f"<tr class='{e(str(run['state']))}'><td><a href='{e(run_link)}'><code>{e(str(run['run_id']))}"
                   f"</code></a></td><td>{e(str(run['run_type']))}</td><td>{e(str(run['state']))}</td>"
                   f"<td>{e(_when(run['start']))}</td>"
                   f"<td>{e(_when(run['end']))}</td><td>{e(_progress_cell(run.get('progress')))}</td>"
                   f"<td>{e(', '.join(run['failed_tasks']))}</td>"
                   f"<td>{e(', '.join(run.get('upstream_failed') or []))}</td><td>{link}</td></tr>")
    if not runs.get(dag_id):
        out.append("<tr><td colspan='9'>no runs yet</td></tr>")
    out.append("</table><h3>Steps (cache status)</h3><table class='steps'><tr><th>step</th><th>kind</th>"
               "<th>step id</th><th>cache</th></tr>")
    label = {"skip": "committed (cached)", "run": "not committed, ready", "blocked": "not committed, blocked"}
    for step in st["steps"]:
        out.append(f"<tr class='{e(step['status'])}'><td>{e(step['name'])}</td><td>{e(step['kind'])}</td>"
                   f"<td><code>{e(step['step_id'])}</code></td><td>{e(label[step['status']])}</td></tr>")
    out.append("</table><h3>Failing gates</h3>")
    if not st["failing_gates"]:
        out.append("<p>none</p>")
    for gate in st["failing_gates"]:
        docs = f", Data Docs <code>{e(gate['data_docs'])}</code>" if gate.get("data_docs") else ""
        out.append(f"<p class='failed'>gate <code>{e(gate['step_id'])}</code> "
                   f"(evidence <code>{e(gate['attempt'])}</code>{docs})</p><ul>")
        out += [f"<li>{e(str(c.get('column')))} [source={e(str(c.get('source')))}]: expected "
                f"{e(str(c.get('expected')))}, got {e(str(c.get('observed')))}</li>" for c in gate["failed"]]
        out.append("</ul>")
    out.append("<h3>Failure catalog</h3><table class='failures'><tr><th>fingerprint</th><th>count</th>"
               "<th>last seen</th><th>exception</th><th>tasks</th><th>latest message</th><th>MLflow</th></tr>")
    for group in st["failures"]:
        latest = group["latest"]
        link = latest.get("mlflow_link") or ""  # a runs:/ URI is no address a browser opens: shown as text
        link = (f"<a href='{e(link)}'>run</a>" if link.startswith("http")
                else f"<code>{e(link)}</code>" if link else "")
        tasks = ", ".join(f"{k} x{n}" for k, n in group["tasks"].items())
        message = (latest.get("message") or "").splitlines()[:1]
        resolved = " resolved" if group.get("resolved") else ""
        out.append(f"<tr class='failure{resolved}'><td><code>{e(group['fingerprint'])}</code>"
                   f"{' (resolved: step committed since)' if resolved else ''}</td><td>{e(str(group['count']))}</td>"
                   f"<td>{e(str(group['last_seen']))}</td><td>{e(str(group['exception_type']))}</td>"
                   f"<td>{e(tasks)}</td><td>{e(message[0][:200] if message else '')}</td><td>{link}</td></tr>")
    if not st["failures"]:
        out.append("<tr><td colspan='7'>no failures recorded</td></tr>")
    out.append("</table><h3>Latest checkpoint</h3>")
    ckpt = st["checkpoint"]
    if ckpt and "error" in ckpt:
        out.append(f"<p class='checkpoint failed'>checkpoint manifest unreadable: {e(str(ckpt['error']))}</p>")
        ckpt = None
    out.append(f"<p class='checkpoint'>step {e(str(ckpt['step']))} at <code>{e(ckpt['path'])}</code>, age "
               f"{e(_age(ckpt['age_s']))}, root hash <code>{e(str(ckpt['root_hash'])[:12])}</code></p>"
               if ckpt else "<p class='checkpoint'>no checkpoint yet</p>")
    if st.get("sizing"):
        from tidal.core.report import sizing_lines

        out.append("<h3>Sizing</h3>" + "".join(f"<p class='sizing'>{e(' '.join(line.split()))}</p>"
                                                for line in sizing_lines(st["sizing"])))
    if st.get("downstream"):
        out.append("<h3>Downstream evals (final checkpoint)</h3><table class='downstream'>"
                   "<tr><th>task</th><th>metrics</th><th>n</th></tr>")
        for task, values in st["downstream"].items():
            shown = ", ".join(f"{k} {v:.6g}" if isinstance(v, float) else f"{k} {v}"
                              for k, v in values.items() if k != "n_examples")
            out.append(f"<tr><td>{e(str(task))}</td><td>{e(shown)}</td><td>{e(str(values['n_examples']))}</td></tr>")
        out.append("</table>")
    if st.get("downstream_error"):
        out.append(f"<p class='failed downstream'>downstream evals unreadable: {e(st['downstream_error'])}</p>")
    mlflow = st["mlflow"]
    out.append(f"<p>MLflow: <code>{e(safe_uri(mlflow['uri']))}</code>"
               + (f" &middot; <a href='{e(mlflow['link'])}'>experiments</a>" if mlflow["link"] else "") + "</p>")
    if mlflow.get("error"):
        out.append(f"<p class='failed tracking'>tracking unreachable: no MLflow links ({e(mlflow['error'])})</p>")
