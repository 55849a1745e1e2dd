"""A decay branch's evals on its trunk's MLflow eval curve (``train.decay_branches``, issue 41).

Marin and Delphi read cooldowns as points beside the trunk's curve: the loss the model reaches if training
decays from here. So once a branch planned with its trunk has run, its final held-out evals go into the trunk's
eval-curve run (:func:`tidal.tracking.curves.log_eval_curve`, the run that holds the trunk's downstream evals
per checkpoint) as ``decayed/<metric>`` at the branch's last step: one series, one point per branch; and once
the branch's downstream ``eval`` step has run, its ``<task>/<metric>`` values as ``decayed/<task>/<metric>``.
"""

from __future__ import annotations

from typing import Any

from tidal.steps import Step
from tidal.train.config import CONTINUE_INPUT

PREFIX = "decayed/"
EVAL_KEYS = ("eval_loss", "eval_bpb/")  # the summary's mean eval loss, eval_loss/<set>, eval_bpb/<set>


def _branch(step: Step) -> dict[str, Any] | None:
    """``continue_from`` of a decay branch planned with its trunk, else None (a committed parent is not on this
    curve: it may be another recipe's run)."""
    ref = step.config.get("continue_from") if step.kind == "train" else None
    if not ref or ref.get("schedule") != "decay" or ref.get("input", CONTINUE_INPUT) == CONTINUE_INPUT:
        return None
    return ref


def _numbers(summary: dict[str, Any], keep: Any) -> dict[str, float]:
    return {f"{PREFIX}{k}": float(v) for k, v in sorted(summary.items())
            if keep(k) and isinstance(v, (int, float)) and not isinstance(v, bool)}


def branch_curve(graph: Any, step: Step, summary: dict[str, Any]) -> tuple[str, list[dict[str, Any]]] | None:
    """``(trunk step id, rows)`` for :meth:`tidal.tracking.tracker.Tracker.log_eval_curve`, or None when
    ``step`` is neither a decay branch planned with its trunk nor the downstream eval step of one, or its
    summary holds no eval.

    Rows: ``[{"step": the branch's steps, "decayed/<key>": value, ...}]``: a branch's numeric summary keys that
    start with ``eval_loss`` or ``eval_bpb/`` (nats/token, bits/byte); its eval step's ``<task>/<metric>``
    (lm-eval's), timings left out.
    """
    if step.kind == "eval":
        try:
            branch = graph[step.config["train"]]
        except KeyError:
            return None
        ref, row = _branch(branch), _numbers(summary, lambda k: "/" in k and not k.startswith("eval_seconds/"))
    else:
        branch, ref, row = step, _branch(step), _numbers(summary, lambda k: k.startswith(EVAL_KEYS))
    if ref is None or not row:
        return None
    return ref["step"], [{"step": int(branch.config["steps"]), **row}]
