"""Scaling-law fits on synthetic suites drawn from known laws (Hoffmann 2022, Epoch 2024).

Each synthetic suite: 13 budgets 1e17 … 1e23 FLOPs, 12 sizes per budget spread 8x either side
of the law's optimum, loss = L(N, D)·(1 + 0.02 z). Measured (20 seeds per law, 100 bootstrap
replicates, ``-m slow``): see ``test_interval_coverage_over_seeds``.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from tidal.scaling.fits import (
    Runs,
    ScalingFitError,
    degeneracy_flags,
    fit_approach2,
    fit_approach3,
    fit_parabola,
    fit_suite,
    forecast,
    holdout_largest,
    loss3,
)
from tidal.scaling.synthetic import EPOCH, HOFFMANN, synthetic_runs

LAWS = {"hoffmann": HOFFMANN, "epoch": EPOCH}


@pytest.mark.parametrize("law_name", sorted(LAWS))
def test_recovers_exponents_with_covering_intervals(law_name):
    law = LAWS[law_name]
    fit = fit_suite(synthetic_runs(law, seed=0), n_boot=40, seed=0)
    for key in ("alpha", "beta"):
        assert fit.point[key] == pytest.approx(law[key], rel=0.05), key
        lo, hi = fit.interval(key)
        assert lo <= law[key] <= hi, (key, lo, hi)
    assert fit.point["E"] == pytest.approx(law["E"], rel=0.05)
    assert fit.approach3["degenerate"] is False and not fit.approach3["flags"]
    # approach 2: N* ∝ C^(β/(α+β)) (Hoffmann et al. 2022, eq. 4)
    assert fit.point["a_N"] == pytest.approx(law["beta"] / (law["alpha"] + law["beta"]), abs=0.05)
    assert fit.point["a_N"] + fit.point["a_D"] == pytest.approx(1.0, abs=0.02)  # C = 6ND
    f = forecast(fit, 1e24)
    for q in f.values():
        assert q["lo95"] <= q["estimate"] <= q["hi95"]
    assert f["loss3"]["lo95"] <= float(loss3(law, *_true_opt(law, 1e24))) <= f["loss3"]["hi95"]


def _true_opt(law, flops):
    from tidal.scaling.fits import optimal_allocation3

    return optimal_allocation3(law, flops)


def test_holdout_largest_budget_predicts_it():
    runs = synthetic_runs(EPOCH, seed=1)
    out = holdout_largest(runs, n_boot=30, seed=1)
    assert out["held_out_budget"] == pytest.approx(1e23)
    assert out["best"]["rel_error"] < 0.03
    assert out["best"]["pred_lo"] <= out["best"]["actual"] <= out["best"]["pred_hi"]
    assert len(out["runs"]) == 12 and "frontier" in out


def test_nan_or_nonpositive_values_are_refused_by_name():
    runs = synthetic_runs(HOFFMANN, seed=0)
    loss = runs.loss.copy()
    loss[5] = math.nan
    with pytest.raises(ScalingFitError, match=r"loss is NaN.*" + re.escape(runs.names[5])):
        Runs.make(runs.n, runs.d, runs.c, loss, runs.budget, runs.names)
    with pytest.raises(ScalingFitError, match="N is NaN, infinite or <= 0"):
        Runs.make(-runs.n, runs.d, runs.c, runs.loss, runs.budget, runs.names)


def _small_grid(sizes_per_budget=5):
    return synthetic_runs(HOFFMANN, budgets=np.geomspace(1e18, 1e21, 4), sizes_per_budget=sizes_per_budget,
                          spread=4, noise=0.0, seed=0)


def test_budget_with_fewer_than_three_sizes_is_flagged_and_left_out():
    runs = _small_grid()
    first = runs.budgets[0]
    keep = np.flatnonzero((runs.budget != first) | (np.arange(len(runs.n)) % 5 < 2))
    small = runs.take(keep)
    assert (small.budget == first).sum() == 2
    a2 = fit_approach2(small)
    assert first not in a2.used_budgets and len(a2.used_budgets) == 3
    assert any("fewer than 3 distinct sizes" in f for f in a2.flags)


def test_nonconvex_isoflop_curve_is_flagged_not_fitted():
    n = np.geomspace(1e8, 1e9, 5)
    iso = fit_parabola(n, 3.0 - 0.01 * (np.log(n) - np.log(3e8)) ** 2, 1e20)  # a maximum, not a minimum
    assert "non-convex" in iso.flag and math.isnan(iso.x_opt)
    monotone = fit_parabola(n, 3.0 + 0.001 * (np.log(n) - np.log(3e10)) ** 2, 1e20)
    assert "outside the sampled sizes" in monotone.flag


def test_too_few_usable_budgets_raise_with_reasons():
    runs = _small_grid()
    two = runs.take(np.flatnonzero(runs.budget <= runs.budgets[1]))
    with pytest.raises(ScalingFitError, match="needs >= 3 usable budgets, got 2"):
        fit_approach2(two)
    with pytest.raises(ScalingFitError, match="needs >= 5 runs"):
        fit_approach3(runs.take(np.arange(4)))
    fit = fit_suite(two, n_boot=10, seed=0)  # approach 2 impossible: flagged, its parameters NaN
    assert any("approach 2 not fitted" in f for f in fit.flags) and math.isnan(fit.point["a_N"])


def test_degenerate_approach3_fit_is_flagged():
    """Losses that depend on D alone (as in a suite fitted on an out-of-distribution eval):
    the fit can only make α ~ 0 or push E to 0; either is flagged, never silent."""
    grid = _small_grid()
    loss = 0.001 + 5e6 / grid.d ** 2.0  # E ~ 0, no N term, β = 2
    runs = Runs.make(grid.n, grid.d, grid.c, loss, grid.budget, grid.names)
    fit = fit_approach3(runs)
    assert fit["degenerate"] is True
    assert any("plausible range" in f or "below 0.05" in f or "at its bound" in f for f in fit["flags"])
    suite = fit_suite(runs, n_boot=10, seed=0)
    assert suite.approach3["degenerate"] and any(f.startswith("approach 3") for f in suite.flags)
    from tidal.scaling.forecast import format_forecast

    text = format_forecast({"suite": "s", "flops": 1e21, "fit_step": "fit-x", "n_runs": len(runs.n),
                            "loss": "train_loss_tail", "flags": suite.flags, "degenerate": True,
                            "forecast": forecast(suite, 1e21)})
    assert "DEGENERATE" in text and "approach 3:" in text
    # the rules themselves, on hand-made parameters
    good = {"E": 1.7, "A": 400.0, "B": 400.0, "alpha": 0.34, "beta": 0.28}
    assert degeneracy_flags(good, 2.0) == []
    assert any("alpha" in f for f in degeneracy_flags({**good, "alpha": 0.008}, 2.0))
    assert any("beta" in f for f in degeneracy_flags({**good, "beta": 2.04}, 2.0))
    assert any("E = " in f for f in degeneracy_flags({**good, "E": 0.001}, 2.0))


@pytest.mark.slow
@pytest.mark.parametrize("law_name", sorted(LAWS))
def test_interval_coverage_over_seeds(law_name):
    """Coverage of the 95 % bootstrap intervals of α and β over 20 seeds (printed)."""
    law = LAWS[law_name]
    covered, errors = [], []
    for seed in range(20):
        fit = fit_suite(synthetic_runs(law, seed=seed), n_boot=100, seed=seed)
        for key in ("alpha", "beta"):
            lo, hi = fit.interval(key)
            covered.append(lo <= law[key] <= hi)
            errors.append(abs(fit.point[key] / law[key] - 1))
    coverage, within5 = np.mean(covered), np.mean(np.array(errors) < 0.05)
    print(f"RESULT law={law_name} coverage={coverage:.3f} within5pct={within5:.3f} max_rel_error={max(errors):.3f}")
    assert coverage >= 0.8 and within5 >= 0.8
