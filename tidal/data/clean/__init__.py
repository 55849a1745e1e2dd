"""The ``clean`` step kind (``python -m tidal.data.clean``): ``step`` is the Beam pipeline and the
kind's ``run`` / ``summarize``; ``fns`` its DoFns and shard writers; ``record`` the per-record
rules; ``config`` the config models. The kind's names are re-exported here.

The config models are imported eagerly: the recipe composes them, and loading a recipe or
parsing a DAG file must not import Beam. Every other name (``run``, ``summarize``,
``STEP_VERSION``, ``clean``, ``shard_name`` ...) is :mod:`tidal.data.clean.step`'s, imported on
first use (PEP 562 module ``__getattr__``).
"""

from __future__ import annotations

import importlib
from typing import Any

from tidal.data.clean.config import CleanConfig, CleanSettings
from tidal.data.neardup_config import NearDupConfig

__all__ = ["CleanConfig", "CleanSettings", "NearDupConfig"]  # and every name of tidal.data.clean.step


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    step = importlib.import_module("tidal.data.clean.step")  # Beam; also sets this package's `step`
    if name == "step":
        return step
    try:
        return getattr(step, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
