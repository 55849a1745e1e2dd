"""``tidal forecast SUITE --flops C``: N*, D* and the predicted loss of a run of C FLOPs.

Reads the suite's committed fit step (``fits.json`` and ``bootstrap.parquet``), so it needs
the suite to have run; intervals are the 95 % bootstrap percentiles over runs.
"""

from __future__ import annotations

from typing import Any

from tidal.scaling.fit_step import load_fit
from tidal.scaling.fits import PARAM_KEYS, forecast_params
from tidal.scaling.suite import FIT_STEP


class ForecastUnavailable(RuntimeError):
    """The suite's fit step is not committed yet; the message says what to run."""


def forecast_suite(pipe: Any, flops: float) -> dict[str, Any]:
    """Forecast a run of ``flops`` FLOPs from the committed fit of ``pipe`` (a suite pipeline).

    Returns:
        ``{"suite", "flops", "fit_step", "loss", "flags", "degenerate", "forecast": {quantity:
        {estimate, lo95, hi95}}}`` with quantities as in :func:`tidal.scaling.fits.forecast`;
        ``degenerate``: the approach-3 fit is implausible (its reasons are among ``flags``).

    Raises:
        ForecastUnavailable: not a suite, or its fit step is not committed.
        ValueError: ``flops`` not positive.
    """
    if not flops > 0:
        raise ValueError(f"--flops must be positive, got {flops}")
    if getattr(pipe, "suite", None) is None:
        raise ForecastUnavailable(f"{pipe.recipe_path} is a recipe, not a scaling suite (kind: scaling_suite)")
    step = pipe.graph[FIT_STEP]
    if not pipe.storage.is_committed(step.step_id):
        raise ForecastUnavailable(f"fit step {step.step_id} is not committed under {pipe.storage.root}; "
                                  f"run the suite first: tidal run {pipe.recipe_path}")
    fits, boot = load_fit(pipe.storage.input_dir(step.step_id))
    point = {k: (float("nan") if fits["point"][k] is None else fits["point"][k]) for k in PARAM_KEYS}
    return {"suite": pipe.suite.name, "flops": flops, "fit_step": step.step_id, "loss": fits["loss"],
            "flags": fits["flags"], "n_runs": fits["n_runs"],
            "degenerate": bool(fits.get("approach3", {}).get("degenerate", False)),
            "forecast": forecast_params(point, boot, fits["c_per_nd"], flops)}


def format_forecast(result: dict[str, Any]) -> str:
    """Human-readable lines of :func:`forecast_suite`'s result."""
    f = result["forecast"]

    def row(label: str, key: str, fmt: str) -> str:
        q = f[key]
        return f"  {label:<34} {q['estimate']:{fmt}}   95 % [{q['lo95']:{fmt}}, {q['hi95']:{fmt}}]"

    lines = [(f"suite {result['suite']}: forecast for C = {result['flops']:.3g} FLOPs "
             f"(fit {result['fit_step']}, {result['n_runs']} runs, loss = {result['loss']})"),
             row("N* parameters (approach 2)", "n_opt", ".4g"),
             row("D* tokens (approach 2)", "d_opt", ".4g"),
             row("loss at N*, D* (frontier L(C))", "loss_frontier", ".4f"),
             row("N_opt parameters (approach 3)", "n_opt3", ".4g"),
             row("D_opt tokens (approach 3)", "d_opt3", ".4g"),
             row("loss at N_opt, D_opt (approach 3)", "loss3", ".4f")]
    if result.get("degenerate"):
        lines.append("  WARNING: the approach-3 fit is DEGENERATE (see flags): its N_opt, D_opt and loss "
                     "are not meaningful")
    if result["flags"]:
        lines.append(f"  {len(result['flags'])} flag(s) on the fit:")
        lines += [f"    - {flag}" for flag in result["flags"]]
    return "\n".join(lines)
