"""Small slices of the tiny recipe on the real corpora, for end-to-end tests."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.conftest import TINY


def write_slice_recipe(path: Path, storage: Path, name: str = "tiny_ci", scale: int = 1) -> Path:
    """Write a variant of recipes/tiny.yaml with smaller sources, vocab and training.

    ``scale`` multiplies the document slices (1: about 10 s of data steps on 2 cores).
    """
    data = yaml.safe_load(TINY.read_text())
    data["name"] = name
    data["sources"]["brown"]["max_documents"] = 60 * scale
    data["sources"]["gcide"]["max_documents"] = 2000 * scale
    data["sources"]["songci"]["max_documents"] = 1500 * scale
    data["tokenizer"]["vocab_size"] = 1024
    data["evaluation"]["heldout"] = {"fraction": 0.1}  # 2% of 60 Brown documents could be none
    # no eval step: the slices test data, training, Airflow and the cluster (and keep their cost); the eval
    # step is tested on its own (tests/eval) and runs in make demo
    data["evaluation"].pop("downstream", None)
    data["gate"]["min_total_tokens"] = 50_000
    data["gate"]["mixture_tolerance"] = 0.02
    data["train"].update(steps=60, checkpoint_every=20, eval_every=30, log_every=10, batch_size=8)
    data["train"]["model"] = {"d_model": 64, "n_layers": 2, "n_heads": 4, "d_ff": 256}
    data["storage_root"] = str(storage)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
