"""MLflow tracking: one parent run per DAG run, one nested child run per step.

Airflow runs every task in its own process, so nothing is held in memory between steps:
the parent run is found again by its tag ``tidal.run_key`` (e.g. the Airflow run id) and
created on first use. Each step becomes a child run (tag ``mlflow.parentRunId``) carrying
``tidal.step_id``, ``tidal.kind``, ``tidal.status`` and any extra tags (tokenizer hash,
checkpoint root hash ...); the parent gets ``tidal.step_id.<step name> = <step id>``.

Tracking never takes a job down (docs/architecture.md §5). Every MLflow call is retried with
exponential backoff; when the retries are spent the call's payload is written as one JSON
object ``{time_ns}-{op}-{rand}.json`` into the pending buffer, a warning is logged and the
method returns normally. :meth:`Tracker.replay_pending` sends those payloads later (the report
task and ``tidal report`` call it first). Where the buffer is, first match wins:

1. ``pending_dir`` given: that local directory;
2. a SQLite tracking URI: ``{db dir}/pending`` (the store is per machine, so is its buffer);
3. ``$TIDAL_TRACKING_PENDING_DIR``: that directory (an operator's explicit choice);
4. a storage root given (``store``): objects ``{root}/.tracking/pending/`` (docs/architecture.md §0: every
   pod of a deployment sees them, and a pod that dies loses nothing);
5. else ``./mlflow-pending`` in the working directory.
When the parent run itself could not be reached, :meth:`Tracker.parent_run` returns the
placeholder ``"pending:<run_key>"``; :meth:`Tracker.log_step` and :meth:`Tracker.finish`
accept it and resolve it once MLflow answers again.

MLflow's limits on keys, values and batches are applied (:mod:`tidal.tracking.limits`).

``mlflow`` is imported lazily so that importing this module stays cheap (DAG parsing).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from tidal.settings import current
from tidal.tracking.client import (  # noqa: F401 - re-exported: the Tracker's public neighbours
    HTTP_DEFAULTS,
    RUN_KEY_TAG,
    UNREACHABLE_HOLD_S,
    TrackingUnavailable,
    _sqlite_path,
    _store_lock,
    artifact_location_for,
    earliest_run,
    get_or_create_experiment,
    is_per_machine,
    mlflow_client,
    retry_call,
    run_key_filter,
    safe_uri,
    tracking_uri_for,
)
from tidal.tracking.limits import (
    MAX_METRICS_PER_BATCH,
    MAX_PARAMS_TAGS_PER_BATCH,
    MAX_TAG_VALUE,
    _chunks,
    _is_number,
    _key,
    _text,
    flatten_params,
    summary_metrics,
)
from tidal.tracking.mlflow_lineage import Lineage, LineageRefused, log_datasets, log_models
from tidal.tracking.pending import PendingDir, PendingStore

log = logging.getLogger("tidal.tracking")

T = TypeVar("T")
STEP_TAG_PREFIX = "tidal.step_id."
PENDING_PREFIX = "pending:"
PENDING_OBJECTS = ".tracking/pending/"  # under the storage root (module docstring, rule 4)
_FINISH_STATUS = {"success": "FINISHED", "finished": "FINISHED", "failed": "FAILED", "killed": "KILLED"}


class Tracker:
    """Logs DAG runs and steps to one MLflow experiment; never raises on MLflow failures.

    Args:
        uri: tracking URI (see :func:`tracking_uri_for`).
        experiment: experiment name; created on first use, with artifact location
            ``{db dir}/mlartifacts`` for a SQLite URI.
        pending_dir: a local directory for undeliverable payloads; default: see the module
            docstring (``{db dir}/pending`` for SQLite, ``$TIDAL_TRACKING_PENDING_DIR``, the
            storage root's ``.tracking/pending/``, else ``./mlflow-pending``).
        attempts: tries per MLflow call (>= 1). Default 3 for SQLite (rides out "database is
            locked" when parallel tasks write), 1 otherwise, because MLflow's HTTP layer
            already retries (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, default 7, exponential
            backoff; ``MLFLOW_HTTP_REQUEST_TIMEOUT`` per request, default 120 s). Lower those
            env vars to make an outage cost less wall time per call.
        backoff_s: first sleep between tries, doubled after each failure (seconds).
        store: the storage root (any :class:`PendingStore`); with a non-SQLite URI and no
            ``pending_dir`` or ``$TIDAL_TRACKING_PENDING_DIR``, payloads are objects under it.

    Attributes:
        pending_dir: the local buffer directory, or None when the buffer is the root's objects.
        pending_where: the buffer's location as text (for messages).
    """

    def __init__(self, uri: str, experiment: str, pending_dir: str | Path | None = None,
                 attempts: int | None = None, backoff_s: float = 0.5, store: PendingStore | None = None):
        self.uri = uri
        self.experiment = experiment
        db = _sqlite_path(uri)
        if pending_dir is None:
            pending_dir = (db.parent / "pending") if db else current().tracking_pending_dir
            if pending_dir is None and store is None:
                pending_dir = "mlflow-pending"
        self.pending_dir = None if pending_dir is None else Path(pending_dir)
        if self.pending_dir is not None:
            self._pending, self._pending_prefix = PendingDir(self.pending_dir), ""
            self.pending_where = str(self.pending_dir)
        else:
            self._pending, self._pending_prefix = store, PENDING_OBJECTS
            self.pending_where = f"{getattr(store, 'uri', 'the storage root')}/{PENDING_OBJECTS}"
        self.attempts = max(1, attempts if attempts is not None else (3 if db else 1))
        if not db:
            for key, value in HTTP_DEFAULTS.items():
                os.environ.setdefault(key, value)
        self.backoff_s = backoff_s
        self._client_obj = None
        self._experiment_id: str | None = None

    # -- plumbing -----------------------------------------------------------------------

    def _client(self):
        if self._client_obj is None:
            self._client_obj = mlflow_client(self.uri)
        return self._client_obj

    def _retry(self, what: str, fn: Callable[[], T]) -> T:
        """:func:`retry_call` with this tracker's attempts and backoff.

        Raises:
            TrackingUnavailable: every try failed; chained to the last error.
        """
        return retry_call(self.uri, what, fn, self.attempts, self.backoff_s)

    def _experiment(self) -> str:
        if self._experiment_id is None:
            self._experiment_id = self._retry(
                "get/create experiment", lambda: get_or_create_experiment(self._client(), self.uri, self.experiment))
        return self._experiment_id

    def _buffer(self, op: str, args: dict[str, Any], err: Exception) -> str | None:
        """Write an undelivered call as ``{time_ns}-{op}-{rand}.json`` into the pending buffer; never raises.

        Returns:
            Where it went (a path or an object URI), or None when the buffer was not writable.
        """
        name = f"{self._pending_prefix}{time.time_ns()}-{op}-{uuid.uuid4().hex[:8]}.json"
        payload = {"op": op, "uri": safe_uri(self.uri), "experiment": self.experiment, "args": args,
                   "error": safe_uri(str(err))}
        data = (json.dumps(payload, indent=1, sort_keys=True, default=str) + "\n").encode()
        try:
            where = self._pending.write_object(name, data)
        except Exception as write_err:  # noqa: BLE001 - disk or bucket: tracking never takes a job down
            log.warning("tracking: MLflow unreachable (%s) and pending buffer %s not writable (%s); %s dropped",
                        err, self.pending_where, write_err, op)
            return None
        log.warning("tracking: MLflow unreachable (%s); %s buffered in %s", err, op, where)
        return where

    def _find_parent(self, run_key: str) -> str | None:
        where = run_key_filter(run_key)
        exp = self._experiment()
        runs = self._retry("search parent run", lambda: self._client().search_runs(
            [exp], filter_string=where, order_by=["attributes.start_time ASC"], max_results=10))
        found = earliest_run(runs)  # two processes racing may both create a parent
        return None if found is None else found.info.run_id

    def _resolve(self, parent_run_id: str) -> str:
        """A real run id for ``parent_run_id``, looking up a ``pending:<run_key>`` placeholder.

        Raises:
            TrackingUnavailable: MLflow unreachable, or the placeholder's parent does not exist yet.
        """
        if not parent_run_id.startswith(PENDING_PREFIX):
            return parent_run_id
        found = self._find_parent(parent_run_id[len(PENDING_PREFIX):])
        if found is None:
            raise TrackingUnavailable(f"parent run {parent_run_id!r} not created yet")
        return found

    # -- public API ---------------------------------------------------------------------

    def parent_run(self, run_key: str, params: dict[str, Any], tags: dict[str, str]) -> str:
        """Run id of the parent run tagged ``tidal.run_key=run_key``; created if none exists.

        Args:
            run_key: the DAG run's identity (e.g. Airflow ``run_id``); no single quotes.
            params: recipe parameters, flattened with :func:`flatten_params` on creation.
            tags: extra tags set on creation (e.g. ``tidal.recipe_hash``).

        Returns:
            The run id, or ``"pending:<run_key>"`` when MLflow is unreachable (payload buffered).
            Calling it again from another process returns the same run id.

        Raises:
            ValueError: ``run_key`` contains a single quote (a caller bug, not an MLflow outage).
        """
        try:
            return self._parent_run(run_key, params, tags)
        except TrackingUnavailable as err:
            self._buffer("parent_run", {"run_key": run_key, "params": params, "tags": tags}, err)
            return PENDING_PREFIX + run_key

    def _parent_run(self, run_key: str, params: dict[str, Any], tags: dict[str, str]) -> str:
        from mlflow.entities import Param

        found = self._find_parent(run_key)
        if found is not None:
            return found
        exp = self._experiment()
        run_tags = {_key(k): _text(v, MAX_TAG_VALUE) for k, v in tags.items()} | {RUN_KEY_TAG: run_key}
        run = self._retry("create parent run", lambda: self._client().create_run(
            exp, tags=run_tags, run_name=run_key))
        run_id = run.info.run_id
        flat = [Param(k, v) for k, v in sorted(flatten_params(params).items())]
        for chunk in _chunks(flat, MAX_PARAMS_TAGS_PER_BATCH):
            self._retry("log parent params", lambda c=chunk: self._client().log_batch(run_id, params=c))
        winner = self._find_parent(run_key)
        if winner is not None and winner != run_id:  # lost a creation race: keep one parent
            self._retry("delete duplicate parent", lambda: self._client().delete_run(run_id))
            return winner
        return run_id

    def log_step(self, parent_run_id: str, step_name: str, step_id: str, kind: str, status: str,
                 summary: dict[str, Any] | None = None, history: list[dict[str, Any]] | None = None,
                 artifacts: Iterable[str | Path] = (), tags: dict[str, str] | None = None,
                 run_id: str | None = None, lineage: Lineage | None = None) -> str | None:
        """Record one step as a nested child run of ``parent_run_id``.

        Args:
            parent_run_id: from :meth:`parent_run` (a ``pending:`` placeholder is accepted).
            step_name, step_id, kind: the step's name, content address and kind.
            status: ``"run"`` (computed now), ``"skip"`` (already committed) or ``"failed"``
                (the nested run is then marked FAILED; ``summary["error"]`` says why).
            summary: flat dict; numbers become metrics at the run's last step, except those that
                already have a curve (:func:`tidal.tracking.limits.summary_metrics`); the rest tags.
            history: rows with an int ``"step"`` key (e.g. ``{"step": 10, "loss": 3.2,
                "tokens_per_second": 1e4}``); every other numeric key is a metric at that step.
            artifacts: files or directories to upload (a directory lands under its own name).
            tags: extra tags, e.g. ``tidal.tokenizer_hash``, ``tidal.checkpoint_root_hash``.
            run_id: the child run opened by :meth:`open_step_run` (a training step's live
                metrics went there); None creates the child run now.
            lineage: the step's MLflow 3 lineage objects (:mod:`tidal.tracking.mlflow_lineage`): its input
                steps as datasets (metadata only), a train step's checkpoints as logged models, the
                final one registered. Buffered and replayed with the rest of the call.

        Returns:
            The child run id, or None when MLflow was unreachable (payload buffered).
        """
        summary, history, tags = dict(summary or {}), list(history or []), dict(tags or {})
        artifacts = [str(a) for a in artifacts]
        lineage_json = lineage.to_json() if lineage else None
        try:
            return self._log_step(parent_run_id, step_name, step_id, kind, status, summary, history, artifacts,
                                  tags, run_id, lineage_json)
        except TrackingUnavailable as err:
            self._buffer("log_step", {
                "parent_run_id": parent_run_id, "step_name": step_name, "step_id": step_id, "kind": kind,
                "status": status, "summary": summary, "history": history, "artifacts": artifacts, "tags": tags,
                "run_id": run_id, "lineage": lineage_json,
            }, err)
            return None

    def open_step_run(self, parent_run_id: str, step_name: str, step_id: str, kind: str) -> str | None:
        """Create a step's nested run now (status RUNNING), for metrics logged while it computes.

        The training subprocess logs into it live (``TIDAL_MLFLOW_RUN_ID``,
        tidal/train/metrics.py); :meth:`log_step` with ``run_id=`` completes and closes it.
        A RUNNING run of the same step under the same parent (a cleared, rerun task) is reused.
        Returns the run id, or None when MLflow is unreachable (the step is then recorded by :meth:`log_step`).
        """
        try:
            parent = self._resolve(parent_run_id)
            exp = self._experiment()
            running = self._retry("find open step run", lambda: self._client().search_runs(
                [exp], filter_string=f"tags.`mlflow.parentRunId` = '{parent}' and tags.`tidal.step_id` = "
                f"'{step_id}' and attributes.status = 'RUNNING'", max_results=1,
                order_by=["attributes.start_time DESC"]))
            if running:
                return running[0].info.run_id
            tags = {"mlflow.parentRunId": parent, "tidal.step_id": step_id, "tidal.kind": kind,
                    "tidal.status": "running"}
            return self._retry("open step run", lambda: self._client().create_run(
                exp, tags=tags, run_name=step_name)).info.run_id
        except TrackingUnavailable as err:
            log.warning("tracking: no live run for step %s (%s); it is recorded when it ends", step_name, err)
            return None

    def _held_steps(self, run_id: str, history: list[dict[str, Any]], have: dict[str, float]) -> dict[str, set[int]]:
        """``{metric key: steps}`` live run ``run_id`` holds (``have``: its latest metrics), for
        ``history``'s keys (a call per key)."""
        keys = {_key(k) for row in history for k in row if k != "step"} & set(have)
        client = self._client()
        return {k: {m.step for m in self._retry(f"read {k}", lambda k=k: client.get_metric_history(run_id, k))}
                for k in sorted(keys)}

    def _log_step(self, parent_run_id, step_name, step_id, kind, status, summary, history, artifacts, tags,
                  run_id=None, lineage=None):
        from mlflow.entities import Metric, RunTag

        parent = self._resolve(parent_run_id)
        exp = self._experiment()
        run_tags = {_key(k): _text(v, MAX_TAG_VALUE) for k, v in tags.items()}
        run_tags |= {"mlflow.parentRunId": parent, "tidal.step_id": step_id, "tidal.kind": kind,
                     "tidal.status": status}
        now_ms = int(time.time() * 1000)
        extra_tags = [RunTag(_key(k), _text(v, MAX_TAG_VALUE)) for k, v in sorted(summary.items())
                      if not _is_number(v)]
        live = (self._retry("read live run", lambda: self._client().get_run(run_id)).data.metrics
                if run_id is not None else {})
        finals, last = summary_metrics(summary, history, curves=live)  # at the last step, no curve twice
        metrics = [Metric(k, v, now_ms, last) for k, v in finals.items()]
        held = self._held_steps(run_id, history, live) if run_id is not None and history else {}
        for row in history:
            step = int(row["step"])
            metrics += [Metric(_key(k), float(v), now_ms, step) for k, v in sorted(row.items())
                        if k != "step" and _is_number(v) and step not in held.get(_key(k), ())]
        created = run_id is None
        if created:
            run = self._retry("create step run", lambda: self._client().create_run(
                exp, tags=run_tags, run_name=step_name))
            run_id = run.info.run_id
        else:
            extra_tags += [RunTag(k, v) for k, v in sorted(run_tags.items())]
        try:
            for chunk in _chunks(metrics, MAX_METRICS_PER_BATCH):
                self._retry("log step metrics", lambda c=chunk: self._client().log_batch(run_id, metrics=c))
            for chunk in _chunks(extra_tags, MAX_PARAMS_TAGS_PER_BATCH):
                self._retry("log step tags", lambda c=chunk: self._client().log_batch(run_id, tags=c))
            for item in artifacts:
                path = Path(item)
                if path.is_dir():
                    self._retry(f"upload {path}", lambda p=path: self._client().log_artifacts(
                        run_id, str(p), artifact_path=p.name))
                elif path.is_file():
                    self._retry(f"upload {path}", lambda p=path: self._client().log_artifact(run_id, str(p)))
                else:
                    log.warning("tracking: artifact %s of step %s does not exist; skipped", path, step_name)
            if lineage:
                try:
                    objects = Lineage.from_json(lineage)
                    log_datasets(self._client(), self._retry, run_id, objects)
                    log_models(self._client(), self._retry, exp, run_id, objects, self.uri)
                except TrackingUnavailable:
                    raise  # an outage: the whole call is buffered
                except Exception as err:  # LineageRefused, or a lineage bug: never the step's fault
                    log.warning("tracking: lineage of step %s not logged: %s", step_name, safe_uri(str(err)),
                                exc_info=not isinstance(err, LineageRefused))
            self._retry("tag parent",
                        lambda: self._client().set_tag(parent, _key(STEP_TAG_PREFIX + step_name), step_id))
            final = "FAILED" if status == "failed" else "FINISHED"
            self._retry("finish step run", lambda: self._client().set_terminated(run_id, final))
        except TrackingUnavailable:
            if not created:  # the live run keeps what it has; the buffered payload completes it
                raise
            try:  # best effort: leave no half-logged child; the buffered payload recreates it
                self._client().delete_run(run_id)
            except Exception as err:  # noqa: BLE001 - MLflow is already failing; the payload is kept
                log.debug("tracking: could not delete half-logged run %s: %s", run_id, err)
            raise
        return run_id

    def finish(self, parent_run_id: str, status: str, metrics: dict[str, Any] | None = None, step: int = 0) -> None:
        """Close the parent run: ``status`` "success"/"failed"/"killed" or an MLflow RunStatus name.

        ``metrics``: the run's final numbers (train loss, eval losses, tokens/s, MFU ...; other
        values are left out), logged at ``step`` on the parent first, so MLflow's runs table
        compares DAG runs.
        """
        metrics = {k: v for k, v in (metrics or {}).items() if _is_number(v)}
        try:
            self._finish(parent_run_id, status, metrics, step)
        except TrackingUnavailable as err:
            self._buffer("finish", {"parent_run_id": parent_run_id, "status": status, "metrics": metrics,
                                    "step": step}, err)

    def _finish(self, parent_run_id: str, status: str, metrics: dict[str, Any] | None = None, step: int = 0) -> None:
        from mlflow.entities import Metric

        mlflow_status = _FINISH_STATUS.get(status.lower(), status.upper())
        parent = self._resolve(parent_run_id)
        now_ms = int(time.time() * 1000)
        rows = [Metric(_key(k), float(v), now_ms, int(step)) for k, v in sorted((metrics or {}).items())]
        for chunk in _chunks(rows, MAX_METRICS_PER_BATCH):
            self._retry("log parent metrics", lambda c=chunk: self._client().log_batch(parent, metrics=c))
        self._retry("finish parent run", lambda: self._client().set_terminated(parent, mlflow_status))

    def buffer_metrics(self, run_id: str, rows: list[dict[str, Any]], tags: dict[str, str],
                       err: Exception) -> str | None:
        """Keep metric rows ``{"key", "value", "timestamp" (ms), "step"}`` and tags for run
        ``run_id`` in the pending directory (op ``log_metrics``, sent by :meth:`replay_pending`).

        Used by the trainer's live logger (tidal/train/metrics.py) for what it could not
        deliver before training ended.
        """
        return self._buffer("log_metrics", {"run_id": run_id, "rows": rows, "tags": tags}, err)

    def _log_metrics(self, run_id: str, rows: list[dict[str, Any]], tags: dict[str, str]) -> None:
        from mlflow.entities import Metric, RunTag

        metrics = [Metric(_key(r["key"]), float(r["value"]), int(r["timestamp"]), int(r["step"])) for r in rows]
        for chunk in _chunks(metrics, MAX_METRICS_PER_BATCH):
            self._retry("log live metrics", lambda c=chunk: self._client().log_batch(run_id, metrics=c))
        run_tags = [RunTag(_key(k), _text(v, MAX_TAG_VALUE)) for k, v in sorted(tags.items())]
        for chunk in _chunks(run_tags, MAX_PARAMS_TAGS_PER_BATCH):
            self._retry("log live tags", lambda c=chunk: self._client().log_batch(run_id, tags=c))

    def log_eval_curve(self, train_step_id: str, rows: list[dict[str, Any]],
                       tags: dict[str, str] | None = None) -> str | None:
        """Downstream eval results per checkpoint step into one run per train step
        (:func:`tidal.tracking.curves.log_eval_curve`). Returns its run id, None when MLflow did not answer."""
        from tidal.tracking.curves import log_eval_curve

        return log_eval_curve(self, train_step_id, rows, tags)

    def _for_experiment(self, name: str | None) -> Tracker:
        """This tracker, or a copy of it (same client and buffer) for experiment ``name``."""
        if not name or name == self.experiment:
            return self
        other = copy.copy(self)
        other.experiment, other._experiment_id = name, None
        return other

    def replay_pending(self) -> int:
        """Send buffered payloads from the pending buffer (parents first, then steps, then finishes).

        A delivered payload is deleted; one that fails again stays (no new one is written). A
        payload goes to this tracker's URI and to the experiment it was buffered for (one root's
        buffer holds every recipe's). Two processes replaying
        at once may both send one payload: parent runs are found again by their key (no
        duplicate), a step run may then be logged twice.

        Returns:
            The number of payloads delivered.

        Raises:
            OSError, botocore.exceptions.ClientError / BotoCoreError: the buffer cannot be listed.
        """
        if self._pending is None:
            return 0
        order = {"parent_run": 0, "log_step": 1, "log_metrics": 1, "finish": 2}
        names = [n for n in self._pending.list_rel(self._pending_prefix) if n.endswith(".json")]
        loaded = []
        for name in names:
            data = self._pending.read_object(name)
            if data is None:  # replayed by another process meanwhile
                continue
            try:
                loaded.append((name, json.loads(data)))
            except (UnicodeDecodeError, json.JSONDecodeError) as err:
                log.warning("tracking: unreadable pending payload %s: %s", name, err)
        loaded.sort(key=lambda item: (order.get(item[1].get("op"), 9), item[0].rsplit("/", 1)[-1]))
        delivered = 0
        for path, payload in loaded:
            op, args = payload.get("op"), payload.get("args", {})
            target = self._for_experiment(payload.get("experiment"))
            try:
                if op == "parent_run":
                    target._parent_run(args["run_key"], args["params"], args["tags"])
                elif op == "log_step":
                    target._log_step(**args)
                elif op == "finish":
                    target._finish(args["parent_run_id"], args["status"], args.get("metrics"), args.get("step", 0))
                elif op == "log_metrics":
                    target._log_metrics(args["run_id"], args["rows"], args["tags"])
                else:
                    log.warning("tracking: pending file %s has unknown op %r", path, op)
                    continue
            except TrackingUnavailable as err:
                log.warning("tracking: replay of %s failed again: %s", path, err)
                continue
            self._pending.delete_rel([path])
            delivered += 1
        return delivered
