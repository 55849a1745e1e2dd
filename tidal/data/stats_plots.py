"""``stats.png``: the stats step's picture, drawn from its own rows (source, metric, value).

Three panels, one bar group per source (``all`` left out): packed tokens per tokenized source;
kept document length in characters (p10/p50/p90/p99, log scale) per cleaned source; documents
kept, filtered, duplicate and quarantined per cleaned source (stacked). A pure function of the
rows, written with :func:`tidal.plots.save_png` (same rows, same bytes).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

STATS_PNG = "stats.png"
OUTCOMES = ("documents_kept", "documents_filtered", "documents_duplicate", "documents_quarantined")
QUANTILE_KEYS = ("chars_p10", "chars_p50", "chars_p90", "chars_p99")


def write_stats_plot(rows: list[tuple[str, str, float]], out: str | Path, all_name: str = "all") -> Path:
    """Draw the three panels of the module docstring from ``rows`` into ``out`` (PNG); a panel whose
    metrics no source has says so instead of drawing bars. Returns ``out``."""
    from tidal.plots import pyplot, save_png

    table: dict[str, dict[str, float]] = {}
    for source, metric, value in rows:
        if source != all_name:
            table.setdefault(source, {})[metric] = float(value)
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2))

    def sources_with(*keys: str) -> list[str]:
        return sorted(s for s, m in table.items() if any(k in m for k in keys))

    ax = axes[0]
    tok = sources_with("tokens")
    if tok:
        ax.bar(tok, [table[s].get("tokens", 0.0) for s in tok], color="tab:blue")
    ax.set_title("tokens per source")
    ax.set_ylabel("packed tokens")

    ax = axes[1]
    clean = sources_with(*QUANTILE_KEYS)
    width = 0.8 / len(QUANTILE_KEYS)
    for i, key in enumerate(QUANTILE_KEYS):
        values = [max(table[s].get(key, 0.0), 1.0) for s in clean]
        if clean:
            ax.bar(np.arange(len(clean)) + (i - 1.5) * width, values, width, label=key.removeprefix("chars_"))
    ax.set_xticks(np.arange(len(clean)), clean)
    if clean:
        ax.set_yscale("log")
        ax.legend(fontsize=8, title="percentile", title_fontsize=8)
    ax.set_title("kept document length")
    ax.set_ylabel("characters")

    ax = axes[2]
    docs = sources_with(*OUTCOMES)
    bottom = np.zeros(len(docs))
    for key in OUTCOMES:
        values = np.array([table[s].get(key, 0.0) for s in docs])
        if docs:
            ax.bar(docs, values, bottom=bottom, label=key.removeprefix("documents_"))
        bottom += values
    if docs:
        ax.legend(fontsize=8)
    ax.set_title("documents per source")
    ax.set_ylabel("documents")
    for ax, have in zip(axes, (tok, clean, docs), strict=True):
        if not have:
            ax.text(0.5, 0.5, "no rows", ha="center", va="center", transform=ax.transAxes)
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    return save_png(fig, out)
