"""Synthetic isoFLOP suites drawn from a known L(N, D), for testing the fits.

Parameter sets (nats/token, N parameters, D tokens):

* ``HOFFMANN``: Hoffmann et al. 2022, eq. (10): E = 1.69, A = 406.4, B = 410.7, α = 0.34, β = 0.28.
* ``EPOCH``: Besiroglu et al. 2024 (Epoch AI replication), Table 1: E = 1.82, A = 482.0,
  B = 2085.4, α = 0.3478, β = 0.3658.
"""

from __future__ import annotations

import numpy as np

from tidal.scaling.fits import Runs, optimal_allocation3

HOFFMANN = {"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28}
EPOCH = {"E": 1.82, "A": 482.0, "B": 2085.4, "alpha": 0.3478, "beta": 0.3658}


def synthetic_runs(law: dict[str, float], *, budgets=None, sizes_per_budget: int = 12, spread: float = 8.0,
                   noise: float = 0.02, seed: int) -> Runs:
    """An isoFLOP grid around the law's own optimum, losses with multiplicative noise.

    Args:
        law: ``{E, A, B, alpha, beta}``.
        budgets: FLOPs (default 13 budgets, 1e17 … 1e23, half a decade apart).
        sizes_per_budget: model sizes per budget, log-spaced over ``N_opt / spread … N_opt · spread``.
        noise: relative noise: ``loss = L(N, D) · (1 + noise · z)``, z standard normal.
        seed: numpy seed.

    Returns:
        :class:`Runs` with C = 6·N·D.
    """
    budgets = np.geomspace(1e17, 1e23, 13) if budgets is None else np.asarray(budgets, float)
    rng = np.random.default_rng(seed)
    n, d, c, b, names = [], [], [], [], []
    for budget in budgets:
        n_opt, _ = optimal_allocation3(law, budget)
        for j, size in enumerate(n_opt * np.geomspace(1 / spread, spread, sizes_per_budget)):
            n.append(size)
            d.append(budget / (6 * size))
            c.append(budget)
            b.append(budget)
            names.append(f"c{budget:.2g}-n{j}")
    n, d = np.array(n), np.array(d)
    true = law["E"] + law["A"] * n ** -law["alpha"] + law["B"] * d ** -law["beta"]
    loss = true * (1 + noise * rng.standard_normal(len(n)))
    return Runs.make(n, d, c, loss, b, names)
