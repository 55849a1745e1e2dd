"""A decay branch's evals on its trunk's MLflow eval curve (``train.decay_branches``, issue 41).

Marin and Delphi read cooldowns as points beside the trunk's curve: the loss the model reaches if training
decays from here. So once a branch planned with its trunk has run, its final held-out evals go into the trunk's
eval-curve run (:func:`tidal.tracking.curves.log_eval_curve`, the run that holds the trunk's downstream evals
per checkpoint) as ``decayed/<metric>`` at the branch's last step: one series, one point per branch.
"""

from __future__ import annotations

from typing import Any

from tidal.steps import Step
from tidal.train.config import CONTINUE_INPUT

PREFIX = "decayed/"
EVAL_KEYS = ("eval_loss", "eval_bpb/")  # the summary's mean eval loss, eval_loss/<set>, eval_bpb/<set>


def branch_curve(step: Step, summary: dict[str, Any]) -> tuple[str, list[dict[str, Any]]] | None:
    """``(trunk step id, rows)`` for :meth:`tidal.tracking.tracker.Tracker.log_eval_curve`, or None when
    ``step`` is not a decay branch planned with its trunk (a committed parent is not on this curve: it may be
    another recipe's run) or its summary holds no eval.

    Rows: ``[{"step": the branch's steps, "decayed/<key>": value, ...}]`` for every numeric summary key that
    starts with ``eval_loss`` or ``eval_bpb/`` (nats/token, bits/byte).
    """
    ref = step.config.get("continue_from") if step.kind == "train" else None
    if not ref or ref.get("schedule") != "decay" or ref.get("input", CONTINUE_INPUT) == CONTINUE_INPUT:
        return None
    row = {f"{PREFIX}{k}": float(v) for k, v in sorted(summary.items())
           if k.startswith(EVAL_KEYS) and isinstance(v, (int, float)) and not isinstance(v, bool)}
    if not row:
        return None
    return ref["step"], [{"step": int(step.config["steps"]), **row}]
