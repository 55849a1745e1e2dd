"""The training run's picture: ``loss_curve.png``, train loss and every eval curve against step.

Drawn by process 0 from ``metrics.jsonl`` at the end of training, before ``summary.json`` (so a
finished step always has it), and committed with the step. Only losses are drawn (they are a
function of the recipe: same recipe, same bytes, :func:`tidal.plots.save_png`), never timings.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tidal.plots import pyplot, save_png

LOSS_CURVE = "loss_curve.png"
EVAL_PREFIX = "eval_loss/"


def loss_series(rows: list[dict[str, Any]]) -> dict[str, tuple[list[int], list[float]]]:
    """``{"train": (steps, losses), "eval_loss/<src>": (steps, losses) ...}`` from metric rows
    (``{"step", "loss", "eval_loss/<src>" ...}``); a row without a key adds no point to it. Sorted
    by step; a step logged twice (a run resumed after a divergence rewind) keeps its last row."""
    by_step = {int(row["step"]): row for row in rows if "step" in row}
    series: dict[str, tuple[list[int], list[float]]] = {}
    for step in sorted(by_step):
        row = by_step[step]
        for key, name in [("loss", "train")] + [(k, k) for k in sorted(row) if k.startswith(EVAL_PREFIX)]:
            value = row.get(key)
            if isinstance(value, (int, float)):
                steps, values = series.setdefault(name, ([], []))
                steps.append(step)
                values.append(float(value))
    return series


def write_loss_curve(metrics_path: str | Path, out: str | Path) -> Path | None:
    """Draw train loss (nats/token) and each ``eval_loss/<src>`` against step into ``out`` (PNG).

    Returns:
        ``out``, or None when ``metrics_path`` holds no loss (nothing to draw; no file written).
    """
    path = Path(metrics_path)
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    series = loss_series(rows)
    if not series:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, (steps, values) in series.items():
        style = {"linewidth": 1.2} if name == "train" else {"marker": "o", "markersize": 3, "linewidth": 1.5}
        ax.plot(steps, values, label=name.removeprefix(EVAL_PREFIX) + (" (eval)" if name != "train" else ""),
                **style)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title("training and held-out loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_png(fig, out)
