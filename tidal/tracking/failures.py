"""The failure catalog: every failed step attempt, grouped by the fingerprint of its stack trace.

Invariant: recording never loses or overwrites a failure, whatever runs at the same time, and
every machine sees every record. Each failure is one new object under the storage root,
``{root}/failures/{fingerprint}/{time}-{host}-{pid}-{rand}.json``, written through the root's
object API (a local root: temporary file and rename; an object store: one ``PutObject``), so
concurrent task processes in any number of pods need no lock, a reader never sees half a
record, and a pod that dies takes no record with it. Grouping is by prefix; counting is listing.

Fingerprint (what makes two failures "the same"): sha256 over the exception's class name and
its traceback frames as ``(normalised file, function)`` pairs, first 16 hex characters.
Normalisation keeps a trace stable across machines, releases and small edits:

* line numbers are dropped (an edit elsewhere in a file does not split a group);
* a file under ``site-packages/`` keeps only the path after it (venv location and Python
  version do not matter); any other file keeps its last two path components
  (``tidal/quality/gates.py``), so checkouts in different directories agree;
* the message is not hashed (it carries values: sizes, paths, ids), and neither are memory
  addresses, timestamps or the step id; these are stored in the record instead.

The idea follows Sentry's default grouping by stack trace (docs.sentry.io, "Grouping").
Callers pass the storage root itself (a :class:`tidal.storage.Storage`; typed here by the
:class:`CatalogStore` protocol, since tracking does not import storage).
No Airflow import here: the Airflow callback (operators/callbacks.py) builds the record.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import re
import secrets
import socket
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, Protocol

CATALOG_DIR = "failures"
READ_THREADS = 8  # parallel GETs when listing a catalog in an object store
FINGERPRINT_CHARS = 16
LOG_TAIL_LINES = 40


PROJECT_PACKAGES = ("tidal", "operators", "dags", "plugins")  # our code, wherever it is checked out


def normalise_file(filename: str) -> str:
    """``filename`` as hashed: the part after ``site-packages/``; in our own packages the path from
    the package down (``/srv/x/tidal/quality/gates.py`` -> ``tidal/quality/gates.py``, whatever the
    checkout and however deep the module); else its last two components."""
    path = filename.replace("\\", "/")
    if "site-packages/" in path:
        return path.rsplit("site-packages/", 1)[1]
    for package in PROJECT_PACKAGES:
        if f"/{package}/" in f"/{path}":
            return package + "/" + f"/{path}".rsplit(f"/{package}/", 1)[1]
    return "/".join(path.split("/")[-2:])


def frames_of(exc: BaseException) -> list[tuple[str, str]]:
    """``(normalised file, function)`` of every frame of ``exc``'s traceback, outermost first."""
    return [(normalise_file(f.filename), f.name) for f in traceback.extract_tb(exc.__traceback__)]


def fingerprint(exception_type: str, frames: list[tuple[str, str]]) -> str:
    """First 16 hex of sha256 over the exception class name and the normalised frames."""
    text = exception_type + "\n" + "\n".join(f"{file}:{func}" for file, func in frames)
    return hashlib.sha256(text.encode()).hexdigest()[:FINGERPRINT_CHARS]


def build_record(exc: BaseException, **fields: Any) -> dict[str, Any]:
    """A catalog record for ``exc``: type, message, frames, fingerprint, time, plus ``fields``.

    ``fields`` are what the caller knows: ``dag_id``, ``task_id``, ``run_id``, ``try_number``,
    ``recipe``, ``recipe_hash``, ``step_id``, ``mlflow_run_id``, ``mlflow_link``, ``log_tail``...
    A gate failure (an exception with a ``result`` payload, :class:`tidal.quality.gates.GateFailed`) adds
    ``failed_expectations``: the failed checks with what was expected and what was got.
    """
    frames = frames_of(exc)
    exc_type = type(exc).__name__
    record = {
        "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
        "exception_type": exc_type,
        "message": str(exc)[:4000],
        "frames": [f"{file}:{func}" for file, func in frames],
        "fingerprint": fingerprint(exc_type, frames),
        "failed_expectations": failed_expectations(exc),
        **fields,
    }
    return record


def failed_expectations(exc: BaseException) -> list[dict[str, Any]]:
    """The failed expectations of a gate failure (``exc.result["results"]`` with ``success`` false)."""
    result = getattr(exc, "result", None)
    if not isinstance(result, dict):
        return []
    return [r for r in result.get("results", []) if isinstance(r, dict) and not r.get("success", True)]


class CatalogStore(Protocol):
    """What the catalog needs of a storage root (:class:`tidal.storage.Storage` has it): objects
    named relative to the root."""

    def write_object(self, rel: str, data: bytes) -> str:
        """Write one object atomically; its URI."""

    def read_object(self, rel: str) -> bytes | None:
        """One object's bytes, or None."""

    def list_rel(self, prefix: str) -> list[str]:
        """Names of the objects starting with ``prefix``, sorted."""


_UNSAFE = re.compile(r"[^A-Za-z0-9_.]+")


def record_name(record: dict[str, Any]) -> str:
    """``failures/{fingerprint}/{time}-{host}-{pid}-{rand}.json`` for ``record``: unique without a lock
    (host and pid name the writer; 8 random hex tell apart two writers that share both, e.g. pods
    with the same hostname and pid 1)."""
    stamp = record["time"].replace(":", "").replace("-", "").replace("+0000", "Z")
    host = _UNSAFE.sub("_", socket.gethostname())[:63] or "host"
    return f"{CATALOG_DIR}/{record['fingerprint']}/{stamp}-{host}-{os.getpid()}-{secrets.token_hex(4)}.json"


def record_failure(store: CatalogStore, record: dict[str, Any]) -> str:
    """Add ``record`` (from :func:`build_record`) to the catalog of the storage root ``store``.

    Returns:
        The URI of the object written (:func:`record_name`). Never overwrites an earlier record.

    Raises:
        OSError, botocore.exceptions.ClientError / BotoCoreError: the root cannot be written.
    """
    return store.write_object(record_name(record), (json.dumps(record, sort_keys=True, default=str) + "\n").encode())


def list_failures(store: CatalogStore, recipe: str | None = None) -> list[dict[str, Any]]:
    """Every recorded failure of the root ``store`` (optionally of one recipe), newest first.

    One listing of ``failures/`` and one read per record (in parallel); a record that is not
    JSON, or vanished meanwhile, is skipped. Each record gets ``"file"``: its name relative to
    the root.
    """
    names = [n for n in store.list_rel(CATALOG_DIR + "/") if n.endswith(".json")]

    def load(name: str) -> dict[str, Any] | None:
        data = store.read_object(name)
        if data is None:
            return None
        try:
            record = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError):
            return None
        return {**record, "file": name} if isinstance(record, dict) else None

    with ThreadPoolExecutor(max_workers=READ_THREADS) as pool:
        loaded = [r for r in pool.map(load, names) if r is not None]
    records = [r for r in loaded if recipe is None or r.get("recipe") == recipe]
    return sorted(records, key=lambda r: r.get("time", ""), reverse=True)


def group_failures(records: list[dict[str, Any]],
                   is_committed: Callable[[str], bool] | None = None) -> list[dict[str, Any]]:
    """Group records (newest first) by fingerprint; groups ordered by their newest failure.

    Args:
        is_committed: step id -> committed now (``Storage.is_committed``); with it, a group whose
            newest failure's step has been committed since is marked ``resolved`` (the step
            failed, then a retry, rerun or backfill committed it). Kept, not deleted: the catalog
            is history.

    Returns:
        ``[{"fingerprint", "count", "last_seen", "first_seen", "exception_type", "latest",
        "tasks", "resolved"}]`` where ``latest`` is the newest record, ``tasks`` counts per
        ``dag_id.task_id`` and ``resolved`` is True, False, or None (no step id, or no
        ``is_committed`` given).
    """
    groups: dict[str, dict[str, Any]] = {}
    for record in records:
        fp = record["fingerprint"]
        group = groups.setdefault(fp, {
            "fingerprint": fp, "count": 0, "last_seen": record.get("time"), "first_seen": record.get("time"),
            "exception_type": record.get("exception_type"), "latest": record, "tasks": collections.Counter(),
        })
        group["count"] += 1
        group["first_seen"] = record.get("time")
        group["tasks"][f"{record.get('dag_id')}.{record.get('task_id')}"] += 1
    for group in groups.values():
        step_id = group["latest"].get("step_id")
        group["resolved"] = bool(is_committed(step_id)) if is_committed is not None and step_id else None
    return sorted(groups.values(), key=lambda g: g["last_seen"] or "", reverse=True)


def format_groups(groups: list[dict[str, Any]]) -> str:
    """The catalog as ``tidal failures`` prints it: one block per fingerprint, newest first."""
    if not groups:
        return "no failures recorded"
    lines = []
    for group in groups:
        latest = group["latest"]
        tasks = ", ".join(f"{name} x{n}" for name, n in group["tasks"].most_common())
        mark = "  RESOLVED (its step is committed now)" if group.get("resolved") else ""
        lines.append(f"{group['fingerprint']}  {group['count']:>3} failure(s)  last {group['last_seen']}  "
                     f"{group['exception_type']}{mark}")
        lines.append(f"    tasks:   {tasks}")
        lines.append(f"    latest:  step {latest.get('step_id')} try {latest.get('try_number')} "
                     f"run {latest.get('run_id')}")
        lines.append(f"    message: {latest.get('message', '').splitlines()[0][:200] if latest.get('message') else ''}")
        for check in latest.get("failed_expectations", [])[:10]:
            lines.append(f"    failed:  {expectation_text(check)}")
        if latest.get("mlflow_link"):
            lines.append(f"    mlflow:  {latest['mlflow_link']}")
    return "\n".join(lines)


def expectation_text(check: dict[str, Any]) -> str:
    """One failed gate expectation as ``column [source=src]: expected ..., got ...``."""
    got = check.get("observed")
    got = f"{got:.6g}" if isinstance(got, int | float) else str(got)
    return f"{check.get('column')} [source={check.get('source')}]: expected {check.get('expected')}, got {got}"


class LogTail(logging.Handler):
    """A logging handler that keeps the last ``capacity`` formatted lines (for failure records)."""

    def __init__(self, capacity: int = LOG_TAIL_LINES):
        super().__init__(level=logging.INFO)
        self.lines: collections.deque[str] = collections.deque(maxlen=capacity)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(self.format(record)[:1000])
        except Exception:  # noqa: BLE001 - a log line that cannot be formatted is not worth a failure
            self.handleError(record)
