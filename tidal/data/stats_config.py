"""The stats step's config (:class:`StatsConfig`). Light on purpose (no numpy, no pyarrow): the
planner parses every step's config into its model (:mod:`tidal.core.plans`)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_serializer

from tidal.config import Strict, omit_unused


class StatsConfig(Strict):
    """The stats step: which committed steps to read (the planner names every source's)."""

    clean: dict[str, str] = Field(default_factory=dict, description="source name -> its clean step")
    tokenize: dict[str, str] = Field(default_factory=dict, description="source name -> its tokenize step")
    mix: str | None = Field(default=None, description="the mix step (null: no mixture rows)")
    decontaminate: dict[str, str] = Field(default_factory=dict,
                                          description="training source -> its decontaminate step (none: no rows)")

    @model_serializer(mode="wrap")
    def _omit_unset(self, handler: Any) -> dict[str, Any]:
        # no decontaminate step: the key stays out of the config, as the planner leaves it (ids unchanged)
        return omit_unused(handler(self), {"decontaminate": {}})


__all__ = ["StatsConfig"]
