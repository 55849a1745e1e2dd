"""The training loop: sharded jitted step, then hooks for eval, metrics, checkpoints, preemption.

Config: :mod:`tidal.train.config` (parsed once, by :func:`load_spec`, into ``TrainStepConfig``); hooks:
:mod:`tidal.train.hooks`. :func:`train` is "fetch batch, step, run the hooks"; what a step
logs, evaluates, saves or stops on is a hook registered with an interval by :func:`training_hooks`.

Invariant: the run is a pure function of ``spec.json`` (config, input bytes, seed). Parameters
are initialised from the step seed, batch ``i`` is ``BatchLoader.batch(i)``, and a resumed run
restores params and optimizer state from the newest verified checkpoint and continues at the
next step, so its parameters and losses are bitwise those of an uninterrupted run (on the
same backend and mesh). Step numbers in every output count *completed* optimizer updates
(1..steps).

Parallelism (:mod:`tidal.train.mesh`): one ``("data", "fsdp", "tensor")`` mesh over every
device of every process (multi-process start: :mod:`tidal.train.distributed`); parameters and
optimizer state are laid out by :func:`tidal.train.mesh.state_shardings`, batches are split
over ``data x fsdp``, and the step is jitted with those in/out shardings. Another mesh shape
changes the order of floating-point reductions, so losses agree only to rounding.

Preemption: SIGTERM (GKE sends it before a spot VM goes, then waits
``terminationGracePeriodSeconds``) sets a flag (:mod:`tidal.train.preemption`); at the next step boundary the state is
checkpointed and the process exits with :data:`EXIT_PREEMPTED`. A SIGKILL loses at most the
steps since the last finished checkpoint.

Files written in the step directory by process 0 (besides ``checkpoints/``, see
checkpoints.py): ``metrics.jsonl`` one JSON object per logged step (and a step-0 line of the
initial parameters' evals on a fresh start); ``summary.json`` at the
end; ``profile.json`` for ``--profile N`` runs (which never write a summary or checkpoint).
"""

from __future__ import annotations

import contextlib
import json
import logging
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np

from tidal.files.counting import ranged_gets
from tidal.integrity.fingerprint import environment_fingerprint, fingerprint_diff
from tidal.settings import current
from tidal.storage import uris
from tidal.storage.layout import SPEC_JSON as SPEC
from tidal.storage.layout import SUMMARY_JSON as SUMMARY
from tidal.storage.layout import atomic_write_text
from tidal.train import distributed
from tidal.train import hooks as hooklib
from tidal.train import mesh as meshlib
from tidal.train.build import Run, build, evaluate
from tidal.train.checkpoints import Checkpointer
from tidal.train.config import ConfigError, parse_step_config
from tidal.train.continuation import continue_from_parent, continued_root_hash
from tidal.train.curves import LOSS_CURVE, write_loss_curve
from tidal.train.distributed import host_scalar
from tidal.train.divergence import EVENTS as DIVERGENCE_EVENTS
from tidal.train.divergence import Guard, Rerun, append_event
from tidal.train.goodput import Goodput
from tidal.train.initial_eval import evaluate_initial
from tidal.train.metrics import RUN_FILE, LiveMetrics, device_memory, read_metrics, truncate_metrics
from tidal.train.mirror import CHECKPOINT_DIR, MANIFEST_DIR, CheckpointMirror
from tidal.train.model import flops_per_token, param_count
from tidal.train.preemption import Preempted, SigtermFlag
from tidal.train.trace import StepTrace, parse_steps
from tidal.train.tree_hash import tree_sha256
from tidal.train.watchdog import Watchdog

METRICS = "metrics.jsonl"
# uploaded beside each checkpoint in the bucket, fetched by a process that resumes from it there:
# the loss curve so far and the MLflow run to keep logging into
SIDECARS = (METRICS, RUN_FILE, DIVERGENCE_EVENTS)


def _live_tags(run: Run, fingerprint: dict[str, Any]) -> dict[str, str]:
    tags = {"tidal.environment_fingerprint": json.dumps(fingerprint, sort_keys=True),
            "tidal.mesh": meshlib.describe(run.mesh), "tidal.param_count": str(param_count(run.model_cfg))}
    ref = run.cfg.continue_from
    if ref is not None:  # the parent step and the checkpoint this run started from
        tags |= {"tidal.continue_from": ref.step, "tidal.continue_from_checkpoint_step": str(ref.checkpoint_step),
                 "tidal.continue_schedule": ref.schedule}
        if ref.checkpoint_root_hash is not None:  # None: a branch planned with its trunk (the summary has it)
            tags["tidal.continue_from_root_hash"] = ref.checkpoint_root_hash
    return tags


@dataclass
class Session:
    """What a training process holds around the loop: where it writes and what it resumed from."""

    run: Run
    step_dir: Path
    log: logging.Logger
    primary: bool
    fingerprint: dict[str, Any]
    live: LiveMetrics | None
    ckpt: Checkpointer
    start: int = 0
    state: Any = None
    manifest: dict[str, Any] | None = None
    changed: list[str] = field(default_factory=list)
    abstract: Any = None  # the state's ShapeDtypeStructs with shardings (what a restore fills)
    goodput: Goodput = field(default_factory=Goodput)  # badput clocks (set by train: started with it)
    guard: Guard | None = None  # the divergence guard (train.divergence), None without one
    spec: dict[str, Any] = field(default_factory=dict)  # spec.json (a continuation's parent input)
    data_gets: int | None = None  # ranged GETs this process sent during the loop (token rows from a bucket)

    @property
    def metrics_path(self) -> Path:
        return self.step_dir / METRICS

    def step_args(self) -> tuple:
        """Extra arguments of the step function: the loss ceiling when a guard is on."""
        return () if self.guard is None else (np.float32(self.guard.ceiling),)


def _make_guard(run: Run, step_dir: Path, primary: bool, log: logging.Logger) -> Guard | None:
    if run.cfg.divergence is None:
        return None

    def batch_ids(step: int) -> list[str]:
        return [f"{str(path).rsplit('/', 1)[-1]}:{row}"
                for path, row in map(run.data.train.locate, run.loader.indices(step - 1))]

    return Guard(run.cfg.divergence, batch_ids, append_event(step_dir / DIVERGENCE_EVENTS) if primary else None, log)


def open_session(step_dir: Path, spec: dict[str, Any], run: Run, log: logging.Logger,
                 mirror: str | None = None, fence: Callable[[], None] | None = None) -> Session:
    """Start live metrics, open the checkpoints and restore the newest verified one (``state`` None when
    there is none: a fresh start, whose state the caller initializes).

    With ``mirror`` (the step's staging location in the bucket) checkpoints go to the bucket and
    the newest one there that verifies is restored, with the metrics written up to it
    (:data:`SIDECARS`), so a process on a fresh node continues the same curve and MLflow run.
    ``fence`` is called before every upload that makes a checkpoint count (:mod:`tidal.train.fence`).

    Raises:
        CheckpointMismatch: the newest verified checkpoint belongs to another model shape
            (the checkpointer and live metrics are closed first).
    """
    primary = distributed.is_primary()
    fingerprint = environment_fingerprint()
    if mirror is not None and primary:
        CheckpointMirror(mirror, log).fetch_sidecars(step_dir, SIDECARS)
    live = LiveMetrics.from_env(step_dir, spec) if primary else None
    if live is not None:
        live.set_tags(_live_tags(run, fingerprint))

    def on_manifest(manifest: dict[str, Any]) -> None:
        if live is not None:
            live.set_tags({"tidal.checkpoint_root_hash": manifest["root_hash"],
                           "tidal.checkpoint_step": str(manifest["step"])})

    # the CPU step never donates its input state (see build), so a save may read it from the
    # background thread while the next steps run
    ckpt = Checkpointer(step_dir, run.cfg.keep_checkpoints, log, permanent_every=run.cfg.checkpoint_permanent_every,
                        primary=primary, on_manifest=on_manifest, host_state=jax.default_backend() == "cpu",
                        mirror=mirror, fence=fence)
    abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                            run.abstract, run.shardings)
    session = Session(run, step_dir, log, primary, fingerprint, live, ckpt, abstract=abstract,
                      guard=_make_guard(run, step_dir, primary, log), spec=spec)
    try:
        restored = ckpt.restore_latest(abstract)
        if restored is None and run.cfg.continue_from is not None:
            restored = continue_from_parent(session)
    except Exception:
        ckpt.close()
        if live is not None:
            live.close(status="FAILED")
        raise
    if restored is None:  # a fresh start: the caller initializes the state (startup, not restore)
        return session
    session.start, session.state, session.manifest = restored
    if session.guard is not None:
        session.guard.restore((session.manifest.get("trainer") or {}).get("divergence"))
    if not session.manifest.get("continued"):  # a continuation's first start is printed by continue_from_parent
        where = (uris.join(ckpt.mirror.location, CHECKPOINT_DIR, str(session.start)) if ckpt.sharded
                 else ckpt.path(session.start))
        print(f"resumed from checkpoint step {session.start} ({where})", flush=True)
    before = session.manifest.get("fingerprint")
    session.changed = fingerprint_diff(before, fingerprint) if isinstance(before, dict) else []
    if session.changed:
        log.warning("resuming under a different environment fingerprint than checkpoint %d was saved "
                    "with: %s", session.start, "; ".join(session.changed))
        if live is not None:
            live.set_tags({"tidal.fingerprint_changed": "; ".join(session.changed)})
    return session


@dataclass
class Meters:
    """The hooks whose measurements the summary reads."""

    throughput: hooklib.Throughput
    memory: hooklib.DeviceMemory
    evaluation: hooklib.Evaluation


def training_hooks(session: Session, term: SigtermFlag, metrics_file: Any,
                   stop_after: int | None = None) -> tuple[hooklib.Hooks, Meters]:
    """The trainer's hooks in their order (see :mod:`tidal.train.hooks` for the rules).

    Logging steps (every ``log_every`` and every eval step) fill one metrics line: stats on the
    host, throughput and MFU, memory, then the eval results on eval steps; process 0 writes it,
    sends it to MLflow and prints it. Then the checkpoint (every ``checkpoint_every``), the end
    of the timed loop (last step), the timing mark reset (eval and checkpoint steps), SIGTERM,
    and ``--stop-after``.
    """
    run, cfg, ckpt = session.run, session.run.cfg, session.ckpt
    logged = (cfg.log_every, cfg.eval_every)
    meters = Meters(hooklib.Throughput(run.tokens_per_step, session.start, run.mfu, block=jax.block_until_ready),
                    hooklib.DeviceMemory(device_memory), hooklib.Evaluation(lambda params: evaluate(run, params)))

    def save(step: int, state: Any) -> None:
        sidecars = None
        if ckpt.mirror is not None and session.primary:  # the curve up to this checkpoint goes with it
            if metrics_file is not None:
                metrics_file.flush()
            sidecars = {name: (session.step_dir / name).read_bytes() for name in SIDECARS
                        if (session.step_dir / name).is_file()}
        trainer = None if session.guard is None else {"divergence": session.guard.state()}
        ckpt.save(step, state, session.fingerprint, sidecars, trainer)

    save = session.goodput.timed("checkpoint", save)  # what a save blocks the loop for

    hooks = hooklib.Hooks(cfg.steps)
    if session.guard is not None:  # first: a diverged step must not be logged as good or checkpointed
        guard = session.guard
        hooks.add(lambda info: guard.check(info.step, host_scalar(info.stats["loss"]),
                                           host_scalar(info.stats["grad_norm"])), every=1, name="divergence_guard")
    hooks.add(meters.throughput.first_step, every=1)
    hooks.add(hooklib.host_stats(host_scalar), every=logged)
    hooks.add(meters.throughput.measure, every=logged)
    hooks.add(meters.memory, every=logged, name="device_memory")
    hooks.add(session.goodput.timed("eval", meters.evaluation), every=cfg.eval_every, name="evaluate")
    if metrics_file is not None:
        hooks.add(hooklib.write_line(metrics_file, lambda r: json.dumps(r, sort_keys=True)), every=logged)
    if session.live is not None:
        live = session.live
        hooks.add(lambda info: live.log(info.step, info.record), every=logged, name="live_metrics")
    if session.primary:
        hooks.add(hooklib.progress(cfg.steps), every=logged)
    hooks.add(hooklib.checkpoint(save), every=cfg.checkpoint_every)
    hooks.add(lambda info: ckpt.check(), every=1, name="checkpoint_failed")  # a failed save stops the next step
    hooks.add(meters.throughput.end_loop, every=cfg.steps)  # the last step only
    hooks.add(meters.throughput.exclude, every=(cfg.eval_every, cfg.checkpoint_every))
    hooks.add(hooklib.preemption(term.agreed, save, ckpt.wait), every=1)
    if stop_after is not None:
        hooks.add(hooklib.stop_after(stop_after, ckpt.wait), every=1)
    return hooks, meters


def train(step_dir: str | Path, spec: dict[str, Any], *, stop_after: int | None = None,
          log: logging.Logger | None = None, mirror: str | None = None,
          fence: Callable[[], None] | None = None) -> dict[str, Any] | None:
    """Train (or resume training) as ``spec`` says, writing into ``step_dir``.

    Args:
        step_dir: output directory (holds ``spec.json``, checkpoints, metrics, summary).
        spec: ``{"config", "inputs": {name: dir}, "seed", ...}`` as written by ``tidal.train.run``, its
            config the parsed :class:`tidal.train.config.TrainStepConfig` (:func:`load_spec`).
        stop_after: testing aid that simulates preemption: return None right after completing
            this step (after its checkpoint, if one is due), without writing a summary.
        mirror: the step's staging location in the bucket: checkpoints are written there and
            resumed from there (:mod:`tidal.train.mirror`); None: only ``step_dir``.
        fence: with ``mirror``, called before every upload that makes a checkpoint count; raises
            :class:`tidal.storage.lease.LeaseLost` once another process trains the step
            (:meth:`tidal.train.fence.Fence.check`).

    Returns:
        The summary (also written to ``summary.json`` by process 0), see :func:`summarise`.

    Raises:
        ConfigError, DataContractError: bad config or inputs, before any training.
        CheckpointMismatch: the newest verified checkpoint belongs to another model shape.
        Preempted: SIGTERM arrived; the current step was checkpointed (exit code 75).
        CheckpointSaveFailed: a checkpoint could not be written (seen at the next step).
    """
    step_dir = Path(step_dir)
    log = log or logging.getLogger("tidal.train")
    try:
        trace = StepTrace(parse_steps(current().train_profile_steps), step_dir)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    goodput = Goodput()
    with goodput.timing("startup"):
        run = build(spec, where=step_dir / SPEC)
    with goodput.timing("restore"):
        session = open_session(step_dir, spec, run, log, mirror, fence)
    if session.state is None:
        with goodput.timing("startup"):
            session.state = run.fresh_state()
    session.goodput = goodput
    if session.primary:  # a fresh start drops every line, step 0's too: it is evaluated again below
        truncate_metrics(session.metrics_path, session.start if session.start else -1)
    print(f"training {param_count(run.model_cfg):,} params, {run.cfg.steps} steps of {run.cfg.batch_size}x"
          f"{run.seq_len} tokens from step {session.start} on mesh {meshlib.describe(run.mesh)}", flush=True)
    metrics_file = open(session.metrics_path, "a") if session.primary else None  # noqa: SIM115 - closed below
    term = SigtermFlag()
    hooks, meters = training_hooks(session, term, metrics_file, stop_after)
    if session.start == 0:
        evaluate_initial(session, meters, metrics_file)
    status, state = "FAILED", session.state

    gets_before = ranged_gets()
    try:
        with term, Watchdog(current().train_watchdog_s) as watchdog:
            i = session.start
            while i < run.cfg.steps:
                try:
                    # the first step's read is inside its time, counted as compilation's
                    with goodput.timing("data_wait") if i > session.start else contextlib.nullcontext():
                        batch = run.batch(i)
                    trace.before(i + 1)
                    state, stats = run.step(state, batch, np.int32(i), *session.step_args())
                    trace.after(i + 1, stats)
                    hooks.run(i + 1, state, stats)
                except Rerun:  # train.divergence.action: rerun
                    metrics_file = _rewind(session, metrics_file)
                    hooks, meters = training_hooks(session, term, metrics_file, stop_after)
                    i, state = session.start, session.state
                    continue
                watchdog.beat(i + 1)
                i += 1
            session.data_gets = ranged_gets() - gets_before
            with goodput.timing("checkpoint"):  # the last checkpoint counts before the summary
                session.manifest = session.ckpt.wait() or session.manifest
        status = "FINISHED"
    except Preempted:
        status = "KILLED"
        raise
    except hooklib.StopTraining:
        status = "KILLED"
        return None
    finally:
        trace.stop()
        if metrics_file is not None:
            metrics_file.close()
        try:
            session.ckpt.close()
        finally:
            if session.live is not None:
                # a stopped run is resumed later and keeps logging into the same MLflow run
                session.live.close(status=status, end_run=status != "KILLED")
    session.state = state
    # a SIGTERM after the last step (the kubelet's, on one host of several): the summary is a collective, so
    # it is finished within the grace rather than this process dying alone in it and failing the others
    with SigtermFlag():
        return summarise(session, meters)


def _rewind(session: Session, metrics_file: Any) -> Any:
    """Back to the newest verified checkpoint (or the initial state) after a divergence the guard
    reruns: state, guard history and metrics as of that step. Returns the reopened metrics file."""
    session.ckpt.wait()
    restored = session.ckpt.restore_latest(session.abstract)
    ref = session.run.cfg.continue_from
    if ref is not None and (restored is None or restored[0] <= ref.checkpoint_step):  # back to the parent's
        restored = continue_from_parent(session)
    if restored is None:
        session.start, session.state, session.manifest = 0, session.run.fresh_state(), None
    else:
        session.start, session.state, session.manifest = restored
    session.guard.restore(((session.manifest or {}).get("trainer") or {}).get("divergence"))
    print(f"rerunning from checkpoint step {session.start} after a divergence", flush=True)
    if metrics_file is None:
        return None
    metrics_file.close()
    truncate_metrics(session.metrics_path, session.start)
    return open(session.metrics_path, "a")


def summarise(session: Session, meters: Meters) -> dict[str, Any]:
    """The run's summary; process 0 writes it to ``summary.json``.

    Keys: ``steps``, ``tokens_seen`` (predicted token positions, ``steps * B * (S - 1)``),
    ``final_train_loss`` (nats/token), ``eval_loss`` (mean over eval sets), ``eval_loss/<set>``,
    ``eval_bpb/<set>`` (bits/byte), ``initial_eval_loss/<set>`` (the step-0 eval before any update,
    :func:`evaluate_initial`; eval sets are the held-out sources and ``heldout/<source>``
    splits), ``param_count``, ``flops_per_token``, ``checkpoint_step``,
    ``checkpoint_root_hash``, ``params_sha256`` (:func:`tree_sha256` of the final parameters:
    equal across identical runs), ``environment_fingerprint`` (JSON), ``mesh`` and, when steps
    ran in this process, ``tokens_per_second``/``step_time_s`` after the first (compiling) step,
    ``mfu`` (when the device's peak is known), ``peak_memory_bytes``, the loop's wall and CPU
    throughput and the checkpoint save times, ``goodput`` and ``badput_s/<cause>`` of this process
    (:mod:`tidal.train.goodput`); with checkpoints in the bucket, how many this process
    uploaded and at what rate (``checkpoint_upload_MBps``, 10^6 bytes/s); with the training data in a bucket,
    ``data_gets_per_step``: the ranged GETs this process sent during the loop per step it ran (its rows of each
    batch, read ahead).
    """
    run, cfg, ckpt, manifest = session.run, session.run.cfg, session.ckpt, session.manifest
    last_eval = meters.evaluation.last
    if session.start == cfg.steps:  # nothing left to run: recompute the (deterministic) final eval
        last_eval = evaluate(run, session.state["params"])
    records = read_metrics(session.metrics_path) if session.primary else []
    final = [r for r in records if r["step"] == cfg.steps]
    initial = next((r for r in records if r["step"] == 0), {})  # evaluate_initial's line
    summary: dict[str, Any] = {
        "steps": cfg.steps, "tokens_seen": cfg.steps * run.tokens_per_step,
        "param_count": param_count(run.model_cfg), "flops_per_token": flops_per_token(run.model_cfg, run.context),
        "seq_len": run.seq_len, "batch_size": cfg.batch_size,
        "checkpoint_step": manifest["step"], "checkpoint_root_hash": manifest.get("root_hash", ""),
        "params_sha256": tree_sha256(session.state["params"]),  # each host its shards, then 32 bytes a leaf
        "environment_fingerprint": json.dumps(session.fingerprint, sort_keys=True),
        "mesh": meshlib.describe(run.mesh).split(" (")[0],
    }
    if session.changed:
        summary["fingerprint_changed"] = "; ".join(session.changed)
    ref = cfg.continue_from
    if ref is not None:
        summary |= {"continue_from": ref.step, "continue_from_checkpoint_step": ref.checkpoint_step,
                    "continue_from_root_hash": continued_root_hash(ref, session.step_dir / MANIFEST_DIR)}
    if final:
        summary["final_train_loss"] = final[-1]["loss"]
    if last_eval:
        losses = [v for k, v in last_eval.items() if k.startswith("eval_loss/")]
        summary["eval_loss"] = sum(losses) / len(losses)
        bpbs = [v for k, v in last_eval.items() if k.startswith("eval_bpb/")]
        if bpbs:
            summary["eval_bpb"] = sum(bpbs) / len(bpbs)
        summary.update(last_eval)
    summary |= {f"initial_{k}": v for k, v in sorted(initial.items()) if k.startswith("eval_loss/")}
    summary |= meters.throughput.summary(steps_after_first=cfg.steps - session.start - 1)
    summary |= session.goodput.summary(cfg.steps - session.start, summary.get("step_time_s"),
                                       meters.throughput.first_step_s)
    if meters.memory.peak:
        summary["peak_memory_bytes"] = meters.memory.peak
    if session.data_gets is not None and run.loader.shards.remote and cfg.steps > session.start:
        summary["data_gets_per_step"] = session.data_gets / (cfg.steps - session.start)  # this host's
    if ckpt.save_seconds:
        summary["checkpoint_saves"] = len(ckpt.save_seconds)
        summary["checkpoint_blocking_s_mean"] = statistics.fmean(b for _, b, _ in ckpt.save_seconds)
        summary["checkpoint_write_s_mean"] = statistics.fmean(w for _, _, w in ckpt.save_seconds)
        summary["checkpoint_bytes"] = manifest.get("total_bytes", 0)
    uploads = ckpt.mirror.uploads if ckpt.mirror is not None else []
    if uploads:  # checkpoints this process sent to the bucket (files + manifest, end to end)
        summary["checkpoint_uploads"] = len(uploads)
        seconds = max(sum(s for _, _, s in uploads), 1e-9)
        summary["checkpoint_upload_MBps"] = sum(b for _, b, _ in uploads) / seconds / 1e6
    events = session.step_dir / DIVERGENCE_EVENTS
    if session.guard is not None and events.is_file():  # every process's events (a sidecar when resumed)
        verdicts = [json.loads(line)["verdict"] for line in events.read_text().splitlines() if line.strip()]
        summary["divergence_events"] = len(verdicts)
        summary["updates_skipped"] = verdicts.count("update skipped")
    if session.primary:  # the picture before summary.json, which marks the step finished
        write_loss_curve(session.metrics_path, session.step_dir / LOSS_CURVE)
        atomic_write_text(session.step_dir / SUMMARY, json.dumps(summary, indent=1, sort_keys=True) + "\n")
        print(f"done: {json.dumps(summary, sort_keys=True)}", flush=True)
    return summary


def load_spec(step_dir: str | Path) -> dict[str, Any]:
    """Read ``STEP_DIR/spec.json``, its ``config`` parsed into the step's
    :class:`tidal.train.config.TrainStepConfig`: the config's one parse in this process (every part of
    the run reads that model).

    Raises:
        ConfigError: missing or not a JSON object with a ``config`` mapping, or a config the model
            refuses (naming the file and each dotted field).
    """
    path = Path(step_dir) / SPEC
    try:
        spec = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError) as err:
        raise ConfigError(f"{path}: cannot read the step spec ({err})") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("config"), dict):
        raise ConfigError(f"{path}: expected an object with a 'config' mapping")
    return {**spec, "config": parse_step_config(spec["config"], path)}

