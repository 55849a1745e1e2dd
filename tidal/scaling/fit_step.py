"""Step kind ``scaling_fit``: read every grid run's summary, fit scaling laws, write results.

Config (planned by :func:`tidal.core.planner.build_suite_graph`): ``runs`` (train step name ->
``{budget, model, planned_flops, planned_tokens}``), ``loss`` (what is fitted, below),
``tail_fraction``, ``n_params`` (``total`` or ``non_embedding``), ``n_boot``, ``holdout``,
``forecast_flops``, ``seed``.

Per run, from the train step's ``summary.json``: N = ``param_count`` (or, with ``n_params:
non_embedding``, Kaplan et al. 2020's count without the embedding and output head), D =
``tokens_seen``, C = ``tokens_seen · flops_per_token`` (the trainer's MFU count), and the loss:

* ``train_loss_tail``: mean training loss over the logged steps in the last ``tail_fraction``
  of the run (``metrics.jsonl``). Each batch's loss is computed *before* the update on it, so
  while a run sees less than one epoch of its mixture every such loss is on unseen,
  in-distribution data: an unbiased held-out estimate for the parameters of that step, and the
  mean over many batches is far less noisy than one batch. Runs past one epoch are flagged.
* ``eval_loss``: the trainer's final eval (the base recipe's eval sources, which may be out of
  distribution, e.g. UDHR for the tiny recipe);
* ``final_train_loss``: the last logged batch only (noisy).
A run whose loss is missing or not finite (a diverged run) is dropped and named in ``flags``;
the fit itself refuses bad values (:class:`tidal.scaling.fits.ScalingFitError`).

Outputs in the step directory:

* ``runs.parquet``: name, budget, d_model, n_layers, n_params, tokens, flops, loss,
  loss_se (standard error of the tail mean), epochs (of the mixture), loss_fit3 (approach 3),
  resid3 (log residual);
* ``params.parquet``: param, method, estimate, lo95, hi95, n_boot_ok;
* ``forecasts.parquet``: flops, quantity, estimate, lo95, hi95;
* ``bootstrap.parquet``: one row per bootstrap replicate, columns
  :data:`tidal.scaling.fits.PARAM_KEYS` (``tidal forecast`` reads it);
* ``fits.json``: all of the above plot-ready plus parabolas, flags and the hold-out;
  ``approach3.degenerate`` (and ``holdout.degenerate``) is true when the approach-3 fit is
  implausible (:func:`tidal.scaling.approach3.degeneracy_flags`), its reasons in ``flags``;
* ``plots/``: isoflop.png, frontier.png, residuals.png, forecast.png.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tidal.context import StepContext
from tidal.files.step_files import StepFiles
from tidal.storage.layout import SPEC_JSON, SUMMARY_JSON

if TYPE_CHECKING:
    from tidal.scaling.suite import FitStepConfig

STEP_VERSION = 2  # 2: plots without matplotlib's version chunk (tidal/plots.py)
FITS_JSON = "fits.json"
BOOTSTRAP = "bootstrap.parquet"


def tail_train_loss(step_dir: StepFiles | str | Path, steps: int, fraction: float) -> tuple[float, float, int]:
    """Mean logged training loss over the last ``fraction`` of ``steps`` (from ``metrics.jsonl``,
    read in place).

    Returns ``(mean, standard error, records used)``; NaN mean when no record falls in the tail.
    """
    files = StepFiles.open(step_dir)
    if not files.exists("metrics.jsonl"):
        return math.nan, math.nan, 0
    first = steps * (1.0 - fraction)
    text = files.read_text("metrics.jsonl")
    losses = [r["loss"] for r in (json.loads(line) for line in text.splitlines() if line.strip())
              if r.get("step", 0) > first and isinstance(r.get("loss"), (int, float))]
    if not losses:
        return math.nan, math.nan, 0
    arr = np.array(losses, dtype=float)
    se = float(arr.std(ddof=1) / math.sqrt(len(arr))) if len(arr) > 1 else math.nan
    return float(arr.mean()), se, len(arr)


def epoch_tokens(step_dir: StepFiles | str | Path) -> float | None:
    """Predicted tokens in one epoch of the run's training mixture (``n_sequences · (seq_len - 1)``
    from the ``mixture.json`` among the train step's inputs, each a directory or a bucket URI as
    ``spec.json`` records it), or None when it cannot be found."""
    try:
        spec = StepFiles.open(step_dir).read_json(SPEC_JSON)
        for where in spec.get("inputs", {}).values():
            inputs = StepFiles.open(where)
            if inputs.exists("mixture.json"):
                mix = inputs.read_json("mixture.json")
                return float(mix["n_sequences"]) * (int(mix["seq_len"]) - 1)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return None


def non_embedding_params(model: dict[str, int]) -> int:
    """Kaplan et al. 2020's N: parameters less the input embedding and the output head
    (``L·(4d² + 3d·d_ff + 2d) + d``, :func:`tidal.train.flops.param_count` without ``2·V·d``)."""
    d, layers, d_ff = int(model["d_model"]), int(model["n_layers"]), int(model["d_ff"])
    return layers * (4 * d * d + 3 * d * d_ff + 2 * d) + d


def read_runs(ctx_inputs: dict[str, Path | str], config: FitStepConfig) -> tuple[dict[str, np.ndarray], list[str]]:
    """Columns over runs from the train summaries (and, for ``train_loss_tail``, their
    ``metrics.jsonl``), and flags for dropped runs and runs that saw repeated data. Inputs are
    train step locations (directories or bucket URIs); only those small files are read, in place,
    never a checkpoint.

    Raises:
        KeyError: a planned run is not among the inputs.
    """
    loss_key = config.loss
    fraction = config.tail_fraction
    convention = config.n_params
    cols: dict[str, list] = {k: [] for k in ("name", "budget", "d_model", "n_layers", "n", "d", "c", "loss",
                                             "loss_se", "epochs")}
    dropped, repeated, few = [], [], []
    for name, meta in sorted(config.runs.items(), key=lambda kv: (kv[1].budget, kv[0])):
        step_dir = StepFiles.open(ctx_inputs[name])
        summary = step_dir.read_json(SUMMARY_JSON)
        se = math.nan
        if loss_key == "train_loss_tail":
            loss, se, used = tail_train_loss(step_dir, int(summary.get("steps", 0)), fraction)
            if 0 < used < 5:
                few.append(f"{name} ({used})")
        else:
            loss = summary.get(loss_key)
        if not isinstance(loss, (int, float)) or not math.isfinite(loss):
            dropped.append(name)
            continue
        one_epoch = epoch_tokens(step_dir)
        epochs = float(summary["tokens_seen"]) / one_epoch if one_epoch else math.nan
        if loss_key != "eval_loss" and epochs > 1.0:
            repeated.append(f"{name} ({epochs:.2f} epochs)")
        cols["name"].append(name)
        cols["budget"].append(float(meta.budget))
        cols["d_model"].append(int(meta.model["d_model"]))
        cols["n_layers"].append(int(meta.model["n_layers"]))
        n = non_embedding_params(meta.model) if convention == "non_embedding" else summary["param_count"]
        cols["n"].append(float(n))
        cols["d"].append(float(summary["tokens_seen"]))
        cols["c"].append(float(summary["tokens_seen"]) * float(summary["flops_per_token"]))
        cols["loss"].append(float(loss))
        cols["loss_se"].append(se)
        cols["epochs"].append(epochs)
    flags = [f"dropped runs whose {loss_key} is missing or not finite: {dropped}"] if dropped else []
    if repeated:
        flags.append(f"runs saw more than one epoch of the training mixture, so their {loss_key} is measured "
                     f"partly on data they were trained on (not a held-out estimate): {repeated}")
    if few:
        flags.append(f"train_loss_tail averages fewer than 5 logged steps (lower train.log_every): {few}")
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


def fit_runs(cols: dict[str, np.ndarray], config: FitStepConfig, seed: int) -> tuple[dict[str, Any], Any]:
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
    fit = fit_suite(runs, n_boot=config.n_boot, seed=seed % 2**32)
    a2 = fit.approach2
    fits: dict[str, Any] = {"loss": config.loss, "n_params": config.n_params,
                            "n_runs": len(runs.n), "c_per_nd": fit.c_per_nd,
                            "flags": list(fit.flags), "point": fit.point, "params": fit.params_table(),
                            "approach3": {k: fit.approach3[k] for k in ("E", "A", "B", "alpha", "beta", "objective",
                                                                         "converged", "degenerate", "flags")}}
    if a2 is not None:
        fits["approach2"] = {
            "budgets": [{"budget": pn.budget, "n_opt": pn.x_opt, "d_opt": pd.x_opt, "loss_opt": pn.loss_opt,
                         "coef_n": list(pn.coef), "coef_d": list(pd.coef), "n_sizes": pn.n_sizes,
                         "flag": "; ".join(f for f in (pn.flag, pd.flag) if f)}
                        for pn, pd in zip(a2.iso_n, a2.iso_d, strict=True)],
            "n_law": {"k": a2.n_law[0], "a": a2.n_law[1]}, "d_law": {"k": a2.d_law[0], "a": a2.d_law[1]},
            "frontier": a2.frontier, "used_budgets": a2.used_budgets}
    fits["forecasts"] = [{"flops": c, **forecast(fit, c)} for c in config.forecast_flops]
    if config.holdout:
        try:
            fits["holdout"] = holdout_largest(runs, n_boot=config.n_boot, seed=seed % 2**32)
            if fits["holdout"]["degenerate"]:
                fits["flags"].append("hold-out validation: the fit without the largest budget is degenerate, so "
                                     "its error is no validation: " + "; ".join(
                                         f for f in fits["holdout"]["flags"] if f.startswith("approach 3")))
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

    config: FitStepConfig = ctx.config  # parsed once, at plan time
    cols, dropped_flags = read_runs(ctx.inputs, config)
    fits, fit = fit_runs(cols, config, ctx.require_seed())
    fits["flags"] = dropped_flags + fits["flags"]
    out = ctx.out_dir
    pd.DataFrame({"name": cols["name"], "budget": cols["budget"], "d_model": cols["d_model"],
                  "n_layers": cols["n_layers"], "n_params": cols["n"], "tokens": cols["d"], "flops": cols["c"],
                  "loss": cols["loss"], "loss_se": cols["loss_se"], "epochs": cols["epochs"],
                  "loss_fit3": cols["loss_fit3"], "resid3": cols["resid3"]}
                 ).to_parquet(out / "runs.parquet", index=False)
    pd.DataFrame(fits["params"]).to_parquet(out / "params.parquet", index=False)
    rows = [{"flops": f["flops"], "quantity": q, **f[q]} for f in fits["forecasts"] for q in f if q != "flops"]
    pd.DataFrame(rows, columns=["flops", "quantity", "estimate", "lo95", "hi95"]).to_parquet(
        out / "forecasts.parquet", index=False)
    pd.DataFrame(fit.boot, columns=list(PARAM_KEYS)).to_parquet(out / BOOTSTRAP, index=False)
    fits["runs"] = [{"name": str(cols["name"][i]), "budget": cols["budget"][i], "n": cols["n"][i], "d": cols["d"][i],
                     "c": cols["c"][i], "loss": cols["loss"][i], "loss_se": cols["loss_se"][i],
                     "epochs": cols["epochs"][i], "loss_fit3": cols["loss_fit3"][i]}
                    for i in range(len(cols["name"]))]
    (out / FITS_JSON).write_text(json.dumps(_jsonable(fits), indent=1, sort_keys=True) + "\n")
    write_plots(out / "plots", fits, {k: cols[k] for k in ("n", "d", "c", "loss", "budget", "resid3")})
    summary: dict[str, Any] = {"n_runs": fits["n_runs"], "n_budgets": len(np.unique(cols["budget"])),
                               "n_flags": len(fits["flags"]), "loss": config.loss,
                               "degenerate3": int(fits["approach3"]["degenerate"])}
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


def load_fit(step_dir: StepFiles | str | Path) -> tuple[dict[str, Any], np.ndarray]:
    """``(fits.json mapping, bootstrap replicates [n_boot, len(PARAM_KEYS)])`` of a committed fit step
    (a directory or a bucket URI, read in place)."""
    import pandas as pd

    from tidal.scaling.fits import PARAM_KEYS

    files = StepFiles.open(step_dir)
    fits = files.read_json(FITS_JSON)
    with files.open_input(BOOTSTRAP) as source:
        boot = pd.read_parquet(source)[list(PARAM_KEYS)].to_numpy(dtype=float)
    return fits, boot
