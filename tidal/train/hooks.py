"""Hooks of the training loop: what runs after an optimizer step, and how often.

Invariant: a hook observes the run and never changes it. The loop (:func:`tidal.train.trainer.train`)
is only "fetch batch, step, run the hooks"; throughput, evaluation, the metrics line, progress,
checkpoints, preemption and live metrics are hooks registered with an interval, so the loop's
parameters and losses are those of a loop without hooks (bitwise-resume tests guard this), and
each hook can be tested alone with a fake :class:`StepInfo`.

Rules of :class:`Hooks` (Levanter's ``add_hook(fn, every=N)``, in our words):

* a hook registered with ``every=N`` runs after step ``s`` when ``s % N == 0`` and always after
  the last step; ``every=(N, M)`` runs when either divides ``s``;
* hooks run in the order they were added, every time; a hook's exception propagates out of
  :meth:`Hooks.run` (and so out of the loop): :class:`tidal.train.preemption.Preempted` and
  :class:`StopTraining` end a run this way on purpose;
* hooks of one step share one :class:`StepInfo`: a hook that starts the step's metrics line
  (``info.record``) runs before the hooks that add to it, write it or print it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TextIO


@dataclass
class StepInfo:
    """What the hooks of one step see and share.

    Attributes:
        step: completed optimizer updates, 1-based (the step just taken).
        state: ``{"params", "opt_state"}`` after the step.
        stats: the step's device scalars (``loss``, ``grad_norm``, ``lr``, MoE terms).
        last: True after the run's final step.
        record: this step's metrics line, once a hook starts one (logging steps only).
        saved: a checkpoint of this step was requested by a hook.
    """

    step: int
    state: Any
    stats: dict[str, Any]
    last: bool
    record: dict[str, Any] | None = None
    saved: bool = False


Hook = Callable[[StepInfo], None]


@dataclass(frozen=True)
class _Entry:
    fn: Hook
    every: tuple[int, ...]
    name: str


class Hooks:
    """Hooks with intervals, run in registration order after each optimizer step.

    Args:
        last_step: the run's final step (1-based), after which every hook runs.
    """

    def __init__(self, last_step: int):
        self.last_step = last_step
        self._entries: list[_Entry] = []

    def add(self, fn: Hook, every: int | Iterable[int] = 1, *, name: str | None = None) -> Hook:
        """Register ``fn`` to run after steps that ``every`` (one interval or several) divides.

        Raises:
            ValueError: an interval that is not a positive int.
        """
        intervals = tuple(every) if isinstance(every, Iterable) else (every,)
        if not intervals or any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in intervals):
            raise ValueError(f"hook {name or getattr(fn, '__name__', fn)!r}: every must be positive ints, "
                             f"got {every!r}")
        self._entries.append(_Entry(fn, intervals, name or getattr(fn, "__qualname__", repr(fn))))
        return fn

    @property
    def names(self) -> list[str]:
        """Registered hook names, in run order."""
        return [e.name for e in self._entries]

    def due(self, every: tuple[int, ...], step: int) -> bool:
        """Whether a hook with intervals ``every`` runs after ``step``."""
        return step == self.last_step or any(step % n == 0 for n in every)

    def run(self, step: int, state: Any, stats: dict[str, Any]) -> StepInfo:
        """Run the hooks due after ``step``; returns the info they shared."""
        info = StepInfo(step, state, stats, last=step == self.last_step)
        for entry in self._entries:
            if self.due(entry.every, step):
                entry.fn(info)
        return info


class StopTraining(Exception):
    """Raised by a hook to end the run after the current step without a summary (``--stop-after``)."""

    def __init__(self, step: int):
        self.step = step
        super().__init__(f"stopped after step {step}")


# ---------------------------------------------------------------------------------------------
# The trainer's hooks. Each takes what it needs as arguments, so a test can drive it with a
# StepInfo and fakes; tidal.train.trainer.training_hooks registers them in their order.


@dataclass
class Throughput:
    """Step time, tokens/s and MFU of the steps this process ran.

    Timing excludes compilation (the first step of the process), evals and checkpoint saves: the
    mark is reset after each of those (:meth:`exclude`). ``loop_*`` cover every step after the
    first, evals and saves included, up to the last step's save call.

    Args:
        tokens_per_step: predicted tokens per update, ``B * (S - 1)``.
        start_step: the step the process starts after (0, or the resumed checkpoint's step).
        mfu: tokens/s -> model FLOPs utilisation, or None without a known device peak.
    """

    tokens_per_step: int
    start_step: int
    mfu: Callable[[float], float | None] = lambda tokens_per_s: None
    clock: Callable[[], float] = time.perf_counter
    cpu_clock: Callable[[], float] = time.process_time
    block: Callable[[Any], Any] = lambda x: x
    first_step_s: float | None = None
    timed_s: float = 0.0
    timed_steps: int = 0
    loop_start: float | None = None
    loop_end: float | None = None
    loop_cpu: tuple[float, float] = (0.0, 0.0)
    mark_time: float = field(init=False)
    mark_step: int = field(init=False)

    def __post_init__(self) -> None:
        self.mark_time, self.mark_step = self.clock(), self.start_step

    def first_step(self, info: StepInfo) -> None:
        """Every step; on the process's first, wait for it and time compilation + the step."""
        if self.first_step_s is not None:
            return
        self.block(info.stats["loss"])
        now = self.clock()
        self.first_step_s, self.mark_time, self.mark_step = now - self.mark_time, now, info.step
        self.loop_start, self.loop_cpu = now, (self.cpu_clock(), 0.0)

    def measure(self, info: StepInfo) -> None:
        """Logging steps (after the stats are on the host): mean step time since the mark."""
        now = self.clock()
        if info.step > self.mark_step:
            step_s = (now - self.mark_time) / (info.step - self.mark_step)
            self.timed_s += now - self.mark_time
            self.timed_steps += info.step - self.mark_step
        else:  # the first step of this process: its time is mostly compilation
            step_s = self.first_step_s
        self.mark_time, self.mark_step = now, info.step
        record = info.record if info.record is not None else {}
        record |= {"tokens_per_second": self.tokens_per_step / step_s, "step_time_s": step_s}
        mfu = self.mfu(record["tokens_per_second"])
        if mfu is not None:
            record["mfu"] = mfu
        info.record = record

    def end_loop(self, info: StepInfo) -> None:
        """The last step (before its checkpoint's background write is waited for)."""
        self.loop_end, self.loop_cpu = self.clock(), (self.loop_cpu[0], self.cpu_clock())

    def exclude(self, info: StepInfo) -> None:
        """Eval and checkpoint steps: restart the mark so that their time is not step time."""
        self.mark_time, self.mark_step = self.clock(), info.step

    def summary(self, steps_after_first: int) -> dict[str, float]:
        """``tokens_per_second``, ``step_time_s``, ``mfu``, ``loop_tokens_per_second``,
        ``loop_tokens_per_cpu_second``, ``compile_and_first_step_s``: those measured."""
        out: dict[str, float] = {}
        if self.timed_steps:
            out["tokens_per_second"] = self.tokens_per_step * self.timed_steps / self.timed_s
            out["step_time_s"] = self.timed_s / self.timed_steps
            mfu = self.mfu(out["tokens_per_second"])
            if mfu is not None:
                out["mfu"] = mfu
        if self.loop_start is not None and self.loop_end is not None and self.loop_end > self.loop_start:
            tokens = self.tokens_per_step * steps_after_first
            out["loop_tokens_per_second"] = tokens / (self.loop_end - self.loop_start)
            # the same steps per CPU second of this process (all threads): insensitive to other load
            out["loop_tokens_per_cpu_second"] = tokens / max(self.loop_cpu[1] - self.loop_cpu[0], 1e-9)
        if self.first_step_s is not None:
            out["compile_and_first_step_s"] = self.first_step_s
        return out


def host_stats(to_host: Callable[[Any], float]) -> Hook:
    """Logging steps: start the metrics line with the step's stats on the host (a device sync)."""

    def record_stats(info: StepInfo) -> None:
        info.record = {k: to_host(v) for k, v in info.stats.items()} | {"step": info.step}

    return record_stats


@dataclass
class DeviceMemory:
    """Logging steps: ``memory_bytes`` and ``peak_memory_bytes`` into the line; keeps the peak."""

    read: Callable[[], dict[str, float]]
    peak: float = 0.0

    def __call__(self, info: StepInfo) -> None:
        memory = self.read()
        self.peak = max(self.peak, memory["peak_memory_bytes"])
        assert info.record is not None, "DeviceMemory runs after the hook that starts the line"
        info.record |= {"memory_bytes": memory["memory_bytes"], "peak_memory_bytes": memory["peak_memory_bytes"]}


@dataclass
class Evaluation:
    """Eval steps: held-out losses of the current parameters into the line; keeps the latest."""

    evaluate: Callable[[Any], dict[str, float]]
    last: dict[str, float] = field(default_factory=dict)

    def __call__(self, info: StepInfo) -> None:
        self.last = self.evaluate(info.state["params"])
        if info.record is not None:
            info.record.update(self.last)


def write_line(file: TextIO, dumps: Callable[[dict[str, Any]], str]) -> Hook:
    """Logging steps: append the metrics line to ``file`` (``metrics.jsonl``) and flush it."""

    def write_metrics(info: StepInfo) -> None:
        file.write(dumps(info.record) + "\n")
        file.flush()

    return write_metrics


def eta(seconds: float) -> str:
    """``H:MM:SS`` of a non-negative duration (negative: 0)."""
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def progress(steps: int, out: Callable[..., None] = print) -> Hook:
    """Logging steps: one line ``step N/steps loss .. lr .. tok/s ms/step [mfu] eta [evals]``."""

    def print_progress(info: StepInfo) -> None:
        record = info.record
        assert record is not None, "progress runs after the hooks that fill the line"
        step_s = record["step_time_s"]
        mfu = record.get("mfu")
        util = f" mfu {mfu:.1%}" if mfu is not None else ""
        evals = " ".join(f"{k} {v:.4f}" for k, v in record.items() if k.startswith("eval_"))
        out(f"step {info.step}/{steps} loss {record['loss']:.4f} lr {record['lr']:.2e} "
            f"{record['tokens_per_second']:,.0f} tok/s {step_s * 1e3:.1f} ms/step{util} "
            f"eta {eta(step_s * (steps - info.step))} {evals}".rstrip(), flush=True)

    return print_progress


def checkpoint(save: Callable[[int, Any], None]) -> Hook:
    """Checkpoint steps: save the state (in the background; the Checkpointer waits later)."""

    def save_checkpoint(info: StepInfo) -> None:
        save(info.step, info.state)
        info.saved = True

    return save_checkpoint


def preemption(agreed: Callable[[bool], bool], save: Callable[[int, Any], None], wait: Callable[[], Any],
               out: Callable[..., None] = print) -> Hook:
    """Every step but the last: on an agreed SIGTERM, checkpoint this step and raise Preempted.

    ``agreed(sync_point)`` (:meth:`tidal.train.preemption.SigtermFlag.agreed`) is asked with
    ``sync_point`` True on steps that already synchronised the processes (logged or saved).
    """
    from tidal.train.preemption import EXIT_PREEMPTED, Preempted

    def stop_on_sigterm(info: StepInfo) -> None:
        if info.last or not agreed(info.record is not None or info.saved):
            return
        if not info.saved:
            save(info.step, info.state)
        wait()
        out(f"SIGTERM: checkpoint of step {info.step} saved; exiting with code {EXIT_PREEMPTED}", flush=True)
        raise Preempted(info.step)

    return stop_on_sigterm


def stop_after(step: int, wait: Callable[[], Any], out: Callable[..., None] = print) -> Hook:
    """Testing aid (``--stop-after``): after ``step`` (and its checkpoint), raise StopTraining."""

    def stop(info: StepInfo) -> None:
        if info.step == step:
            wait()
            out(f"stopped after step {info.step} (--stop-after)", flush=True)
            raise StopTraining(info.step)

    return stop
