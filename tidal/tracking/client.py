"""The one MLflow client of tidal and the rules every MLflow call shares.

:func:`mlflow_client` is the only place an ``MlflowClient`` is built (bounded HTTP retries and
timeouts unless the environment sets them; a SQLite store opened under a file lock). Every call
goes through :func:`retry_call`, whose unreachable hold is shared by the :class:`~tidal.tracking.
tracker.Tracker` and the lookups of :mod:`tidal.tracking.runs`: once a URI failed every retry,
later calls in this process fail fast for ``UNREACHABLE_HOLD_S`` seconds. :func:`safe_uri` is what
may be printed of a URI. ``mlflow`` is imported lazily (DAG parsing stays cheap).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from tidal.settings import current

log = logging.getLogger("tidal.tracking")
T = TypeVar("T")
RUN_KEY_TAG = "tidal.run_key"
# MLflow 3's experiment kind: its UI opens a "genai_development" experiment (and, in 3.17, any
# experiment unless told otherwise) on the GenAI traces page; see tidal/tracking/runs.py UI_QUERY.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"


def tracking_uri_for(storage_root: str | Path) -> str:
    """The MLflow tracking URI for a storage root.

    Returns ``$MLFLOW_TRACKING_URI`` when set, else the embedded SQLite store
    ``sqlite:///{storage_root}/mlflow.db`` (absolute path; artifacts then go to
    ``{storage_root}/mlartifacts``, see :func:`artifact_location_for`).
    """
    env = current().tracking_uri
    if env:
        return env
    return f"sqlite:///{Path(storage_root).resolve()}/mlflow.db"


def is_per_machine(uri: str | None) -> bool:
    """True if tracking URI ``uri`` names a store on this machine's disk: unset, a SQLite file
    (``sqlite:``), ``file:`` or a bare path (MLflow's ``./mlruns`` file store). A server
    (``http(s)://``, ``databricks``) or a database (``postgresql://``, ``mysql://``) is shared."""
    if not uri:
        return True
    if uri == "databricks":  # MLflow's name for a Databricks workspace's server
        return False
    scheme = uri.split(":", 1)[0].lower() if re.match(r"^[A-Za-z][\w+.-]*:", uri) else ""
    return scheme in ("", "file", "sqlite") or len(scheme) == 1  # one letter: a Windows drive path


def _sqlite_path(uri: str) -> Path | None:
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


def artifact_location_for(uri: str) -> str | None:
    """``file://{db dir}/mlartifacts`` for a SQLite URI; None (server default) otherwise."""
    db = _sqlite_path(uri)
    return (db.parent / "mlartifacts").as_uri() if db else None


class TrackingUnavailable(RuntimeError):
    """MLflow did not answer after all retries.

    The Tracker's public methods buffer instead of raising it; the lookups of
    :mod:`tidal.tracking.runs` raise it, with the message ``tracking is unreachable at <uri>:
    <reason>`` (user and password removed from the URI), for their callers to degrade on.
    """


_USERINFO = re.compile(r"([A-Za-z][\w+.-]*://)[^/@\s'\"]*@")


_QUERY = re.compile(r"([A-Za-z][\w+.-]*://[^\s'\"?#]*)[?#][^\s'\"]*")


def run_key_filter(run_key: str) -> str:
    """The MLflow search filter of the parent run tagged ``tidal.run_key = run_key``.

    Raises:
        ValueError: ``run_key`` holds a single quote (it would end the filter's string).
    """
    if "'" in run_key:
        raise ValueError(f"run_key may not contain a single quote: {run_key!r}")
    return f"tags.`{RUN_KEY_TAG}` = '{run_key}'"


def earliest_run(runs: list[Any]) -> Any | None:
    """The parent run that wins when two processes raced to create one: the earliest start,
    then the lowest run id (so every process picks the same)."""
    return min(runs, key=lambda r: (r.info.start_time, r.info.run_id)) if runs else None


def get_or_create_experiment(client: Any, uri: str, name: str) -> str:
    """The id of experiment ``name``, created on first use with its artifacts beside the store
    (:func:`artifact_location_for`; MLflow's default is ``./mlruns`` of the working directory)
    and tagged a classic model-training experiment (``EXPERIMENT_KIND``; an older experiment
    without the tag gets it here). Another process creating it at the same moment is not an
    error: its id is returned."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        if EXPERIMENT_KIND_TAG not in (found.tags or {}):
            client.set_experiment_tag(found.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        return found.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_location_for(uri),
                                        tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
    except Exception:  # another process created it first
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def safe_uri(text: str) -> str:
    """``text`` with the ``user:password@``, query string and fragment of every URI in it removed
    (``http://u:p@h:5000/?token=t`` -> ``http://h:5000/``): what may be printed, logged or put on a
    page (a token may ride in either)."""
    return _QUERY.sub(r"\1", _USERINFO.sub(r"\1", str(text)))


# Circuit breaker: once a tracking URI has failed every retry, later calls in this process
# go straight to the pending buffer for this long (seconds) instead of waiting again.
UNREACHABLE_HOLD_S = 60.0
_unreachable_until: dict[str, float] = {}
# Defaults for MLflow's HTTP client when the environment does not set them: MLflow's own
# defaults (7 retries with exponential backoff, 120 s timeout) make one outage cost minutes
# per call. Env vars set by the user always win.
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


@contextlib.contextmanager
def _store_lock(db: Path | None):
    """A file lock next to a SQLite store (nothing for a server)."""
    if db is None:
        yield
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(db.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def mlflow_client(uri: str):
    """A new ``mlflow.tracking.MlflowClient`` for ``uri``: the one place in tidal that builds one.

    For a server, MLflow's HTTP client gets :data:`HTTP_DEFAULTS` (short, bounded retries and
    timeout) unless the environment sets them. A SQLite store is opened, and one call made,
    under a file lock next to the database: MLflow creates and migrates the store when it first
    opens it, and two processes doing that at once (parallel Airflow tasks on a fresh storage
    root) race in alembic ("table _alembic_tmp_... already exists") and can leave a
    half-migrated store.
    """
    from mlflow.tracking import MlflowClient

    db = _sqlite_path(uri)
    if db is None:
        for key, value in HTTP_DEFAULTS.items():
            os.environ.setdefault(key, value)
    with _store_lock(db):
        client = MlflowClient(tracking_uri=uri)
        if db is not None:
            client.search_experiments(max_results=1)
    return client


def retry_call(uri: str, what: str, fn: Callable[[], T], attempts: int = 1, backoff_s: float = 0.5) -> T:
    """Call ``fn`` (an MLflow call on ``uri``) up to ``attempts`` times with exponential backoff.

    When every try failed, ``uri`` is held as unreachable for :data:`UNREACHABLE_HOLD_S`: calls
    in this process (the Tracker's and :mod:`tidal.tracking.runs`'s alike) then fail at once.

    Raises:
        TrackingUnavailable: every try failed (chained to the last error), or ``uri`` is held.
    """
    if time.monotonic() < _unreachable_until.get(uri, 0.0):
        raise TrackingUnavailable(f"mlflow {what} skipped: {safe_uri(uri)} was unreachable moments ago")
    delay = backoff_s
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except Exception as err:  # noqa: BLE001 - MLflow, SQLAlchemy, requests: all mean "not now"
            last = err
            log.debug("mlflow %s failed (try %d/%d): %s", what, attempt, attempts, safe_uri(str(err)))
            if attempt < attempts:
                time.sleep(delay)
                delay *= 2
    _unreachable_until[uri] = time.monotonic() + UNREACHABLE_HOLD_S
    raise TrackingUnavailable(safe_uri(f"mlflow {what} failed {attempts} times: {last}")) from last
