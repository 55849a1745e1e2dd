"""The smallest real recipe for operations tests: Brown (train) and UDHR (held out), tiny training.

Built from tests/e2e/slices.py (the tiny recipe on slices of the real corpora) with two sources
instead of four, so a DAG has 11 step tasks and a run takes about a minute of compute on 2 cores.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.e2e.slices import write_slice_recipe


def write_ops_recipe(path: Path, storage: Path, name: str = "ops_ci", **extra: Any) -> Path:
    """Write the two-source slice recipe to ``path``; ``extra`` sets top-level fields (schedule, baseline)."""
    write_slice_recipe(path, storage, name=name)
    data = yaml.safe_load(path.read_text())
    data["sources"] = {"brown": data["sources"]["brown"], "udhr": data["sources"]["udhr"]}
    data["sources"]["udhr"]["max_documents"] = 20
    data["mixture"] = {"weights": {"brown": 1.0}, "shards": 1}
    data["clean"]["shards"] = 1
    data["tokenize"]["shards"] = 1
    data["gate"]["min_total_tokens"] = 10_000
    data["train"].update(steps=10, checkpoint_every=5, eval_every=5, log_every=5, batch_size=4, eval_batches=1)
    data["train"]["model"] = {"d_model": 32, "n_layers": 1, "n_heads": 2, "d_ff": 64}
    data["train"]["optimizer"]["warmup_steps"] = 2
    data.update(extra)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
