"""What every mix step writes and returns, copied or load-time: ``mixture.json`` and the step's metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tidal.data.mix_sizing import MixtureTable, epochs

MIXTURE_FILE = "mixture.json"


def write_mixture(out_dir: Path, mixture: dict[str, Any], size: Any, counts: dict[str, int],
                  available: dict[str, int]) -> None:
    """Write ``mixture.json``: ``mixture`` plus, for a ``token_budget`` size only (so smallest_source outputs keep
    their bytes), ``size`` (the config) and ``epochs`` (count / available per source)."""
    if size.mode == "token_budget":
        mixture = {**mixture, "size": size.model_dump(),
                   "epochs": {src: epochs(counts[src], available[src]) for src in mixture["sources"]}}
    (Path(out_dir) / MIXTURE_FILE).write_text(json.dumps(mixture, indent=1, sort_keys=True) + "\n")


def mix_metrics(table: MixtureTable, counts: dict[str, int], seq_len: int) -> dict[str, Any]:
    """``{"n_sequences", "n_tokens", "tokens_unused", "sequences/<src>", "epochs/<src>", "tokens_unused/<src>"}``
    (tokens unused: a source's tokens never taken) from the mixture table with the counts taken."""
    rows = {r["source"]: r for r in table.rows()}
    total = sum(counts.values())
    sources = sorted(counts)
    return {
        "n_sequences": total,
        "n_tokens": total * seq_len,
        "tokens_unused": sum(r["tokens_unused"] for r in rows.values()),
        **{f"sequences/{s}": counts[s] for s in sources},
        **{f"epochs/{s}": rows[s]["epochs"] for s in sources},
        **{f"tokens_unused/{s}": rows[s]["tokens_unused"] for s in sources},
    }
