"""The runs a scaling fit reads, validated: :class:`Runs` and :class:`ScalingFitError`.

Inputs are arrays over runs, one entry per trained model: ``n`` parameters (N), ``d`` trained
tokens (D), ``c`` training FLOPs (C), ``loss`` (nats per token) and ``budget`` (the nominal
compute budget the run belongs to, FLOPs; runs of one isoFLOP curve share it).

Degenerate input is never fitted silently: NaN/inf or non-positive values raise
:class:`ScalingFitError` naming the runs; a budget with fewer than three distinct sizes, a
non-convex isoFLOP parabola, or a vertex outside the sampled sizes is *flagged* and left out of
the power laws and the frontier (``flags`` lists why); too few usable budgets raise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class ScalingFitError(ValueError):
    """The runs cannot be fitted (NaN, non-positive values, too few usable budgets); the
    message names the runs or budgets and the rule."""


@dataclass(frozen=True)
class Runs:
    """Finished runs of a suite as parallel float arrays of shape ``[n_runs]``.

    Attributes:
        n: parameters; d: trained tokens; c: training FLOPs; loss: nats/token;
        budget: nominal compute budget (FLOPs) of the isoFLOP curve the run belongs to;
        names: run (step) names, for error messages.
    """

    n: np.ndarray
    d: np.ndarray
    c: np.ndarray
    loss: np.ndarray
    budget: np.ndarray
    names: tuple[str, ...] = ()

    @classmethod
    def make(cls, n, d, c, loss, budget, names=None) -> Runs:
        """Validate and build.

        Raises:
            ScalingFitError: arrays of different lengths, NaN/inf, or values <= 0, naming runs.
        """
        arrays = [np.asarray(x, dtype=float).ravel() for x in (n, d, c, loss, budget)]
        size = len(arrays[0])
        names = tuple(names) if names is not None else tuple(f"run{i}" for i in range(size))
        if any(len(a) != size for a in arrays) or len(names) != size:
            raise ScalingFitError(f"runs: arrays have different lengths {[len(a) for a in arrays]}")
        if size == 0:
            raise ScalingFitError("runs: no runs to fit")
        for label, arr in zip(("N", "D", "C", "loss", "budget"), arrays, strict=True):
            bad = [names[i] for i in np.flatnonzero(~np.isfinite(arr) | (arr <= 0))]
            if bad:
                raise ScalingFitError(f"runs: {label} is NaN, infinite or <= 0 for runs {bad}; "
                                      "fix or drop them before fitting")
        return cls(*arrays, names=names)

    def take(self, index: np.ndarray) -> Runs:
        """The runs at ``index`` (may repeat: a bootstrap resample)."""
        return Runs(self.n[index], self.d[index], self.c[index], self.loss[index], self.budget[index],
                    tuple(self.names[i] for i in index))

    @property
    def budgets(self) -> np.ndarray:
        """Distinct nominal budgets, ascending."""
        return np.unique(self.budget)

    @property
    def c_per_nd(self) -> float:
        """Median of C / (N·D): 6 for the Kaplan count; the constant turning C into N·D."""
        return float(np.median(self.c / (self.n * self.d)))
