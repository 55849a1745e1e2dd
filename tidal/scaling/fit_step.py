"""Step kind ``scaling_fit``: read every grid run's summary, fit scaling laws, write results.

Config (planned by :func:`tidal.scaling.suite.build_suite_graph`): ``runs`` (train step name ->
``{budget, model, planned_flops, planned_tokens}``), ``loss`` (summary key fitted: ``eval_loss``
or ``final_train_loss``), ``n_boot``, ``holdout``, ``forecast_flops``, ``seed``.

Per run, from the train step's ``summary.json``: N = ``param_count``, D = ``tokens_seen``,
C = ``tokens_seen · flops_per_token`` (the trainer's MFU count), loss = ``summary[loss]``.
A run whose loss is missing or not finite (a diverged run) is dropped and named in ``flags``;
the fit itself refuses bad values (:class:`tidal.scaling.fits.ScalingFitError`).

Outputs in the step directory:

* ``runs.parquet``: name, budget, d_model, n_layers, n_params, tokens, flops, loss,
  loss_fit3 (approach 3), resid3 (log residual);
* ``params.parquet``: param, method, estimate, lo95, hi95, n_boot_ok;
* ``forecasts.parquet``: flops, quantity, estimate, lo95, hi95;
* ``bootstrap.parquet``: one row per bootstrap replicate, columns
  :data:`tidal.scaling.fits.PARAM_KEYS` (``tidal forecast`` reads it);
* ``fits.json``: all of the above plot-ready plus parabolas, flags and the hold-out;
* ``plots/``: isoflop.png, frontier.png, residuals.png, forecast.png.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from tidal.context import StepContext

STEP_VERSION = 1
FITS_JSON = "fits.json"
BOOTSTRAP = "bootstrap.parquet"


def read_runs(ctx_inputs: dict[str, Path], config: dict[str, Any]) -> tuple[dict[str, np.ndarray], list[str]]:
    """Columns over runs from the train summaries, and flags for dropped runs.

    Raises:
        KeyError: a planned run is not among the inputs.
    """
    cols: dict[str, list] = {k: [] for k in ("name", "budget", "d_model", "n_layers", "n", "d", "c", "loss")}
    dropped = []
    for name, meta in sorted(config["runs"].items(), key=lambda kv: (kv[1]["budget"], kv[0])):
        summary = json.loads((Path(ctx_inputs[name]) / "summary.json").read_text())
        loss = summary.get(config["loss"])
        if not isinstance(loss, (int, float)) or not math.isfinite(loss):
            dropped.append(name)
            continue
        cols["name"].append(name)
        cols["budget"].append(float(meta["budget"]))
        cols["d_model"].append(int(meta["model"]["d_model"]))
        cols["n_layers"].append(int(meta["model"]["n_layers"]))
        cols["n"].append(float(summary["param_count"]))
        cols["d"].append(float(summary["tokens_seen"]))
        cols["c"].append(float(summary["tokens_seen"]) * float(summary["flops_per_token"]))
        cols["loss"].append(float(loss))
    flags = [f"dropped runs whose {config['loss']} is missing or not finite: {dropped}"] if dropped else []
    return {k: np.array(v) for k, v in cols.items()}, flags


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.floating, float)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def fit_runs(cols: dict[str, np.ndarray], config: dict[str, Any], seed: int) -> tuple[dict[str, Any], Any]:
    """Fit, hold out and forecast; returns ``(fits mapping, SuiteFit)``."""
    from tidal.scaling.fits import (
        Runs,
        ScalingFitError,
        fit_suite,
        forecast,
        holdout_largest,
        loss3,
    )

    runs = Runs.make(cols["n"], cols["d"], cols["c"], cols["loss"], cols["budget"], cols["name"])
    fit = fit_suite(runs, n_boot=int(config["n_boot"]), seed=seed % 2**32)
    a2 = fit.approach2
    fits: dict[str, Any] = {"loss": config["loss"], "n_runs": len(runs.n), "c_per_nd": fit.c_per_nd,
                            "flags": list(fit.flags), "point": fit.point, "params": fit.params_table(),
                            "approach3": {k: fit.approach3[k] for k in ("E", "A", "B", "alpha", "beta", "objective",
                                                                         "converged")}}
    if a2 is not None:
        fits["approach2"] = {
            "budgets": [{"budget": pn.budget, "n_opt": pn.x_opt, "d_opt": pd.x_opt, "loss_opt": pn.loss_opt,
                         "coef_n": list(pn.coef), "coef_d": list(pd.coef), "n_sizes": pn.n_sizes,
                         "flag": "; ".join(f for f in (pn.flag, pd.flag) if f)}
                        for pn, pd in zip(a2.iso_n, a2.iso_d, strict=True)],
            "n_law": {"k": a2.n_law[0], "a": a2.n_law[1]}, "d_law": {"k": a2.d_law[0], "a": a2.d_law[1]},
            "frontier": a2.frontier, "used_budgets": a2.used_budgets}
    fits["forecasts"] = [{"flops": c, **forecast(fit, c)} for c in config.get("forecast_flops", [])]
    if config.get("holdout", True):
        try:
            fits["holdout"] = holdout_largest(runs, n_boot=int(config["n_boot"]), seed=seed % 2**32)
        except ScalingFitError as err:
            fits["holdout"] = {"error": str(err)}
            fits["flags"].append(f"hold-out validation not possible: {err}")
    cols["loss_fit3"] = loss3(fit.approach3, runs.n, runs.d)
    cols["resid3"] = np.log(runs.loss) - np.log(cols["loss_fit3"])
    return fits, fit


def run(ctx: StepContext) -> dict[str, Any]:
    """Fit the suite's runs; write Parquet, JSON and plots; return a flat summary.

    Raises:
        tidal.scaling.fits.ScalingFitError: the runs cannot be fitted (message says why).
    """
    import pandas as pd

    from tidal.scaling.fits import PARAM_KEYS
    from tidal.scaling.plots import write_plots

    cols, dropped_flags = read_runs(ctx.inputs, ctx.config)
    fits, fit = fit_runs(cols, ctx.config, ctx.seed)
    fits["flags"] = dropped_flags + fits["flags"]
    out = ctx.out_dir
    pd.DataFrame({"name": cols["name"], "budget": cols["budget"], "d_model": cols["d_model"],
                  "n_layers": cols["n_layers"], "n_params": cols["n"], "tokens": cols["d"], "flops": cols["c"],
                  "loss": cols["loss"], "loss_fit3": cols["loss_fit3"], "resid3": cols["resid3"]}
                 ).to_parquet(out / "runs.parquet", index=False)
    pd.DataFrame(fits["params"]).to_parquet(out / "params.parquet", index=False)
    rows = [{"flops": f["flops"], "quantity": q, **f[q]} for f in fits["forecasts"] for q in f if q != "flops"]
    pd.DataFrame(rows, columns=["flops", "quantity", "estimate", "lo95", "hi95"]).to_parquet(
        out / "forecasts.parquet", index=False)
    pd.DataFrame(fit.boot, columns=list(PARAM_KEYS)).to_parquet(out / BOOTSTRAP, index=False)
    fits["runs"] = [{"name": str(cols["name"][i]), "budget": cols["budget"][i], "n": cols["n"][i], "d": cols["d"][i],
                     "c": cols["c"][i], "loss": cols["loss"][i], "loss_fit3": cols["loss_fit3"][i]}
                    for i in range(len(cols["name"]))]
    (out / FITS_JSON).write_text(json.dumps(_jsonable(fits), indent=1, sort_keys=True) + "\n")
    write_plots(out / "plots", fits, {k: cols[k] for k in ("n", "d", "c", "loss", "budget", "resid3")})
    summary: dict[str, Any] = {"n_runs": fits["n_runs"], "n_budgets": len(np.unique(cols["budget"])),
                               "n_flags": len(fits["flags"]), "loss": ctx.config["loss"]}
    for key in ("alpha", "beta", "E", "a_N", "a_D", "L_inf", "alpha_C"):
        value = fit.point[key]
        if math.isfinite(value):
            summary[key] = value
            lo, hi = fit.interval(key)
            summary[f"{key}_lo95"], summary[f"{key}_hi95"] = lo, hi
    best = fits.get("holdout", {}).get("best")
    if best:
        summary.update(holdout_budget=best["budget"], holdout_predicted=best["predicted"],
                       holdout_actual=best["actual"], holdout_rel_error=best["rel_error"],
                       holdout_covers=int(best["covers"]), holdout_pred_covers=int(best["pred_covers"]))
    for f in fits["forecasts"]:
        summary[f"forecast/{f['flops']:.3g}/loss3"] = f["loss3"]["estimate"]
        summary[f"forecast/{f['flops']:.3g}/n_opt"] = f["n_opt"]["estimate"]
    for flag in fits["flags"]:
        ctx.log.warning("scaling fit: %s", flag)
    return {k: v for k, v in summary.items() if not (isinstance(v, float) and not math.isfinite(v))}


def load_fit(step_dir: str | Path) -> tuple[dict[str, Any], np.ndarray]:
    """``(fits.json mapping, bootstrap replicates [n_boot, len(PARAM_KEYS)])`` of a committed fit step."""
    import pandas as pd

    from tidal.scaling.fits import PARAM_KEYS

    step_dir = Path(step_dir)
    fits = json.loads((step_dir / FITS_JSON).read_text())
    boot = pd.read_parquet(step_dir / BOOTSTRAP)[list(PARAM_KEYS)].to_numpy(dtype=float)
    return fits, boot
