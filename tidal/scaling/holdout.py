"""Leave-the-largest-budget-out validation of a suite fit (:func:`holdout_largest`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from tidal.scaling.approach2 import fit_parabola
from tidal.scaling.bootstrap import fit_suite
from tidal.scaling.predict import forecast, predict_runs3
from tidal.scaling.runs import Runs, ScalingFitError


def holdout_largest(runs: Runs, *, seed: int, n_boot: int = 200) -> dict[str, Any]:
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
    * ``flags`` of the fit without C_max, and ``degenerate``: its approach-3 fit is degenerate
      (:func:`tidal.scaling.approach3.degeneracy_flags`), so a small error is no validation.

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
                           "degenerate": bool(fit.approach3.get("degenerate", False)),
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
