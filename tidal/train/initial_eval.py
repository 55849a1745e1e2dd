"""Step 0 of a fresh training start: every eval set evaluated on the initial parameters, before any
update, so each eval curve (in MLflow, ``metrics.jsonl`` and ``tidal report``'s first -> last) starts
where training starts."""

from __future__ import annotations

import json
from typing import Any

from tidal.train import hooks as hooklib
from tidal.train.build import evaluate

__all__ = ["evaluate_initial"]


def evaluate_initial(session: Any, meters: Any, metrics_file: Any) -> dict[str, float]:
    """Step 0 of a fresh start: every eval set's loss (and bits per byte) of the initial parameters,
    before any update, as the metrics line ``{"step": 0, "eval_loss/<set>": ...}`` (written, sent to
    MLflow at step 0 and printed by process 0), so each eval curve starts where training starts.
    Its time counts as ``eval`` badput and not as the first step's. Returns the evaluation."""
    with session.goodput.timing("eval"):
        values = evaluate(session.run, session.state["params"])
    meters.throughput.exclude(hooklib.StepInfo(0, session.state, {}, last=False))
    if session.primary:
        record = {"step": 0, **values}
        if metrics_file is not None:
            metrics_file.write(json.dumps(record, sort_keys=True) + "\n")
            metrics_file.flush()
        if session.live is not None:
            session.live.log(0, record)
        evals = " ".join(f"{k} {v:.4f}" for k, v in values.items())
        print(f"step 0/{session.run.cfg.steps} (before any update) {evals}".rstrip(), flush=True)
    return values
