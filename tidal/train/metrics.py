"""Training metrics: throughput, MFU, device memory, and live logging to MLflow.

* tokens/s counts predicted token positions (``B * (S - 1)`` per step) over wall time;
* MFU is ``tokens/s * flops_per_token / (n_devices * peak FLOP/s)`` (Chowdhery et al. 2022,
  "PaLM", Appendix B) with :func:`tidal.train.flops.mfu` and its peak table; devices with no
  peak in that table (CPUs) get no MFU rather than a made-up one;
* memory is the device allocator's ``bytes_in_use``/``peak_bytes_in_use``
  (``jax.Device.memory_stats()``, GPU and TPU) or, where that is unavailable (CPU), the
  process resident set size (``/proc/self/statm``) and its peak (``getrusage`` ``ru_maxrss``).

:class:`LiveMetrics` sends metric rows and tags to one MLflow run from a background thread,
so training never waits on tracking (docs/architecture.md §5). While MLflow is unreachable rows stay in
memory (they are also in ``metrics.jsonl``) and are sent, with their original step and
timestamp, once it answers again; what is still unsent when training ends (after
``close_timeout_s``) is written to the tracker's pending directory
(:meth:`tidal.tracking.Tracker.log_metrics`) for :meth:`tidal.tracking.Tracker.replay_pending`.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from tidal.settings import current
from tidal.storage import open_storage
from tidal.storage.layout import atomic_write_text
from tidal.tracking import Tracker, mlflow_client, safe_uri
from tidal.tracking.client import get_or_create_experiment
from tidal.train import flops

log = logging.getLogger("tidal.train")

from tidal.settings import FLUSH_TIMEOUT_ENV  # noqa: F401 - the names live in tidal/settings.py
from tidal.settings import MLFLOW_EXPERIMENT_ENV as EXPERIMENT_ENV  # noqa: F401
from tidal.settings import MLFLOW_RUN_ID_ENV as RUN_ID_ENV  # noqa: F401
from tidal.settings import TRACKING_URI_ENV as URI_ENV  # noqa: F401

RUN_FILE = "mlflow_run.json"
# MLflow's HTTP client defaults (7 retries, 120 s timeout) would hold one flush for minutes;
# the background thread retries on its own schedule instead. Env vars set by the user win.
LIVE_HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
MAX_METRICS_PER_BATCH = 1000  # mlflow.utils.validation.MAX_METRICS_PER_BATCH
MAX_TAGS_PER_BATCH = 100  # mlflow.utils.validation.MAX_PARAMS_TAGS_PER_BATCH


def device_memory() -> dict[str, float]:
    """Memory in bytes: ``{"memory_bytes", "peak_memory_bytes", "memory_source"}``.

    Source ``"device"``: the largest ``bytes_in_use``/``peak_bytes_in_use`` over local devices
    (``jax.Device.memory_stats()``); ``"rss"``: the process resident set (CPU backends, whose
    devices report no stats). ``ru_maxrss`` is in KiB on Linux (getrusage(2)).
    """
    import jax

    stats = []
    for device in jax.local_devices():
        try:
            got = device.memory_stats()
        except Exception:  # noqa: BLE001 - backends without allocator stats raise or return None
            got = None
        if got and "bytes_in_use" in got:
            stats.append(got)
    if stats:
        return {"memory_bytes": float(max(s["bytes_in_use"] for s in stats)),
                "peak_memory_bytes": float(max(s.get("peak_bytes_in_use", s["bytes_in_use"]) for s in stats)),
                "memory_source": "device"}
    try:
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        rss = 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"memory_bytes": float(rss), "peak_memory_bytes": float(max(peak, rss)), "memory_source": "rss"}


def peak_flops(device_kind: str, n_devices: int) -> float | None:
    """Peak dense bf16 FLOP/s of ``n_devices`` devices of ``device_kind``, None when unknown (CPU)."""
    table = getattr(flops, "peak_flops_per_s", None)
    if table is None:
        return None
    try:
        return n_devices * table(device_kind)
    except ValueError:
        return None


def model_flops_utilisation(tokens_per_s: float, model_cfg: Any, seq_len: int,
                            peak: float | None) -> float | None:
    """MFU as a fraction (:func:`tidal.train.flops.mfu`), None without a known peak."""
    if peak is None or tokens_per_s <= 0:
        return None

    if hasattr(flops, "mfu"):
        return float(flops.mfu(tokens_per_s, model_cfg, seq_len, peak))
    return tokens_per_s * flops.flops_per_token(model_cfg, seq_len) / peak


class LiveMetrics:
    """Metric rows and tags for one MLflow run, delivered by a background thread.

    Args:
        uri: tracking URI (``http://...`` server or ``sqlite:///...``).
        run_id: an existing run to log into; None: create one in ``experiment`` on first
            contact, named ``run_name`` and tagged ``tags`` (and ``end`` it on close).
        experiment: experiment name used when ``run_id`` is None.
        run_file: where the created run's id is kept so a resumed run logs into the same run.
        pending_dir: where rows still unsent at close are written (tracking.Tracker format): a local
            directory, or an object-store root URI (objects ``.tracking/pending/``, docs/architecture.md §0).
        flush_every_s: delivery interval (seconds).
        close_timeout_s: how long :meth:`close` keeps trying to deliver (seconds).
    """

    def __init__(self, uri: str, run_id: str | None = None, *, experiment: str | None = None,
                 run_name: str = "train", tags: dict[str, str] | None = None, run_file: Path | None = None,
                 pending_dir: Path | str | None = None, flush_every_s: float = 0.5, close_timeout_s: float = 60.0):
        for key, value in LIVE_HTTP_DEFAULTS.items():
            os.environ.setdefault(key, value)
        self.uri, self.run_id, self.experiment = uri, run_id, experiment
        self.run_name, self.create_tags, self.run_file = run_name, dict(tags or {}), run_file
        self.pending_dir, self.flush_every_s, self.close_timeout_s = pending_dir, flush_every_s, close_timeout_s
        self.owns_run = False
        if self.run_id is None and run_file is not None and run_file.is_file():
            self.run_id = json.loads(run_file.read_text())["run_id"]
            self.owns_run = True
        self._metrics: deque = deque()
        self._tags: dict[str, str] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._down_since: float | None = None
        self.delivered = 0
        self.outages = 0
        self._client = None
        self._thread = threading.Thread(target=self._loop, name="tidal-live-metrics", daemon=True)
        self._thread.start()

    @classmethod
    def from_env(cls, step_dir: Path, spec: dict[str, Any]) -> LiveMetrics | None:
        """Live logging as the environment says, or None.

        ``MLFLOW_TRACKING_URI`` plus either ``TIDAL_MLFLOW_RUN_ID`` (log into that run) or
        ``TIDAL_MLFLOW_EXPERIMENT`` (create a run there, tagged with the step id, and reuse it
        when the step resumes). ``TIDAL_TRACKING_FLUSH_TIMEOUT_S`` bounds the final flush.
        """
        settings = current()
        uri, run_id, experiment = settings.tracking_uri, settings.mlflow_run_id, settings.mlflow_experiment
        if not uri or not (run_id or experiment):
            return None
        tags = {"tidal.step_id": str(spec.get("step_id", "")), "tidal.kind": "train"}
        root = settings.storage_root
        if not settings.tracking_pending_dir and root and "://" in root and not root.startswith("file://"):
            pending: Path | str = root  # an object-store root: rows left unsent become objects under it
        else:
            pending = Path(settings.tracking_pending_dir or step_dir / "mlflow-pending")
        return cls(uri, run_id, experiment=experiment, run_name=str(spec.get("name", "train")), tags=tags,
                   run_file=step_dir / RUN_FILE, pending_dir=pending,
                   close_timeout_s=settings.tracking_flush_timeout_s)

    # -- producer side (training thread) --------------------------------------------------

    def log(self, step: int, values: dict[str, Any]) -> None:
        """Queue every numeric value of ``values`` as a metric at ``step`` (timestamp: now)."""
        now_ms = int(time.time() * 1000)
        rows = [(k, float(v), now_ms, int(step)) for k, v in sorted(values.items())
                if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"]
        with self._lock:
            self._metrics.extend(rows)
        self._wake.set()

    def set_tags(self, tags: dict[str, Any]) -> None:
        """Queue tags (later values of a key replace earlier unsent ones)."""
        with self._lock:
            self._tags.update({k: v if isinstance(v, str) else json.dumps(v, sort_keys=True)
                               for k, v in tags.items()})
        self._wake.set()

    def pending(self) -> int:
        """Rows and tags not delivered yet."""
        with self._lock:
            return len(self._metrics) + len(self._tags)

    # -- consumer side (background thread) ------------------------------------------------

    def _mlflow(self):
        if self._client is None:
            self._client = mlflow_client(self.uri)
        return self._client

    def _ensure_run(self) -> str:
        if self.run_id is None:
            client = self._mlflow()
            exp = get_or_create_experiment(client, self.uri, self.experiment)
            self.run_id = client.create_run(exp, tags=self.create_tags, run_name=self.run_name).info.run_id
            self.owns_run = True
            if self.run_file is not None:
                atomic_write_text(self.run_file, json.dumps({"run_id": self.run_id, "uri": self.uri}) + "\n")
        return self.run_id

    def _send_once(self) -> bool:
        """Deliver one batch; True when the queue is empty afterwards. Raises on MLflow errors."""
        from mlflow.entities import Metric, RunTag

        with self._lock:
            rows = [self._metrics[i] for i in range(min(len(self._metrics), MAX_METRICS_PER_BATCH))]
            tags = dict(list(self._tags.items())[:MAX_TAGS_PER_BATCH])
        if not rows and not tags:
            return True
        run_id = self._ensure_run()
        self._mlflow().log_batch(run_id, metrics=[Metric(*r) for r in rows],
                                 tags=[RunTag(k, v[:8000]) for k, v in tags.items()])
        with self._lock:
            for _ in rows:
                self._metrics.popleft()
            for key, value in tags.items():
                if self._tags.get(key) == value:
                    del self._tags[key]
            empty = not self._metrics and not self._tags
        self.delivered += len(rows)
        return empty

    def _flush(self) -> bool:
        """Deliver until empty or an error; True on success (MLflow reachable)."""
        try:
            while not self._send_once():
                pass
        except Exception as err:  # noqa: BLE001 - any MLflow/HTTP/DB error means "not now"
            if self._down_since is None:
                self._down_since = time.monotonic()
                self.outages += 1
                log.warning("live tracking: MLflow at %s unreachable (%s); %d metric rows buffered, "
                            "training goes on", safe_uri(self.uri), safe_uri(str(err).splitlines()[0][:200]),
                            self.pending())
            return False
        if self._down_since is not None:
            log.warning("live tracking: MLflow reachable again after %.1f s; buffered metrics delivered",
                        time.monotonic() - self._down_since)
            self._down_since = None
        return True

    def _loop(self) -> None:
        backoff = self.flush_every_s
        while not self._stop:
            self._wake.wait(backoff)
            self._wake.clear()
            if self._stop:
                break
            backoff = self.flush_every_s if self._flush() else min(backoff * 2, 5.0)

    def close(self, status: str = "FINISHED", end_run: bool = True) -> int:
        """Deliver what is queued (trying for up to ``close_timeout_s``), end a run we created
        with ``status`` (unless ``end_run`` is False: a preempted run resumes into it), and
        buffer whatever is left to the pending directory.

        Returns:
            The number of metric rows and tags that could not be delivered (0: all delivered).
        """
        self._stop = True
        self._wake.set()
        self._thread.join()
        deadline = time.monotonic() + self.close_timeout_s
        delay = 0.5
        while not self._flush() and time.monotonic() < deadline:
            time.sleep(min(delay, max(deadline - time.monotonic(), 0)))
            delay = min(delay * 2, 5.0)
        left = self.pending()
        if left:
            self._buffer_rest()
        elif end_run and self.owns_run and self.run_id is not None:
            try:
                self._mlflow().set_terminated(self.run_id, status)
            except Exception as err:  # noqa: BLE001 - the metrics are in; the run's end state is cosmetic
                log.warning("live tracking: could not end run %s: %s", self.run_id, err)
        return left

    def _buffer_rest(self) -> None:
        with self._lock:
            rows = [{"key": k, "value": v, "timestamp": t, "step": s} for k, v, t, s in self._metrics]
            tags = dict(self._tags)
        if isinstance(self.pending_dir, str):  # the storage root: {root}/.tracking/pending/ objects, replayed by report
            tracker = Tracker(self.uri, experiment=self.experiment or "tidal", store=open_storage(self.pending_dir))
        else:
            tracker = Tracker(self.uri, experiment=self.experiment or "tidal", pending_dir=self.pending_dir)
        if self.run_id is None:
            log.warning("live tracking: MLflow never answered; %d metric rows stay in metrics.jsonl only "
                        "(no run was created)", len(rows))
            return
        tracker.buffer_metrics(self.run_id, rows, tags, RuntimeError("unreachable at the end of training"))
        log.warning("live tracking: %d metric rows and %d tags left for tracking.Tracker.replay_pending in %s",
                    len(rows), len(tags), tracker.pending_where)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a step's ``metrics.jsonl`` (``[]`` when there is none)."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def truncate_metrics(path: Path, last_step: int) -> list[dict[str, Any]]:
    """Keep only metric records with ``step <= last_step`` (steps about to be re-done go); returns them."""
    from tidal.storage.layout import atomic_write_text

    kept = [r for r in read_metrics(path) if r["step"] <= last_step]
    atomic_write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))
    return kept
