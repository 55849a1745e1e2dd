"""Training-loop hooks (tidal/train/hooks.py): intervals, order, exceptions, and each trainer hook
alone on a fake StepInfo (no JAX, no model)."""

from __future__ import annotations

import io
import json

import pytest

from tidal.train import hooks as hooklib
from tidal.train.hooks import Hooks, StepInfo, StopTraining
from tidal.train.preemption import Preempted


def fired(last_step: int, **intervals) -> dict[str, list[int]]:
    """Steps after which each named hook ran, over steps 1..last_step."""
    seen: dict[str, list[int]] = {name: [] for name in intervals}
    hooks = Hooks(last_step)
    for name, every in intervals.items():
        hooks.add(lambda info, name=name: seen[name].append(info.step), every=every, name=name)
    for step in range(1, last_step + 1):
        hooks.run(step, state=None, stats={})
    return seen


def test_intervals_fire_on_multiples_and_on_the_last_step():
    got = fired(10, each=1, third=3, fourth=4, never=100, both=(3, 4))
    assert got["each"] == list(range(1, 11))
    assert got["third"] == [3, 6, 9, 10]  # 10 is the last step
    assert got["fourth"] == [4, 8, 10]
    assert got["never"] == [10]  # an interval past the run still fires after the last step
    assert got["both"] == [3, 4, 6, 8, 9, 10]


def test_a_resumed_run_fires_at_the_same_steps():
    hooks, seen = Hooks(12), []
    hooks.add(lambda info: seen.append(info.step), every=5)
    for step in range(7, 13):  # resumed after step 6
        hooks.run(step, None, {})
    assert seen == [10, 12]


def test_order_is_registration_order_every_step():
    order = []
    hooks = Hooks(4)
    for name in ("c", "a", "b"):
        hooks.add(lambda info, name=name: order.append((info.step, name)), every=2, name=name)
    assert hooks.names == ["c", "a", "b"]
    for step in range(1, 5):
        hooks.run(step, None, {})
    assert order == [(2, "c"), (2, "a"), (2, "b"), (4, "c"), (4, "a"), (4, "b")]


def test_a_hooks_exception_propagates_and_later_hooks_do_not_run():
    later = []
    hooks = Hooks(5)

    def boom(info: StepInfo) -> None:
        if info.step == 3:
            raise RuntimeError("disk full")

    hooks.add(boom)
    hooks.add(lambda info: later.append(info.step))
    with pytest.raises(RuntimeError, match="disk full"):
        for step in range(1, 6):
            hooks.run(step, None, {})
    assert later == [1, 2]


@pytest.mark.parametrize("every", [0, -1, True, 2.0, ()])
def test_bad_intervals_are_refused(every):
    with pytest.raises(ValueError, match="every must be positive ints"):
        Hooks(3).add(lambda info: None, every=every)


def test_hooks_share_one_step_info():
    hooks = Hooks(2)
    hooks.add(lambda info: setattr(info, "record", {"loss": 1.0}))
    hooks.add(lambda info: info.record.update(step=info.step))
    info = hooks.run(1, state={"params": 0}, stats={"loss": 1})
    assert info.record == {"loss": 1.0, "step": 1} and not info.last and hooks.run(2, None, {}).last


# --- the trainer's hooks, alone ---------------------------------------------------------------


class Clock:
    def __init__(self, *times: float):
        self.times = list(times)

    def __call__(self) -> float:
        return self.times.pop(0)


def test_throughput_excludes_the_first_step_evals_and_saves():
    clock = Clock(0.0, 10.0, 14.0, 15.0, 17.0, 18.0)
    meter = hooklib.Throughput(tokens_per_step=100, start_step=0, mfu=lambda tps: tps / 1000, clock=clock,
                               cpu_clock=Clock(1.0, 5.0))
    first = StepInfo(1, None, {"loss": 0.0}, last=False, record={})
    meter.first_step(first)  # t=10: 10 s of compilation and step 1
    meter.measure(first)  # t=14, but step 1 is the compiling step: its step time is the first step's
    assert meter.first_step_s == 10.0 and first.record["step_time_s"] == 10.0 and meter.timed_steps == 0
    meter.exclude(first)  # t=15: an eval or save on step 1 is not step time
    third = StepInfo(3, None, {"loss": 0.0}, last=True, record={})
    meter.first_step(third)  # not the first any more: no clock read
    meter.measure(third)  # t=17: steps 2..3 took 2 s
    assert third.record == {"tokens_per_second": 100.0, "step_time_s": 1.0, "mfu": 0.1}
    meter.end_loop(third)  # t=18
    assert meter.summary(steps_after_first=2) == {
        "tokens_per_second": 100.0, "step_time_s": 1.0, "mfu": 0.1, "loop_tokens_per_second": 200 / 8,
        "loop_tokens_per_cpu_second": 200 / 4, "compile_and_first_step_s": 10.0}


def test_stats_memory_eval_line_and_progress_fill_and_print_one_line():
    info = StepInfo(4, {"params": "P"}, {"loss": 2.5, "lr": 1e-3}, last=False)
    hooklib.host_stats(float)(info)
    info.record |= {"tokens_per_second": 1234.0, "step_time_s": 0.5}
    memory = hooklib.DeviceMemory(lambda: {"memory_bytes": 10.0, "peak_memory_bytes": 20.0})
    memory(info)
    evaluation = hooklib.Evaluation(lambda params: {"eval_loss/udhr": 3.0, "eval_bpb/udhr": 1.5})
    evaluation(info)
    assert evaluation.last == {"eval_loss/udhr": 3.0, "eval_bpb/udhr": 1.5} and memory.peak == 20.0
    out = io.StringIO()
    hooklib.write_line(out, lambda r: json.dumps(r, sort_keys=True))(info)
    assert json.loads(out.getvalue()) == {"loss": 2.5, "lr": 1e-3, "step": 4, "tokens_per_second": 1234.0,
                                          "step_time_s": 0.5, "memory_bytes": 10.0, "peak_memory_bytes": 20.0,
                                          "eval_loss/udhr": 3.0, "eval_bpb/udhr": 1.5}
    lines = []
    hooklib.progress(10, out=lambda line, flush: lines.append(line))(info)
    assert lines == [("step 4/10 loss 2.5000 lr 1.00e-03 1,234 tok/s 500.0 ms/step eta 0:00:03 "
                      "eval_loss/udhr 3.0000 eval_bpb/udhr 1.5000")]


def test_checkpoint_preemption_and_stop_after():
    saves, waits, printed = [], [], []
    save = lambda step, state: saves.append(step)
    wait = lambda: waits.append(True)
    out = lambda line, flush: printed.append(line)
    sigterm = []
    preempt = hooklib.preemption(lambda sync: sigterm.append(sync) or len(sigterm) >= 2, save, wait, out)

    saved = StepInfo(5, "S", {}, last=False)
    hooklib.checkpoint(save)(saved)
    preempt(saved)  # no SIGTERM yet; a saved step is a sync point
    assert saved.saved and saves == [5] and sigterm == [True]
    preempt(StepInfo(9, "S", {}, last=True))  # never on the last step: it checkpoints anyway
    with pytest.raises(Preempted) as err:
        preempt(StepInfo(6, "S", {}, last=False))
    assert err.value.step == 6 and saves == [5, 6] and waits == [True] and sigterm == [True, False]
    assert printed == ["SIGTERM: checkpoint of step 6 saved; exiting with code 75"]

    stop = hooklib.stop_after(7, wait, out)
    stop(StepInfo(6, "S", {}, last=False))
    with pytest.raises(StopTraining):
        stop(StepInfo(7, "S", {}, last=False))
    assert printed[-1] == "stopped after step 7 (--stop-after)"


def test_eta():
    assert hooklib.eta(3725.9) == "1:02:05" and hooklib.eta(-3) == "0:00:00"
