"""Scaling-law fits over a suite of training runs: isoFLOP parabolas, L(N, D), the frontier.

Inputs are arrays over runs, one entry per trained model: ``n`` parameters (N), ``d`` trained
tokens (D), ``c`` training FLOPs (C), ``loss`` (nats per token) and ``budget`` (the nominal
compute budget the run belongs to, FLOPs; runs of one isoFLOP curve share it).

Three fits, all with :mod:`scipy.optimize`:

* **Approach 2** (Hoffmann et al. 2022, "Training Compute-Optimal Large Language Models",
  §3.2): per budget, a robust parabola of loss in log N (and separately in log D); its vertex
  gives N*(C), D*(C) and the best loss L*(C) of that budget; then ``N* = k_N C^a`` and
  ``D* = k_D C^b`` by least squares in log-log space.
* **Approach 3** (Hoffmann et al. 2022, §3.3 and Appendix D.2; the replication of Besiroglu
  et al. 2024, "Chinchilla Scaling: A replication attempt"): ``L(N, D) = E + A/N^α + B/D^β``,
  parametrized as ``log L = LSE(a - α log N, b - β log D, e)`` with ``A = e^a, B = e^b,
  E = e^e``; the Huber loss (δ = 1e-3) of ``log L̂ - log L`` is **summed** over runs (Besiroglu
  et al. traced Chinchilla's implausibly narrow intervals to an averaged objective on which
  L-BFGS stopped early) and minimized by L-BFGS-B from the best points of Hoffmann's grid of
  starts (α, β ∈ {0, .5, …, 2}, e ∈ {-1, -.5, …, 1}, a, b ∈ {0, 5, …, 25}).
* **Frontier**: ``L*(C) = L∞ + A_C · C^(-α_C)`` through the per-budget best losses L*(C) of
  approach 2, least squares on log loss.

Uncertainty: a nonparametric bootstrap over runs, stratified by budget (each budget keeps its
run count), refits everything per replicate; 95 % intervals are the 2.5 and 97.5 percentiles
(Efron & Tibshirani 1993, percentile interval). Prediction intervals for an observed loss add
to each replicate's prediction a residual drawn from that replicate's own fit.

Degenerate input is never fitted silently: NaN/inf or non-positive values raise
:class:`ScalingFitError` naming the runs; a budget with fewer than three distinct sizes, a
non-convex isoFLOP parabola, or a vertex outside the sampled sizes is *flagged* and left out of
the power laws and the frontier (``flags`` lists why); too few usable budgets raise.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import optimize

HUBER_DELTA = 1e-3
MIN_SIZES_PER_BUDGET = 3
# Hoffmann et al. 2022, Appendix D.2: grid of initialisations for L-BFGS.
GRID_ALPHA = GRID_BETA = np.arange(0.0, 2.01, 0.5)
GRID_E = np.arange(-1.0, 1.01, 0.5)
GRID_A = GRID_B = np.arange(0.0, 25.01, 5.0)
GRID_STARTS_MAIN = 20          # L-BFGS runs from the best grid points (main fit)
GRID_STARTS_BOOT = 1           # ... and per bootstrap replicate (plus the main optimum)
BOUNDS3 = [(-20.0, 60.0), (-20.0, 60.0), (-20.0, 5.0), (0.0, 5.0), (0.0, 5.0)]  # a, b, e, α, β


class ScalingFitError(ValueError):
    """The runs cannot be fitted (NaN, non-positive values, too few usable budgets); the
    message names the runs or budgets and the rule."""


@dataclass(frozen=True)
class Runs:
    """Finished runs of a suite as parallel float arrays of shape ``[n_runs]``.

    Attributes:
        n: parameters; d: trained tokens; c: training FLOPs; loss: nats/token;
        budget: nominal compute budget (FLOPs) of the isoFLOP curve the run belongs to;
        names: run (step) names, for error messages.
    """

    n: np.ndarray
    d: np.ndarray
    c: np.ndarray
    loss: np.ndarray
    budget: np.ndarray
    names: tuple[str, ...] = ()

    @classmethod
    def make(cls, n, d, c, loss, budget, names=None) -> Runs:
        """Validate and build.

        Raises:
            ScalingFitError: arrays of different lengths, NaN/inf, or values <= 0, naming runs.
        """
        arrays = [np.asarray(x, dtype=float).ravel() for x in (n, d, c, loss, budget)]
        size = len(arrays[0])
        names = tuple(names) if names is not None else tuple(f"run{i}" for i in range(size))
        if any(len(a) != size for a in arrays) or len(names) != size:
            raise ScalingFitError(f"runs: arrays have different lengths {[len(a) for a in arrays]}")
        if size == 0:
            raise ScalingFitError("runs: no runs to fit")
        for label, arr in zip(("N", "D", "C", "loss", "budget"), arrays, strict=True):
            bad = [names[i] for i in np.flatnonzero(~np.isfinite(arr) | (arr <= 0))]
            if bad:
                raise ScalingFitError(f"runs: {label} is NaN, infinite or <= 0 for runs {bad}; "
                                      "fix or drop them before fitting")
        return cls(*arrays, names=names)

    def take(self, index: np.ndarray) -> Runs:
        """The runs at ``index`` (may repeat: a bootstrap resample)."""
        return Runs(self.n[index], self.d[index], self.c[index], self.loss[index], self.budget[index],
                    tuple(self.names[i] for i in index))

    @property
    def budgets(self) -> np.ndarray:
        """Distinct nominal budgets, ascending."""
        return np.unique(self.budget)

    @property
    def c_per_nd(self) -> float:
        """Median of C / (N·D): 6 for the Kaplan count; the constant turning C into N·D."""
        return float(np.median(self.c / (self.n * self.d)))


# --------------------------------------------------------------------------- approach 2

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


# --------------------------------------------------------------------------- approach 3

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
    flags = []
    for name, value, (low, high) in zip(("log A", "log B", "log E", "alpha", "beta"), best.x, BOUNDS3, strict=True):
        if value <= low + 1e-6 or value >= high - 1e-6:
            flags.append(f"approach 3: {name} = {value:.4g} at its bound [{low}, {high}]")
    return {"E": math.exp(e), "A": math.exp(a), "B": math.exp(b), "alpha": alpha, "beta": beta,
            "theta": [a, b, e, alpha, beta], "objective": float(best.fun),
            "converged": bool(best.success), "flags": flags}


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


# --------------------------------------------------------------------------- bootstrap

PARAM_KEYS = ("k_N", "a_N", "k_D", "a_D", "L_inf", "A_C", "alpha_C", "E", "A", "B", "alpha", "beta")


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
        col = self.boot[:, PARAM_KEYS.index(key)]
        col = col[np.isfinite(col)]
        if len(col) == 0:
            return (math.nan, math.nan)
        tail = 50 * (1 - level)
        lo, hi = np.percentile(col, [tail, 100 - tail])
        return float(lo), float(hi)

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


def fit_suite(runs: Runs, *, n_boot: int = 200, seed: int = 0) -> SuiteFit:
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


# --------------------------------------------------------------------------- forecasts

def _quantiles(values: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    values = values[np.isfinite(values)]
    if len(values) == 0:
        return (math.nan, math.nan)
    tail = 50 * (1 - level)
    lo, hi = np.percentile(values, [tail, 100 - tail])
    return float(lo), float(hi)


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
        lo, hi = _quantiles(reps[key])
        out[key] = {"estimate": float(value[0]), "lo95": lo, "hi95": hi}
    return out


def predict_runs3(fit: SuiteFit, n, d, *, level: float = 0.95, seed: int = 0) -> dict[str, np.ndarray]:
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


def holdout_largest(runs: Runs, *, n_boot: int = 200, seed: int = 0) -> dict[str, Any]:
    """Leave-the-largest-budget-out validation: fit without it, predict it.

    Predicted quantities for the held-out budget C_max:

    * ``best``: approach 3 (fitted without C_max) at every held-out run's (N, D); the predicted
      best of those against the observed best held-out loss, with the bootstrap interval of
      the law (``lo``/``hi``) and the prediction interval of an observed loss
      (``pred_lo``/``pred_hi``).
    * ``frontier``: L(C_max) of the frontier (when approach 2 could be fitted without C_max)
      against the held-out budget's parabola minimum (or its best observed loss when its
      parabola is flagged).
    * ``runs``: per held-out run, predicted and observed loss.

    Raises:
        ScalingFitError: fewer than two budgets, or the rest cannot be fitted.
    """
    budgets = runs.budgets
    if len(budgets) < 2:
        raise ScalingFitError("leave-the-largest-budget-out needs >= 2 budgets")
    held = float(budgets[-1])
    train_idx = np.flatnonzero(runs.budget != held)
    test_idx = np.flatnonzero(runs.budget == held)
    fit = fit_suite(runs.take(train_idx), n_boot=n_boot, seed=seed)
    test = runs.take(test_idx)
    pred = predict_runs3(fit, test.n, test.d, seed=seed)
    k = int(np.argmin(pred["estimate"]))
    actual = float(np.min(test.loss))
    best = {"budget": held, "predicted": float(pred["estimate"][k]), "actual": actual,
            "lo": float(pred["lo"][k]), "hi": float(pred["hi"][k]),
            "pred_lo": float(pred["pred_lo"][k]), "pred_hi": float(pred["pred_hi"][k]),
            "predicted_run": test.names[k], "actual_run": test.names[int(np.argmin(test.loss))]}
    best["rel_error"] = abs(best["predicted"] - actual) / actual
    best["covers"] = bool(best["lo"] <= actual <= best["hi"])
    best["pred_covers"] = bool(best["pred_lo"] <= actual <= best["pred_hi"])
    out: dict[str, Any] = {"held_out_budget": held, "best": best, "flags": fit.flags,
                           "runs": [{"name": test.names[i], "n": float(test.n[i]), "d": float(test.d[i]),
                                     "actual": float(test.loss[i]), "predicted": float(pred["estimate"][i]),
                                     "lo": float(pred["lo"][i]), "hi": float(pred["hi"][i]),
                                     "pred_lo": float(pred["pred_lo"][i]), "pred_hi": float(pred["pred_hi"][i])}
                                    for i in range(len(test.n))]}
    if fit.approach2 is not None and fit.approach2.frontier is not None:
        iso = fit_parabola(test.n, test.loss, held)
        actual_f = iso.loss_opt if not iso.flag else actual
        fc = forecast(fit, held)["loss_frontier"]
        out["frontier"] = {"predicted": fc["estimate"], "lo": fc["lo95"], "hi": fc["hi95"], "actual": actual_f,
                           "actual_from": "parabola minimum" if not iso.flag else "best observed run",
                           "rel_error": abs(fc["estimate"] - actual_f) / actual_f,
                           "covers": bool(fc["lo95"] <= actual_f <= fc["hi95"])}
    return out
