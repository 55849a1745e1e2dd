"""Deterministic PNG figures (matplotlib, Agg backend): what every step that draws one uses.

Invariant (determinism: same recipe, same bytes): a PNG written by :func:`save_png` is a pure
function of the figure. Matplotlib writes a ``Software`` tEXt chunk naming its version, and a PNG
has no date chunk unless asked; :func:`save_png` drops the first and asks for none, at a fixed
dpi, so a committed step's figure hashes the same on every run of the same matplotlib (the
rendering itself may differ across matplotlib/FreeType versions, which the environment
fingerprint pins).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

DPI = 100
PNG_METADATA = {"Software": None}  # matplotlib.backends.backend_agg.print_png: None drops a key


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig: Any, path: str | Path, dpi: int = DPI) -> Path:
    """Lay out ``fig``, write it to ``path`` as a PNG (``dpi`` dots per inch) without a version or
    date chunk, close it.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=dpi, metadata=PNG_METADATA)
    pyplot().close(fig)
    return path
