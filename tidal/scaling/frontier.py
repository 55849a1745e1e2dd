"""The compute frontier ``L*(C) = L∞ + A_C · C^(-α_C)``.

Fitted through the per-budget best losses L*(C) of approach 2 (:mod:`tidal.scaling.approach2`),
least squares on log loss.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from scipy import optimize

from tidal.scaling.runs import ScalingFitError


def fit_frontier(c: np.ndarray, loss: np.ndarray) -> dict[str, float]:
    """``L(C) = L∞ + A·C^(-α)`` by least squares on log loss from a small grid of starts.

    Args:
        c: budgets (FLOPs), shape ``[k]``, k >= 3; loss: best loss per budget.

    Returns:
        ``{"L_inf", "A", "alpha"}`` (A in loss·FLOPs^α).

    Raises:
        ScalingFitError: fewer than three budgets.
    """
    if len(c) < 3:
        raise ScalingFitError(f"frontier L(C) = L_inf + A C^-alpha needs >= 3 usable budgets, got {len(c)}")
    c_ref = float(np.exp(np.mean(np.log(c))))
    x = np.log(c / c_ref)
    target = np.log(loss)

    def resid(p):
        linf, loga, alpha = p
        return np.log(linf + np.exp(loga - alpha * x)) - target

    best = None
    lmin = float(np.min(loss))
    for frac, alpha in itertools.product((0.0, 0.5, 0.8, 0.95), (0.05, 0.2, 0.5, 1.0)):
        linf = frac * lmin
        start = [linf, math.log(max(lmin - linf, 1e-6 * lmin)), alpha]
        res = optimize.least_squares(resid, start, bounds=([0.0, -50.0, 1e-4], [lmin, 50.0, 5.0]))
        if best is None or res.cost < best.cost:
            best = res
    linf, loga, alpha = best.x
    return {"L_inf": float(linf), "A": float(math.exp(loga) * c_ref ** alpha), "alpha": float(alpha)}


def frontier_loss(params: dict[str, float], c: np.ndarray | float) -> np.ndarray:
    """``L∞ + A·C^(-α)`` at FLOPs ``c``."""
    return params["L_inf"] + params["A"] * np.asarray(c, dtype=float) ** (-params["alpha"])
