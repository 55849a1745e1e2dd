"""Approach 2: per-budget isoFLOP parabolas and the power laws N*(C), D*(C).

Hoffmann et al. 2022, "Training Compute-Optimal Large Language Models", §3.2: per budget, a
robust parabola of loss in log N (and separately in log D); its vertex gives N*(C), D*(C) and
the best loss L*(C) of that budget; then ``N* = k_N C^a`` and ``D* = k_D C^b`` by least squares
in log-log space. The best losses feed the frontier (:mod:`tidal.scaling.frontier`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from tidal.scaling.frontier import fit_frontier
from tidal.scaling.runs import Runs, ScalingFitError

MIN_SIZES_PER_BUDGET = 3


@dataclass
class IsoFlop:
    """One budget's robust parabola ``loss = p2 u² + p1 u + p0`` with ``u = log(x)``.

    ``x_opt`` is the vertex (N* or D*), ``loss_opt`` the loss there; ``flag`` is empty when the
    fit is usable, else the reason (too few sizes, non-convex, vertex outside the sizes).
    """

    budget: float
    coef: tuple[float, float, float]
    x_opt: float
    loss_opt: float
    x_range: tuple[float, float]
    n_sizes: int
    flag: str = ""


def fit_parabola(x: np.ndarray, loss: np.ndarray, budget: float) -> IsoFlop:
    """Robust parabola of ``loss`` in ``log x`` for one budget (Huber IRLS, scale 1 % of the
    median loss, so a single outlying run cannot bend it; exact through three sizes).

    Never raises for bad shapes: returns a flagged :class:`IsoFlop` instead.
    """
    u = np.log(x)
    distinct = np.unique(u)
    lo, hi = float(np.exp(distinct[0])), float(np.exp(distinct[-1]))
    if len(distinct) < MIN_SIZES_PER_BUDGET:
        return IsoFlop(budget, (math.nan,) * 3, math.nan, math.nan, (lo, hi), len(distinct),
                       f"fewer than {MIN_SIZES_PER_BUDGET} distinct sizes ({len(distinct)})")
    center = float(np.mean(distinct))
    v = u - center
    design = np.stack([v * v, v, np.ones_like(v)], axis=1)
    p = np.linalg.lstsq(design, loss, rcond=None)[0]
    if len(distinct) > MIN_SIZES_PER_BUDGET:
        # Huber M-estimate by iteratively reweighted least squares (Huber 1964; Holland &
        # Welsch 1977), scale 1 % of the median loss: one outlying run cannot bend the curve.
        scale = 0.01 * float(np.median(loss))
        for _ in range(50):
            r = np.abs(design @ p - loss)
            w = np.sqrt(np.where(r <= scale, 1.0, scale / np.maximum(r, 1e-300)))
            new = np.linalg.lstsq(design * w[:, None], loss * w, rcond=None)[0]
            if np.allclose(new, p, rtol=1e-10, atol=1e-12):
                p = new
                break
            p = new
    p2, p1, p0 = (float(t) for t in p)
    # back to coefficients in u = log x (not centered)
    coef = (p2, p1 - 2 * p2 * center, p2 * center * center - p1 * center + p0)
    if not p2 > 0:
        return IsoFlop(budget, coef, math.nan, math.nan, (lo, hi), len(distinct),
                       f"non-convex isoFLOP curve (curvature {p2:.3g} <= 0)")
    v_opt = -p1 / (2 * p2)
    with np.errstate(over="ignore"):  # a nearly flat parabola: the vertex is far away (flagged below)
        x_opt = float(np.exp(v_opt + center))
    loss_opt = float(p0 - p1 * p1 / (4 * p2))
    flag = ""
    if not distinct[0] <= v_opt + center <= distinct[-1]:
        flag = f"minimum {x_opt:.4g} outside the sampled sizes [{lo:.4g}, {hi:.4g}]"
    return IsoFlop(budget, coef, x_opt, loss_opt, (lo, hi), len(distinct), flag)


def power_law(c: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least squares ``log y = log k + a log c``; returns ``(k, a)``. Needs >= 2 points."""
    a, logk = np.polyfit(np.log(c), np.log(y), 1)
    return float(np.exp(logk)), float(a)


@dataclass
class Approach2:
    """Approach-2 result: per-budget parabolas in log N and log D, power laws, frontier."""

    iso_n: list[IsoFlop]
    iso_d: list[IsoFlop]
    n_law: tuple[float, float]       # (k_N, a): N* = k_N C^a
    d_law: tuple[float, float]       # (k_D, b): D* = k_D C^b
    frontier: dict[str, float] | None
    used_budgets: list[float]
    flags: list[str] = field(default_factory=list)


def fit_approach2(runs: Runs, *, need_frontier: bool = True) -> Approach2:
    """Approach 2 over every budget of ``runs``.

    A budget is used for the power laws and the frontier only when both its parabolas are
    unflagged. Raises :class:`ScalingFitError` when fewer than two budgets are usable (or fewer
    than three with ``need_frontier``), naming each budget's flag.
    """
    iso_n, iso_d, used, flags = [], [], [], []
    for budget in runs.budgets:
        sel = runs.budget == budget
        pn = fit_parabola(runs.n[sel], runs.loss[sel], float(budget))
        pd = fit_parabola(runs.d[sel], runs.loss[sel], float(budget))
        iso_n.append(pn)
        iso_d.append(pd)
        problems = [f"{tag}: {p.flag}" for tag, p in (("log N", pn), ("log D", pd)) if p.flag]
        if problems:
            flags.append(f"budget {budget:.3g}: " + "; ".join(problems))
        else:
            used.append(float(budget))
    minimum = 3 if need_frontier else 2
    if len(used) < minimum:
        raise ScalingFitError(f"approach 2 needs >= {minimum} usable budgets, got {len(used)}: "
                              + ("; ".join(flags) or "too few budgets"))
    ok = [i for i, p in enumerate(iso_n) if p.budget in used]
    cs = np.array([iso_n[i].budget for i in ok])
    n_law = power_law(cs, np.array([iso_n[i].x_opt for i in ok]))
    d_law = power_law(cs, np.array([iso_d[i].x_opt for i in ok]))
    frontier = fit_frontier(cs, np.array([iso_n[i].loss_opt for i in ok])) if len(ok) >= 3 else None
    if len(ok) == 2:
        flags.append("power laws through exactly 2 budgets: no residual degrees of freedom")
    if len(ok) == 3 and frontier is not None:
        flags.append("frontier through exactly 3 budgets: 3 parameters, no residual degrees of freedom")
    return Approach2(iso_n, iso_d, n_law, d_law, frontier, used, flags)
