"""Finding, linking and closing MLflow runs: what every caller outside the Tracker needs.

Invariant: outside :mod:`tidal.tracking` nothing builds an MLflow client, spells an experiment
name or writes a run-key filter; the report, the baseline, the lineage, the on-call page, the
failure callback and the GKE launcher call these functions. So there is one rule for where a
recipe's runs live (:func:`experiment_name`), one for which parent run a key names (the one
:class:`tidal.tracking.Tracker` keeps: earliest start, then lowest id) and one answer to
"MLflow is down".

That answer: every call is bounded (the client of :func:`tidal.tracking.client.mlflow_client`,
``HTTP_DEFAULTS``: 2 retries and 10 s per request unless the environment says otherwise) and
shares the Tracker's unreachable hold (:func:`tidal.tracking.client.retry_call`: after one
failed round, the URI fails at once for ``UNREACHABLE_HOLD_S`` in this process). A call that
gets no answer raises :class:`TrackingUnavailable` with the message ``tracking is unreachable
at <uri without user:password>: <reason>``; callers degrade on it (print what the storage
root knows, leave MLflow fields empty) and never crash. A missing answer (no such experiment
or run) is None or an empty list, not an error.

``mlflow`` is imported lazily (by the client), so importing this module stays cheap.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tidal.settings import current
from tidal.tracking.client import (
    RUN_KEY_TAG,
    UNREACHABLE_HOLD_S,
    TrackingUnavailable,
    earliest_run,
    mlflow_client,
    retry_call,
    run_key_filter,
    safe_uri,
)

T = TypeVar("T")
EXPERIMENT_PREFIX = "tidal-"
UI_URL_ENV = "TIDAL_MLFLOW_UI_URL"
# MLflow 3.17's UI takes an experiment's kind from its "workflow type" (the sidebar's GenAI /
# Model training switch, kept in the browser's local storage ``mlflow.workflowType``, default
# ``genai``), not from the ``mlflow.experimentKind`` tag (the bundle's reader of the tag sits
# behind a flag that is always on): a link carrying this query opens the classic runs table.
UI_QUERY = "?workflowType=machine_learning"
_ERRNO = re.compile(r"\[Errno -?\d+\] [^'\")\]]+")
_clients: dict[str, Any] = {}


@dataclass(frozen=True)
class TrackedRun:
    """What callers read of an MLflow run (no MLflow entity leaves this package).

    Attributes:
        run_id, experiment_id: MLflow's ids.
        name: the run name (a parent run: its run key; a step run: the step name).
        status: ``RUNNING``, ``FINISHED``, ``FAILED`` or ``KILLED``.
        start_time: ms since the epoch.
        tags: every tag (``tidal.run_key``, ``tidal.step_id.<name>``, ``tidal.status`` ...).
    """

    run_id: str
    experiment_id: str
    name: str
    status: str
    start_time: int
    tags: dict[str, str] = field(default_factory=dict)

    @property
    def run_key(self) -> str | None:
        """The parent run's ``tidal.run_key`` (None for a step run)."""
        return self.tags.get(RUN_KEY_TAG)


def experiment_name(name: str) -> str:
    """The MLflow experiment of a recipe or scaling suite: ``tidal-{name}``."""
    return f"{EXPERIMENT_PREFIX}{name}"


def store_exists(uri: str) -> bool:
    """False only for a SQLite URI whose database file does not exist yet (nothing has run with
    tracking; opening it would create it); True for a server."""
    return not uri.startswith("sqlite:///") or Path(uri.removeprefix("sqlite:///")).is_file()


def unreachable_message(uri: str, err: BaseException) -> str:
    """``tracking is unreachable at <uri>: <reason>``, without user or password anywhere."""
    cause = err.__cause__ if isinstance(err, TrackingUnavailable) else err
    if cause is None:  # the hold: this process found the URI down moments ago
        reason = f"it did not answer moments ago (not tried again for {UNREACHABLE_HOLD_S:.0f} s)"
    else:
        text = str(cause).strip()
        errno = _ERRNO.search(text)
        reason = errno.group(0).strip() if errno else (
            f"{type(cause).__name__}: {text.splitlines()[0][:300]}" if text else type(cause).__name__)
    return safe_uri(f"tracking is unreachable at {uri}: {reason}")


def _call(uri: str, what: str, fn: Callable[[Any], T], empty: T) -> T:
    """``fn(client)`` under :func:`retry_call` (3 tries for SQLite, which may be locked; 1 for
    a server, whose HTTP layer retries); ``empty`` for a SQLite store not created yet (a lookup
    never creates one).

    Raises:
        TrackingUnavailable: with :func:`unreachable_message`.
    """
    if not store_exists(uri):
        return empty

    def call() -> T:
        if uri not in _clients:
            _clients[uri] = mlflow_client(uri)
        return fn(_clients[uri])

    try:
        return retry_call(uri, what, call, attempts=3 if uri.startswith("sqlite:///") else 1)
    except TrackingUnavailable as err:
        raise TrackingUnavailable(unreachable_message(uri, err)) from err


def _tracked(run: Any) -> TrackedRun:
    return TrackedRun(run.info.run_id, run.info.experiment_id, run.info.run_name or
                      run.data.tags.get("mlflow.runName", ""), run.info.status, run.info.start_time or 0,
                      dict(run.data.tags))


def _quoted(value: str, what: str) -> str:
    if "'" in value:
        raise ValueError(f"{what} may not contain a single quote: {value!r}")
    return f"'{value}'"




def _experiment_id(client: Any, experiment: str) -> str | None:
    found = client.get_experiment_by_name(experiment)
    return None if found is None else found.experiment_id


def _earliest(runs: list[Any]) -> TrackedRun | None:
    """The parent the Tracker keeps when two processes raced to create one (:func:`earliest_run`)."""
    found = earliest_run(runs)
    return None if found is None else _tracked(found)


def parent_run(uri: str, experiment: str, run_key: str | None = None, *,
               recipe_hash: str | None = None) -> TrackedRun | None:
    """The parent run of ``run_key`` in ``experiment`` (:func:`experiment_name`), or None.

    Args:
        run_key: the DAG run's key (e.g. ``tidal_tiny__manual__2026-...``); None: the newest
            parent run (any key).
        recipe_hash: only runs tagged ``tidal.recipe_hash`` with it (this exact recipe).

    Raises:
        TrackingUnavailable: MLflow did not answer.
        ValueError: ``run_key`` holds a single quote.
    """
    where = [run_key_filter(run_key) if run_key is not None else f"tags.`{RUN_KEY_TAG}` != ''"]
    if recipe_hash is not None:
        where.insert(0, f"tags.`tidal.recipe_hash` = {_quoted(recipe_hash, 'recipe_hash')}")

    def search(client: Any) -> TrackedRun | None:
        exp = _experiment_id(client, experiment)
        if exp is None:
            return None
        if run_key is None:
            runs = client.search_runs([exp], " and ".join(where), order_by=["attributes.start_time DESC"],
                                      max_results=1)
            return _tracked(runs[0]) if runs else None
        return _earliest(client.search_runs([exp], " and ".join(where), order_by=["attributes.start_time ASC"],
                                            max_results=10))

    return _call(uri, "find parent run", search, None)


def parent_runs_with_prefix(uri: str, experiment: str, prefix: str, max_results: int = 200) -> list[TrackedRun]:
    """Parent runs whose run key starts with ``prefix`` (e.g. ``tidal_tiny__``: every run of a
    DAG), newest first. MLflow's search has no IN for tags, hence one LIKE (in which ``_`` matches
    any character: filter the keys exactly afterwards).

    Raises:
        TrackingUnavailable: MLflow did not answer.
        ValueError: ``prefix`` holds a single quote.
    """
    where = f"tags.`{RUN_KEY_TAG}` LIKE {_quoted(prefix + '%', 'prefix')}"

    def search(client: Any) -> list[TrackedRun]:
        exp = _experiment_id(client, experiment)
        if exp is None:
            return []
        return [_tracked(r) for r in client.search_runs([exp], where, order_by=["attributes.start_time DESC"],
                                                        max_results=max_results)]

    return _call(uri, "find parent runs", search, [])


def parent_run_in_any_experiment(uri: str, run_key: str) -> TrackedRun | None:
    """The parent run of ``run_key`` in whichever experiment holds it (``tidal lineage RUN_KEY``
    does not know the recipe), or None.

    Raises:
        TrackingUnavailable: MLflow did not answer.
        ValueError: ``run_key`` holds a single quote.
    """
    where = run_key_filter(run_key)

    def search(client: Any) -> TrackedRun | None:
        experiments = [e.experiment_id for e in client.search_experiments()]
        if not experiments:
            return None
        return _earliest(client.search_runs(experiments, where, order_by=["attributes.start_time ASC"],
                                            max_results=10))

    return _call(uri, "find parent run in any experiment", search, None)


def child_runs(uri: str, parent: TrackedRun, max_results: int = 1000) -> list[TrackedRun]:
    """The nested step runs of ``parent`` (tag ``mlflow.parentRunId``).

    Raises:
        TrackingUnavailable: MLflow did not answer.
    """
    where = f"tags.mlflow.parentRunId = {_quoted(parent.run_id, 'run_id')}"
    return _call(uri, "find step runs", lambda client: [
        _tracked(r) for r in client.search_runs([parent.experiment_id], where, max_results=max_results)], [])


def close_run(uri: str, run_id: str, status: str = "FAILED", tags: dict[str, str] | None = None,
              only_running: bool = True) -> bool:
    """Set run ``run_id``'s terminal ``status`` (an MLflow RunStatus name), after its ``tags``.

    Returns:
        True when closed; False when ``only_running`` and the run is no longer RUNNING.

    Raises:
        TrackingUnavailable: MLflow did not answer.
    """
    def close(client: Any) -> bool:
        if only_running and client.get_run(run_id).info.status != "RUNNING":
            return False
        for key, value in (tags or {}).items():
            client.set_tag(run_id, key, value)
        client.set_terminated(run_id, status)
        return True

    return _call(uri, "close run", close, False)


def ui_url(uri: str) -> str | None:
    """The MLflow UI's browser URL: ``$TIDAL_MLFLOW_UI_URL``, else an http(s) tracking URI
    (without user and password), else None (a SQLite or database store has no UI)."""
    ui = current().mlflow_ui_url or (uri if uri.startswith(("http://", "https://")) else None)
    return safe_uri(ui).rstrip("/") if ui else None


def experiments_link(uri: str) -> str | None:
    """The UI page listing experiments (model-training view, ``UI_QUERY``), or None without a UI
    (:func:`ui_url`)."""
    ui = ui_url(uri)
    return f"{ui}/#/experiments{UI_QUERY}" if ui else None


def run_link(uri: str, run: TrackedRun) -> str:
    """Where a person opens ``run``: its UI page in the model-training view (``UI_QUERY``,
    :func:`ui_url`), else the ``runs:/<id>`` URI."""
    ui = ui_url(uri)
    return (f"{ui}/#/experiments/{run.experiment_id}/runs/{run.run_id}{UI_QUERY}" if ui
            else f"runs:/{run.run_id}")
