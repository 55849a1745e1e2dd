"""The sizing check a GKE launch runs before it creates a pod or a JobSet (issue 40, item 7), and the figures
it leaves in the train step's record.

It compiles nothing, so it takes well under a second: a TPU slice's sizing comes from the sizing cache when
``tidal size`` compiled the same step there (:mod:`tidal.train.sizing`), else from the analytical plan of
:mod:`tidal.train.memory`, the verdict recipe validation already gave at plan time. A sizing that does not fit
stops the launch with one line (:class:`SizingRefused`) before any chip is booked. The ones that fit become
:func:`sizing_record`, which the prepare task hands to commit: ``step.json`` keeps it under
``provenance.sizing``, the step's MLflow run gets it as ``tidal.sizing.*`` tags, and ``tidal report`` shows
the predicted step time and MFU beside the measured ones.
"""

from __future__ import annotations

from typing import Any

from tidal.train.chips import UnknownChip
from tidal.train.sizing import Sizing, size_without_compiling


class SizingRefused(ValueError):
    """The train step does not fit its accelerator: the message is :meth:`tidal.train.sizing.Sizing.refusal_line`."""


def preflight(step: Any, recipe: Any) -> Sizing | None:
    """The sizing of train ``step`` (a planned :class:`tidal.steps.Step`) on ``recipe``'s accelerator without
    compiling: the cached compiled one when there is one, else the analytical one; None for a CPU run or a chip
    with no constants (nothing to size against).

    Raises:
        SizingRefused: it does not fit (one line: the chip, the figure, the largest part, what to change).
    """
    if recipe.train.resources.accelerator.kind not in ("tpu", "gpu"):
        return None
    try:
        sizing = size_without_compiling(step, recipe)
    except UnknownChip:
        return None
    if not sizing.fits:
        raise SizingRefused(sizing.refusal_line())
    return sizing


def sizing_record(sizing: Sizing) -> dict[str, Any]:
    """The figures a launch keeps (JSON): ``method`` (compiled or analytical), ``where``, ``mesh``, ``chips``,
    ``hbm_per_chip_bytes`` (the peak) and ``hbm_capacity_bytes``, ``predicted_step_s``, ``predicted_mfu`` and
    ``predicted_tokens_per_s`` (the roofline of :mod:`tidal.train.sizing`; an analytical sizing's from the
    traffic of :mod:`tidal.train.roofline`)."""
    out: dict[str, Any] = {"method": sizing.method, "where": sizing.where, "mesh": sizing.mesh, "chips": sizing.chips,
                           "hbm_per_chip_bytes": sizing.total_bytes, "hbm_capacity_bytes": sizing.chip.hbm_bytes}
    if sizing.refusal is None:
        p = sizing.predicted
        out |= {"predicted_step_s": p["step_s"], "predicted_mfu": p["mfu"], "predicted_tokens_per_s": p["tokens_per_s"]}
    return out
