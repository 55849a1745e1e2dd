"""Forecasts from a suite fit, with bootstrap intervals.

At a compute budget (:func:`forecast`, :func:`forecast_params`): the approach-2 allocation,
the frontier loss and the approach-3 allocation and loss. At given runs
(:func:`predict_runs3`): approach-3 losses; prediction intervals for an observed loss add to
each replicate's prediction a residual drawn from that replicate's own fit.
"""

from __future__ import annotations

import numpy as np

from tidal.scaling.approach3 import loss3, optimal_allocation3
from tidal.scaling.bootstrap import PARAM_KEYS, SuiteFit, percentile_interval


def _predict_rows(rows: np.ndarray, flops: float, c_per_nd: float) -> dict[str, np.ndarray]:
    """Forecasts at ``flops`` from parameter rows ``[k, len(PARAM_KEYS)]``."""
    col = {k: rows[:, j] for j, k in enumerate(PARAM_KEYS)}
    n2 = col["k_N"] * flops ** col["a_N"]
    d2 = col["k_D"] * flops ** col["a_D"]
    lf = col["L_inf"] + col["A_C"] * flops ** (-col["alpha_C"])
    p3 = {k: col[k] for k in ("E", "A", "B", "alpha", "beta")}
    with np.errstate(all="ignore"):
        n3, d3 = optimal_allocation3(p3, flops, c_per_nd)
        l3 = loss3(p3, n3, d3)
    return {"n_opt": n2, "d_opt": d2, "loss_frontier": lf, "n_opt3": n3, "d_opt3": d3, "loss3": l3}


def forecast(fit: SuiteFit, flops: float) -> dict[str, dict[str, float]]:
    """Forecast a run of ``flops`` FLOPs: ``{quantity: {"estimate", "lo95", "hi95"}}``.

    Quantities: ``n_opt``, ``d_opt`` (approach-2 power laws; parameters, tokens),
    ``loss_frontier`` (frontier L(C)), ``n_opt3``, ``d_opt3`` (approach-3 optimal allocation
    with C = c_per_nd·N·D) and ``loss3`` (approach-3 loss there; nats/token).
    """
    return forecast_params(fit.point, fit.boot, fit.c_per_nd, flops)


def forecast_params(point: dict[str, float], boot: np.ndarray, c_per_nd: float,
                    flops: float) -> dict[str, dict[str, float]]:
    """:func:`forecast` from stored parameters: ``point`` over :data:`PARAM_KEYS`, ``boot``
    replicates ``[n_boot, len(PARAM_KEYS)]`` (as written to ``bootstrap.parquet``)."""
    est = _predict_rows(np.array([[point[k] for k in PARAM_KEYS]], dtype=float), flops, c_per_nd)
    reps = _predict_rows(np.asarray(boot, dtype=float), flops, c_per_nd)
    out = {}
    for key, value in est.items():
        lo, hi = percentile_interval(reps[key])
        out[key] = {"estimate": float(value[0]), "lo95": lo, "hi95": hi}
    return out


def predict_runs3(fit: SuiteFit, n, d, *, seed: int, level: float = 0.95) -> dict[str, np.ndarray]:
    """Approach-3 predictions of the loss of runs at ``(n, d)`` with intervals.

    Returns ``{"estimate", "lo", "hi"}`` (bootstrap interval of the mean law) and
    ``{"pred_lo", "pred_hi"}``: a prediction interval for an *observed* loss, each replicate's
    prediction times ``exp`` of a residual drawn from that replicate's own fit. Shapes ``[k]``.
    """
    n, d = np.atleast_1d(np.asarray(n, float)), np.atleast_1d(np.asarray(d, float))
    rng = np.random.default_rng(seed)
    j = [PARAM_KEYS.index(k) for k in ("E", "A", "B", "alpha", "beta")]
    preds, noisy = [], []
    for row, res in zip(fit.boot[:, j], fit.boot_resid, strict=True):
        if not np.all(np.isfinite(row)):
            continue
        p = dict(zip(("E", "A", "B", "alpha", "beta"), row, strict=True))
        value = loss3(p, n, d)
        preds.append(value)
        noisy.append(value * np.exp(rng.choice(res[np.isfinite(res)], size=len(n))))
    preds, noisy = np.array(preds), np.array(noisy)
    tail = 50 * (1 - level)
    return {"estimate": loss3(fit.approach3, n, d),
            "lo": np.percentile(preds, tail, axis=0), "hi": np.percentile(preds, 100 - tail, axis=0),
            "pred_lo": np.percentile(noisy, tail, axis=0), "pred_hi": np.percentile(noisy, 100 - tail, axis=0)}
