"""The whole suite fit with bootstrap uncertainty: :func:`fit_suite` and :class:`SuiteFit`.

Approach 2 (:mod:`tidal.scaling.approach2`, with the frontier) and approach 3
(:mod:`tidal.scaling.approach3`) on the runs, then refitted per bootstrap replicate.

Uncertainty: a nonparametric bootstrap over runs, stratified by budget (each budget keeps its
run count), refits everything per replicate; 95 % intervals are the 2.5 and 97.5 percentiles
(Efron & Tibshirani 1993, percentile interval).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from tidal.scaling.approach2 import Approach2, fit_approach2
from tidal.scaling.approach3 import GRID_STARTS_BOOT, fit_approach3, loss3
from tidal.scaling.runs import Runs, ScalingFitError

PARAM_KEYS = ("k_N", "a_N", "k_D", "a_D", "L_inf", "A_C", "alpha_C", "E", "A", "B", "alpha", "beta")


def percentile_interval(values: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of ``values`` at ``level`` (non-finite values ignored; NaNs if none)."""
    values = values[np.isfinite(values)]
    if len(values) == 0:
        return (math.nan, math.nan)
    tail = 50 * (1 - level)
    lo, hi = np.percentile(values, [tail, 100 - tail])
    return float(lo), float(hi)


def _row(a2: Approach2 | None, a3: dict | None) -> dict[str, float]:
    nan = math.nan
    row = dict.fromkeys(PARAM_KEYS, nan)
    if a2 is not None:
        row.update(k_N=a2.n_law[0], a_N=a2.n_law[1], k_D=a2.d_law[0], a_D=a2.d_law[1])
        if a2.frontier is not None:
            row.update(L_inf=a2.frontier["L_inf"], A_C=a2.frontier["A"], alpha_C=a2.frontier["alpha"])
    if a3 is not None:
        row.update({k: a3[k] for k in ("E", "A", "B", "alpha", "beta")})
    return row


def stratified_resample(runs: Runs, rng: np.random.Generator) -> np.ndarray:
    """Indices of a bootstrap resample: within each budget, as many runs drawn with replacement."""
    parts = []
    for budget in runs.budgets:
        idx = np.flatnonzero(runs.budget == budget)
        parts.append(rng.choice(idx, size=len(idx), replace=True))
    return np.sort(np.concatenate(parts))


@dataclass
class SuiteFit:
    """Everything fitted on one set of runs, with bootstrap replicates.

    Attributes:
        runs: the runs fitted.
        approach2, approach3: point fits (approach 2 may be None when it could not be fitted,
            then ``flags`` says why).
        point: the point estimates as a flat ``{key: value}`` over :data:`PARAM_KEYS`.
        boot: ``[n_boot, len(PARAM_KEYS)]`` replicate estimates (NaN where a replicate failed).
        boot_resid: per replicate, the log residuals of its approach-3 fit (for prediction
            intervals), shape ``[n_boot, n_runs]``.
        c_per_nd: C / (N·D) used to turn C into N·D.
        flags: every warning (flagged budgets, bounds, failed replicates).
    """

    runs: Runs
    approach2: Approach2 | None
    approach3: dict[str, Any]
    point: dict[str, float]
    boot: np.ndarray
    boot_resid: np.ndarray
    c_per_nd: float
    flags: list[str]

    def interval(self, key: str, level: float = 0.95) -> tuple[float, float]:
        """Percentile bootstrap interval of parameter ``key`` (NaN replicates ignored)."""
        return percentile_interval(self.boot[:, PARAM_KEYS.index(key)], level)

    def params_table(self) -> list[dict[str, Any]]:
        """Rows ``{param, method, estimate, lo95, hi95, n_boot_ok}`` for every parameter."""
        method = {k: "approach2" for k in ("k_N", "a_N", "k_D", "a_D")}
        method.update({k: "frontier" for k in ("L_inf", "A_C", "alpha_C")})
        method.update({k: "approach3" for k in ("E", "A", "B", "alpha", "beta")})
        rows = []
        for j, key in enumerate(PARAM_KEYS):
            lo, hi = self.interval(key)
            rows.append({"param": key, "method": method[key], "estimate": self.point[key], "lo95": lo,
                         "hi95": hi, "n_boot_ok": int(np.isfinite(self.boot[:, j]).sum())})
        return rows


def _one_blas_thread():
    """L-BFGS-B's small dense algebra runs ~4x slower with competing BLAS threads: use one."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - optional speed-up only
        import contextlib

        return contextlib.nullcontext()
    return threadpool_limits(1)


def fit_suite(runs: Runs, *, seed: int, n_boot: int = 200) -> SuiteFit:
    """Approach 2, approach 3 and the frontier on ``runs``, plus ``n_boot`` stratified bootstrap
    replicates (seeded by ``seed``) of all of them.

    Raises:
        ScalingFitError: invalid runs, or approach 3 impossible (fewer than 5 runs). Approach 2
            failing (too few usable budgets) is recorded in ``flags`` and leaves its parameters NaN.
    """
    with _one_blas_thread():
        return _fit_suite(runs, n_boot, seed)


def _fit_suite(runs: Runs, n_boot: int, seed: int) -> SuiteFit:
    flags: list[str] = []
    try:
        a2 = fit_approach2(runs)
        flags += a2.flags
    except ScalingFitError as err:
        a2 = None
        flags.append(f"approach 2 not fitted: {err}")
    a3 = fit_approach3(runs)
    flags += a3["flags"]
    if not a3["converged"]:
        flags.append("approach 3: L-BFGS-B reported no convergence at the best start")
    point = _row(a2, a3)
    rng = np.random.default_rng(seed)
    boot = np.full((n_boot, len(PARAM_KEYS)), math.nan)
    resid = np.full((n_boot, len(runs.n)), math.nan)
    failed2 = 0
    for i in range(n_boot):
        sample = runs.take(stratified_resample(runs, rng))
        try:
            b2 = fit_approach2(sample) if a2 is not None else None
        except ScalingFitError:
            b2, failed2 = None, failed2 + 1
        b3 = fit_approach3(sample, starts=GRID_STARTS_BOOT, extra_start=np.array(a3["theta"]))
        boot[i] = list(_row(b2, b3).values())
        resid[i] = np.log(sample.loss) - np.log(loss3(b3, sample.n, sample.d))
    if failed2:
        flags.append(f"approach 2 failed in {failed2}/{n_boot} bootstrap replicates "
                     "(too few usable budgets after resampling); intervals use the rest")
    return SuiteFit(runs, a2, a3, point, boot, resid, runs.c_per_nd, flags)
