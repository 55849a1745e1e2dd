"""Goodput: the arithmetic on a fake clock, and a real run's summary accounting for its wall time."""

from __future__ import annotations

import json

import pytest
from test_train_e2e import CONFIG, build_inputs, make_ctx

import tidal.train
from tidal.train.goodput import CAUSES, Goodput


def test_badput_by_cause_and_goodput_on_a_fake_clock():
    now = [100.0]
    goodput = Goodput(clock=lambda: now[0])
    with goodput.timing("startup"):
        now[0] += 3.0
    with goodput.timing("restore"):
        now[0] += 1.0
    slow_save = goodput.timed("checkpoint", lambda: now.__setitem__(0, now[0] + 0.5))
    slow_save()
    now[0] += 10.5  # the loop: 10 steps of 0.5 s after a 5 s first (compiling) step
    out = goodput.summary(steps_run=11, step_time_s=0.5, first_step_s=5.0)
    assert out["goodput_wall_s"] == 15.0 and out["goodput_productive_s"] == 5.5
    assert out["goodput"] == pytest.approx(5.5 / 15.0)
    assert out["badput_s/startup"] == 3.0 and out["badput_s/restore"] == 1.0 and out["badput_s/checkpoint"] == 0.5
    assert out["badput_s/compile"] == 4.5 and out["badput_s/data_wait"] == 0.0
    assert out["badput_s/other"] == pytest.approx(15.0 - 5.5 - 3.0 - 1.0 - 0.5 - 4.5)
    assert Goodput().summary(steps_run=1, step_time_s=None, first_step_s=2.0) == {}  # nothing timed


def test_a_real_run_reports_where_its_wall_time_went(tmp_path):
    inputs = build_inputs(tmp_path / "inputs")
    ctx = make_ctx(tmp_path / "run", inputs, dict(CONFIG, steps=20, checkpoint_every=5, eval_every=10, log_every=5))
    summary = tidal.train.run(ctx)
    assert 0 < summary["goodput"] < 1
    parts = summary["goodput_productive_s"] + sum(summary[f"badput_s/{c}"] for c in (*CAUSES, "other"))
    # every second accounted for about once (productive is steps x the mean step time, an estimate)
    assert parts == pytest.approx(summary["goodput_wall_s"], rel=0.03) and summary["badput_s/other"] >= 0
    assert summary["badput_s/startup"] > 0 and summary["badput_s/compile"] > 0 and summary["badput_s/eval"] > 0
    written = json.loads((ctx.out_dir / "summary.json").read_text())
    assert written["goodput"] == summary["goodput"]
