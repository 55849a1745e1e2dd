"""Airflow plugin: the tidal on-call page, a FastAPI app mounted in the API server at ``/tidal-oncall``.

It shows, per recipe: the latest DAG runs and their states, each step's cache status and id,
failing gates with their failed expectations, the failure catalog, the latest checkpoint and
its age, and links into MLflow (operators/oncall.py builds the page). A nav entry
("external view") links it from the Airflow UI.

Access: plugin apps are not protected by Airflow on their own, so every route resolves the
caller's Airflow JWT (``Authorization: Bearer`` or the UI's ``_token`` cookie) through the
configured auth manager and answers 401/403 without one. A logged-in user sees only the
recipes whose DAG (``tidal_<recipe name>``) the auth manager lets them read (GET): a user
allowed to read all DAGs (``is_authorized_dag`` with no DAG named) sees every recipe; anyone
else sees those whose DAG id is in ``get_authorized_dag_ids`` (the DAGs in the metadata DB, as
Airflow's own DAG list filters; a recipe whose DAG is not parsed yet is not shown to them), and
no recipe that does not load (its entry shows a file path and an error). The check comes before
any per-recipe work: each recipe file's DAG id is read from its top-level ``name``, and a
recipe the user may not read is never loaded nor its runs queried. With none readable, the page
says so in one line (operators/oncall.py ``visible_statuses`` holds the rule). Recipes come from
``$TIDAL_RECIPES_DIR`` (default: ``recipes/`` next to this directory). Module import stays
light (FastAPI only), since every Airflow component loads plugins.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, ClassVar

from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse

URL_PREFIX = "/tidal-oncall"
RUNS_SHOWN = 5


async def airflow_user(request: Request) -> Any:
    """The Airflow user of the request's JWT (bearer header, else the UI's ``_token`` cookie)."""
    from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN
    from airflow.api_fastapi.core_api.security import resolve_user_from_token

    header = request.headers.get("authorization", "")
    token = header[7:] if header.lower().startswith("bearer ") else request.cookies.get(COOKIE_NAME_JWT_TOKEN)
    if not token:
        raise HTTPException(status_code=401, detail="Not authenticated: log in to Airflow first")
    return await resolve_user_from_token(token)


def _recipes_dir() -> Path:
    return Path(os.environ.get("TIDAL_RECIPES_DIR", Path(__file__).resolve().parent.parent / "recipes"))


def _latest_runs(dag_ids: list[str], mlflow_links: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
    """dag_id -> its latest runs (newest first) with failed task ids, from the Airflow metadata DB."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    out: dict[str, list[dict[str, Any]]] = {}
    with create_session() as session:
        for dag_id in dag_ids:
            runs = session.scalars(select(DagRun).where(DagRun.dag_id == dag_id)
                                   .order_by(DagRun.run_after.desc()).limit(RUNS_SHOWN)).all()
            rows = []
            for run in runs:
                states = session.execute(select(TaskInstance.task_id, TaskInstance.state).where(
                    TaskInstance.dag_id == dag_id, TaskInstance.run_id == run.run_id,
                    TaskInstance.state.in_(["failed", "upstream_failed"]))).all()
                failed = [task for task, state in states if getattr(state, "value", state) == "failed"]
                rows.append({"run_id": run.run_id, "run_type": str(run.run_type), "state": str(run.state),
                             "start": run.start_date, "end": run.end_date, "failed_tasks": sorted(failed),
                             "upstream_failed": sorted(task for task, _ in states if task not in failed),
                             "mlflow_link": mlflow_links.get(f"{dag_id}__{run.run_id}")})
            out[dag_id] = rows
    return out


def _mlflow_links(statuses: list[dict[str, Any]]) -> dict[str, str]:
    """run key -> MLflow link of the parent runs named in the failure catalog."""
    return {f"{g['latest'].get('dag_id')}__{g['latest'].get('run_id')}": g["latest"]["mlflow_link"]
            for st in statuses for g in st.get("failures", []) if g["latest"].get("mlflow_link")}


def dag_access(user: Any) -> tuple[bool, Callable[[str], bool]]:
    """``(can_read_all, can_read)`` of ``user`` by the configured auth manager: whether they may read every
    DAG, and whether they may read a given DAG id (GET). Reads the metadata DB: call it off the event loop."""
    from airflow.api_fastapi.app import get_auth_manager

    manager = get_auth_manager()
    if manager.is_authorized_dag(method="GET", user=user):
        return True, lambda _dag_id: True
    readable = manager.get_authorized_dag_ids(user=user, method="GET")  # one query, team-aware
    return False, readable.__contains__


def collect(user: Any) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]], bool]:
    """Everything the page shows ``user``: per-recipe storage status and the latest runs from Airflow, of the
    recipes whose DAG they may read, and whether any recipe was left out for that."""
    from operators.oncall import (
        mlflow_run_links,
        recipe_dag_id,
        recipe_files,
        recipe_status,
        runs_progress,
        visible_statuses,
    )

    can_read_all, can_read = dag_access(user)
    paths = recipe_files(_recipes_dir())
    allowed = paths if can_read_all else [p for p in paths if (d := recipe_dag_id(p)) is not None and can_read(d)]
    # the rule again on what loaded (a loaded name is the YAML's, so nothing more drops but a broken recipe)
    statuses = visible_statuses([recipe_status(path) for path in allowed], can_read, can_read_all)
    hidden = len(statuses) < len(paths)
    runs = _latest_runs([st["dag_id"] for st in statuses if "dag_id" in st], _mlflow_links(statuses))
    for st in statuses:
        keys = [f"{st.get('dag_id')}__{run['run_id']}" for run in runs.get(st.get("dag_id"), [])]
        links = mlflow_run_links(st, keys)
        progress = runs_progress(st, keys)  # each run's own step ids (its overrides), from its plan
        for run, key in zip(runs.get(st.get("dag_id"), []), keys, strict=True):
            run["mlflow_link"] = links.get(key, run["mlflow_link"])
            run["progress"] = progress.get(key)
    return statuses, runs, hidden


# No /docs, /redoc or /openapi.json: FastAPI serves them without the login the pages need.
app = FastAPI(title="tidal on-call", description=__doc__, docs_url=None, redoc_url=None, openapi_url=None)


@app.get("/", response_class=HTMLResponse)
async def oncall_page(user: Annotated[Any, Depends(airflow_user)]) -> HTMLResponse:
    """The on-call page (HTML)."""
    from operators.oncall import render_page

    statuses, runs, hidden = await asyncio.to_thread(collect, user)
    return HTMLResponse(render_page(statuses, runs, hidden=hidden))


@app.get("/status")
async def oncall_status(user: Annotated[Any, Depends(airflow_user)]) -> dict[str, Any]:
    """The same content as JSON, for scripts and tests (``note`` when no recipe is shown)."""
    from operators.oncall import NO_RECIPES, NONE_READABLE

    statuses, runs, hidden = await asyncio.to_thread(collect, user)
    return {"recipes": statuses, "runs": runs,
            **({} if statuses else {"note": NONE_READABLE if hidden else NO_RECIPES})}


class TidalOncallPlugin(AirflowPlugin):
    """Mounts the on-call app and links it from the Airflow UI's navigation."""

    name = "tidal_oncall"
    fastapi_apps: ClassVar[list[dict[str, Any]]] = [{"app": app, "url_prefix": URL_PREFIX, "name": "tidal on-call"}]
    external_views: ClassVar[list[dict[str, Any]]] = [{"name": "tidal on-call", "href": f"{URL_PREFIX}/",
                                                        "destination": "nav", "url_route": "tidal-oncall",
                                                        "category": "browse"}]
