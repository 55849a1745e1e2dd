"""Scaling-law fits over a suite of training runs: isoFLOP parabolas, L(N, D), the frontier.

A facade: the fits live in one module per job and are re-exported here, so
``from tidal.scaling.fits import ...`` keeps working.

* :mod:`tidal.scaling.runs`: the input arrays (:class:`Runs`), their validation and
  :class:`ScalingFitError`.
* :mod:`tidal.scaling.approach2`: **Approach 2** (Hoffmann et al. 2022, §3.2): per-budget
  robust parabolas in log N and log D, then the power laws ``N* = k_N C^a``, ``D* = k_D C^b``.
* :mod:`tidal.scaling.approach3`: **Approach 3** (Hoffmann et al. 2022, §3.3 and Appendix D.2;
  Besiroglu et al. 2024): ``L(N, D) = E + A/N^α + B/D^β`` by a summed Huber loss and L-BFGS-B.
* :mod:`tidal.scaling.frontier`: **Frontier** ``L*(C) = L∞ + A_C · C^(-α_C)`` through the
  per-budget best losses of approach 2.
* :mod:`tidal.scaling.bootstrap`: all of the above with a stratified bootstrap
  (:func:`fit_suite`, :class:`SuiteFit`, :data:`PARAM_KEYS`).
* :mod:`tidal.scaling.predict`: forecasts at a compute budget and predictions at given runs.
* :mod:`tidal.scaling.holdout`: leave-the-largest-budget-out validation.

All fits use :mod:`scipy.optimize`; each module's docstring gives its formulas and sources.
"""

from __future__ import annotations

from tidal.scaling.approach2 import (
    MIN_SIZES_PER_BUDGET,
    Approach2,
    IsoFlop,
    fit_approach2,
    fit_parabola,
    power_law,
)
from tidal.scaling.approach3 import (
    BOUNDS3,
    GRID_A,
    GRID_ALPHA,
    GRID_B,
    GRID_BETA,
    GRID_E,
    GRID_STARTS_BOOT,
    GRID_STARTS_MAIN,
    HUBER_DELTA,
    MIN_E_FRACTION,
    PLAUSIBLE_EXPONENTS,
    degeneracy_flags,
    fit_approach3,
    loss3,
    optimal_allocation3,
)
from tidal.scaling.bootstrap import (
    PARAM_KEYS,
    SuiteFit,
    fit_suite,
    percentile_interval,
    stratified_resample,
)
from tidal.scaling.frontier import fit_frontier, frontier_loss
from tidal.scaling.holdout import holdout_largest
from tidal.scaling.predict import forecast, forecast_params, predict_runs3
from tidal.scaling.runs import Runs, ScalingFitError

__all__ = [
    "BOUNDS3", "GRID_A", "GRID_ALPHA", "GRID_B", "GRID_BETA", "GRID_E", "GRID_STARTS_BOOT",
    "GRID_STARTS_MAIN", "HUBER_DELTA", "MIN_E_FRACTION", "MIN_SIZES_PER_BUDGET", "PARAM_KEYS",
    "PLAUSIBLE_EXPONENTS",
    "Approach2", "IsoFlop", "Runs", "ScalingFitError", "SuiteFit",
    "degeneracy_flags", "fit_approach2", "fit_approach3", "fit_frontier", "fit_parabola", "fit_suite", "forecast",
    "forecast_params", "frontier_loss", "holdout_largest", "loss3", "optimal_allocation3",
    "percentile_interval", "power_law", "predict_runs3", "stratified_resample",
]
