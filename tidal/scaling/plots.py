"""PNG plots of a suite fit, drawn from the plot-ready ``fits.json`` data (matplotlib, Agg).

Four figures: ``isoflop.png`` (loss against N per budget, parabolas, minima), ``frontier.png``
(best loss per budget against C, the fitted L(C), the held-out budget and forecasts with 95 %
intervals), ``residuals.png`` (approach-3 log residuals against N and D) and ``forecast.png``
(N*(C), D*(C) power laws with forecast intervals).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tidal.plots import pyplot, save_png


def _finite(q: dict[str, Any] | None) -> bool:
    return bool(q) and all(isinstance(q.get(k), (int, float)) and np.isfinite(q[k])
                           for k in ("estimate", "lo95", "hi95"))


def _save(fig, path: Path) -> str:
    """Lay out, write as PNG (110 dpi, no version chunk: :func:`tidal.plots.save_png`) and close
    ``fig``; returns the file name."""
    return save_png(fig, path, dpi=110).name


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)


def write_plots(out_dir: Path, fits: dict[str, Any], runs: dict[str, np.ndarray]) -> list[str]:
    """Write the four PNGs into ``out_dir``; returns their file names.

    Args:
        fits: the ``fits.json`` mapping (see :mod:`tidal.scaling.fit_step`).
        runs: columns ``n``, ``d``, ``c``, ``loss``, ``budget``, ``resid3`` (arrays ``[n_runs]``).
    """
    plt = pyplot()

    out_dir.mkdir(parents=True, exist_ok=True)
    names = []
    budgets = np.unique(runs["budget"])
    colors = plt.cm.viridis(np.linspace(0, 0.9, len(budgets)))

    fig, ax = plt.subplots(figsize=(7, 5))
    iso = {row["budget"]: row for row in fits.get("approach2", {}).get("budgets", [])}
    for color, budget in zip(colors, budgets, strict=True):
        sel = runs["budget"] == budget
        ax.scatter(runs["n"][sel], runs["loss"][sel], color=color, s=18, label=f"C={budget:.2g}")
        row = iso.get(float(budget))
        if row and np.all(np.isfinite(row["coef_n"])):
            grid = np.geomspace(runs["n"][sel].min(), runs["n"][sel].max(), 50)
            u = np.log(grid)
            p2, p1, p0 = row["coef_n"]
            ax.plot(grid, p2 * u * u + p1 * u + p0, color=color, lw=1)
            if not row["flag"]:
                ax.scatter([row["n_opt"]], [row["loss_opt"]], color=color, marker="*", s=120, edgecolor="k")
    ax.set(xscale="log", xlabel="parameters N", ylabel=f"{fits['loss']} (nats/token)",
           title="isoFLOP curves (stars: parabola minima)")
    ax.legend(fontsize=7)
    names.append(_save(fig, out_dir / "isoflop.png"))

    fig, ax = plt.subplots(figsize=(7, 5))
    used = [row for row in iso.values() if not row["flag"]]
    if used:
        ax.scatter([r["budget"] for r in used], [r["loss_opt"] for r in used], color="k", label="isoFLOP minima")
    front = fits.get("approach2", {}).get("frontier")
    targets = [f["flops"] for f in fits.get("forecasts", [])]
    hi_c = max([float(budgets.max()), *targets])
    if front:
        grid = np.geomspace(float(budgets.min()), hi_c, 100)
        ax.plot(grid, front["L_inf"] + front["A"] * grid ** (-front["alpha"]), "C0",
                label=f"L(C) = {front['L_inf']:.3g} + A C^-{front['alpha']:.3g}")
    for f in fits.get("forecasts", []):
        q = f["loss_frontier"]
        if not _finite(q):
            continue
        ax.errorbar([f["flops"]], [q["estimate"]], yerr=[[q["estimate"] - q["lo95"]], [q["hi95"] - q["estimate"]]],
                    fmt="s", color="C3", capsize=4, label=f"forecast {f['flops']:.2g} (95 %)")
    hold = fits.get("holdout", {}).get("frontier")
    if hold and all(isinstance(hold.get(k), float) for k in ("predicted", "lo", "hi", "actual")):
        c = fits["holdout"]["held_out_budget"]
        ax.errorbar([c], [hold["predicted"]], yerr=[[hold["predicted"] - hold["lo"]], [hold["hi"] - hold["predicted"]]],
                    fmt="o", mfc="none", color="C1", capsize=4, label="held-out prediction")
        ax.scatter([c], [hold["actual"]], marker="x", color="C1", s=60, label="held-out actual")
    if not ax.has_data():
        _empty(ax, "no usable isoFLOP minima (see flags in fits.json)")
    else:
        ax.set(xscale="log")
        ax.legend(fontsize=7)
    ax.set(xlabel="compute C (FLOPs)", ylabel="best loss (nats/token)", title="compute-optimal frontier")
    names.append(_save(fig, out_dir / "frontier.png"))

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, key, label in ((axes[0], "n", "parameters N"), (axes[1], "d", "tokens D")):
        ax.scatter(runs[key], runs["resid3"], c=np.log10(runs["c"]), s=16)
        ax.axhline(0, color="k", lw=0.8)
        ax.set(xscale="log", xlabel=label)
    axes[0].set_ylabel("log L - log L(N, D) (approach 3)")
    fig.suptitle("approach-3 residuals (colour: log10 C)")
    names.append(_save(fig, out_dir / "residuals.png"))

    fig, ax = plt.subplots(figsize=(7, 5))
    a2 = fits.get("approach2", {})
    grid = np.geomspace(float(budgets.min()), hi_c, 100)
    for key, law, label, color in (("n_opt", a2.get("n_law"), "N*(C)", "C0"),
                                   ("d_opt", a2.get("d_law"), "D*(C)", "C2")):
        if law:
            ax.plot(grid, law["k"] * grid ** law["a"], color=color, label=f"{label} ∝ C^{law['a']:.3f}")
            pts = [r for r in used]
            ax.scatter([r["budget"] for r in pts], [r[key] for r in pts], color=color, s=18)
        for f in fits.get("forecasts", []):
            q = f[key]
            if not _finite(q):
                continue
            ax.errorbar([f["flops"]], [q["estimate"]], yerr=[[q["estimate"] - q["lo95"]], [q["hi95"] - q["estimate"]]],
                        fmt="s", color=color, capsize=4)
    if not ax.has_data():
        _empty(ax, "approach 2 not fitted (see flags in fits.json)")
    else:
        ax.set(xscale="log", yscale="log")
        ax.legend(fontsize=8)
    ax.set(xlabel="compute C (FLOPs)", ylabel="parameters / tokens",
           title="compute-optimal N*, D* with forecasts (95 %)")
    names.append(_save(fig, out_dir / "forecast.png"))
    return names
