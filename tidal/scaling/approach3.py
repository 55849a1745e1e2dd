"""Approach 3: the parametric law ``L(N, D) = E + A/N^α + B/D^β``.

Hoffmann et al. 2022, §3.3 and Appendix D.2; the replication of Besiroglu et al. 2024,
"Chinchilla Scaling: A replication attempt". Parametrized as
``log L = LSE(a - α log N, b - β log D, e)`` with ``A = e^a, B = e^b, E = e^e``; the Huber
loss (δ = 1e-3) of ``log L̂ - log L`` is **summed** over runs (Besiroglu et al. traced
Chinchilla's implausibly narrow intervals to an averaged objective on which L-BFGS stopped
early) and minimized by L-BFGS-B from the best points of Hoffmann's grid of starts
(α, β ∈ {0, .5, …, 2}, e ∈ {-1, -.5, …, 1}, a, b ∈ {0, 5, …, 25}).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import optimize

from tidal.scaling.runs import Runs, ScalingFitError

HUBER_DELTA = 1e-3
# Hoffmann et al. 2022, Appendix D.2: grid of initialisations for L-BFGS.
GRID_ALPHA = GRID_BETA = np.arange(0.0, 2.01, 0.5)
GRID_E = np.arange(-1.0, 1.01, 0.5)
GRID_A = GRID_B = np.arange(0.0, 25.01, 5.0)
GRID_STARTS_MAIN = 20          # L-BFGS runs from the best grid points (main fit)
GRID_STARTS_BOOT = 1           # ... and per bootstrap replicate (plus the main optimum)
BOUNDS3 = [(-20.0, 60.0), (-20.0, 60.0), (-20.0, 5.0), (0.0, 5.0), (0.0, 5.0)]  # a, b, e, α, β
# Plausibility of a fitted law (see :func:`degeneracy_flags`). Published language-model fits
# have α, β in about 0.07 … 0.8 (Kaplan et al. 2020: α_N = 0.076, α_D = 0.095; Hoffmann et al.
# 2022: 0.34, 0.28; Besiroglu et al. 2024: 0.35, 0.37); outside 0.05 … 1.5 one term has
# collapsed onto the other (e.g. α ≈ 0: loss independent of N; β ≈ 2: a D-only fit).
PLAUSIBLE_EXPONENTS = (0.05, 1.5)
# The irreducible loss E is the entropy of text, well above zero nats: a fitted E below this
# fraction of the smallest observed loss means the fit traded E for a steep power law.
MIN_E_FRACTION = 0.05


def _huber_objective(theta: np.ndarray, x: np.ndarray, y: np.ndarray, logl: np.ndarray,
                     delta: float) -> tuple[float, np.ndarray]:
    """Summed Huber loss of ``LSE(a - α x, b - β y, e) - log L`` and its gradient."""
    a, b, e, alpha, beta = theta
    t = np.stack([a - alpha * x, b - beta * y, np.full_like(x, e)])
    tmax = t.max(axis=0)
    w = np.exp(t - tmax)
    total = w.sum(axis=0)
    lse = tmax + np.log(total)
    w /= total
    r = lse - logl
    absr = np.abs(r)
    value = float(np.sum(np.where(absr <= delta, 0.5 * r * r, delta * (absr - 0.5 * delta))))
    g = np.clip(r, -delta, delta)
    grad = np.array([np.sum(g * w[0]), np.sum(g * w[1]), np.sum(g * w[2]),
                     -np.sum(g * w[0] * x), -np.sum(g * w[1] * y)])
    return value, grad


def _grid() -> np.ndarray:
    """Hoffmann et al.'s 4,500 starting points as rows (a, b, e, α, β)."""
    mesh = np.meshgrid(GRID_A, GRID_B, GRID_E, GRID_ALPHA, GRID_BETA, indexing="ij")
    return np.stack([m.ravel() for m in mesh], axis=1)


_GRID = _grid()


def _grid_values(x: np.ndarray, y: np.ndarray, logl: np.ndarray, delta: float) -> np.ndarray:
    g = _GRID
    t1 = g[:, 0:1] - g[:, 3:4] * x[None, :]
    t2 = g[:, 1:2] - g[:, 4:5] * y[None, :]
    t3 = np.broadcast_to(g[:, 2:3], t1.shape)
    lse = np.logaddexp(np.logaddexp(t1, t2), t3)
    r = np.abs(lse - logl[None, :])
    return np.sum(np.where(r <= delta, 0.5 * r * r, delta * (r - 0.5 * delta)), axis=1)


def fit_approach3(runs: Runs, *, starts: int = GRID_STARTS_MAIN, extra_start: np.ndarray | None = None,
                  delta: float = HUBER_DELTA) -> dict[str, Any]:
    """Fit ``L(N, D) = E + A/N^α + B/D^β`` (Huber δ on log loss, summed; L-BFGS-B).

    Args:
        runs: at least 5 runs (5 parameters).
        starts: how many of the best grid points to start L-BFGS-B from.
        extra_start: another start ``(a, b, e, α, β)`` (e.g. the full-data optimum).

    Returns:
        ``{"E", "A", "B", "alpha", "beta", "theta": [a, b, e, α, β], "objective",
        "converged", "flags": [...]}``; a parameter on its bound is flagged.

    Raises:
        ScalingFitError: fewer than 5 runs.
    """
    if len(runs.n) < 5:
        raise ScalingFitError(f"approach 3 fits 5 parameters and needs >= 5 runs, got {len(runs.n)}")
    x, y, logl = np.log(runs.n), np.log(runs.d), np.log(runs.loss)
    values = _grid_values(x, y, logl, delta)
    order = np.argsort(values, kind="stable")[:starts]
    candidates = [_GRID[i] for i in order]
    if extra_start is not None:
        candidates.insert(0, np.asarray(extra_start, dtype=float))
    best = None
    for start in candidates:
        res = optimize.minimize(_huber_objective, start, args=(x, y, logl, delta), jac=True,
                                method="L-BFGS-B", bounds=BOUNDS3,
                                options={"maxiter": 5000, "ftol": 1e-15, "gtol": 1e-12, "maxcor": 20})
        if best is None or res.fun < best.fun:
            best = res
    a, b, e, alpha, beta = (float(t) for t in best.x)
    out = {"E": math.exp(e), "A": math.exp(a), "B": math.exp(b), "alpha": alpha, "beta": beta,
           "theta": [a, b, e, alpha, beta], "objective": float(best.fun),
           "converged": bool(best.success)}
    flags = degeneracy_flags(out, float(np.min(runs.loss)))
    return {**out, "flags": flags, "degenerate": bool(flags)}


def degeneracy_flags(params: dict[str, Any], min_loss: float) -> list[str]:
    """Why a fitted ``{E, A, B, alpha, beta, theta}`` is not a usable scaling law (empty: usable).

    Flags (each names the parameter and the rule): a parameter of ``theta`` on its L-BFGS-B
    bound (:data:`BOUNDS3`); α or β outside :data:`PLAUSIBLE_EXPONENTS`; E below
    :data:`MIN_E_FRACTION` of ``min_loss`` (the smallest observed loss). A fit with any flag is
    *degenerate*: it may still interpolate the runs, but its N/D trade-off and forecasts are
    not meaningful.
    """
    flags = []
    theta = params.get("theta")
    if theta is not None:
        for name, value, (low, high) in zip(("log A", "log B", "log E", "alpha", "beta"), theta, BOUNDS3,
                                            strict=True):
            if value <= low + 1e-6 or value >= high - 1e-6:
                flags.append(f"approach 3: {name} = {value:.4g} at its bound [{low}, {high}]")
    low, high = PLAUSIBLE_EXPONENTS
    for name in ("alpha", "beta"):
        value = params[name]
        if not low <= value <= high:
            flags.append(f"approach 3: {name} = {value:.4g} outside the plausible range [{low}, {high}] "
                         "(degenerate fit)")
    if params["E"] < MIN_E_FRACTION * min_loss:
        flags.append(f"approach 3: E = {params['E']:.4g} below {MIN_E_FRACTION:g} x the smallest observed loss "
                     f"{min_loss:.4g} (degenerate fit: irreducible loss ~ 0)")
    return flags


def loss3(params: dict[str, float], n, d) -> np.ndarray:
    """``E + A/N^α + B/D^β`` at N parameters and D tokens (arrays broadcast)."""
    n, d = np.asarray(n, dtype=float), np.asarray(d, dtype=float)
    return params["E"] + params["A"] * n ** (-params["alpha"]) + params["B"] * d ** (-params["beta"])


def optimal_allocation3(params: dict[str, float], c, c_per_nd: float = 6.0) -> tuple[np.ndarray, np.ndarray]:
    """Compute-optimal ``(N, D)`` of approach 3 under ``C = c_per_nd · N · D``.

    Hoffmann et al. 2022, eq. (4): ``N_opt = G (C/k)^(β/(α+β))``, ``D_opt = G^-1 (C/k)^(α/(α+β))``,
    ``G = (αA / (βB))^(1/(α+β))``, with k = ``c_per_nd`` (6 in the paper).
    """
    alpha, beta = params["alpha"], params["beta"]
    g = (alpha * params["A"] / (beta * params["B"])) ** (1.0 / (alpha + beta))
    ck = np.asarray(c, dtype=float) / c_per_nd
    return g * ck ** (beta / (alpha + beta)), ck ** (alpha / (alpha + beta)) / g
