"""The mixture table of a planned pipeline: per training source its tokens available, weight,
tokens taken, epochs and tokens unused (what ``tidal plan`` and ``tidal report`` print).

Tokens available are read from each committed tokenize step's ``meta.json`` (``n_sequences``, the
number the mix step itself reads); before a source is tokenized they are shown as unknown, never
estimated. Counts are :mod:`tidal.data.mix_sizing`'s, the arithmetic the mix step runs.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from tidal.data.mix_sizing import MixtureTable, plan_table


def mixture_table(pipe: Any, step_name: str = "mix") -> MixtureTable:
    """The table of the mix step ``step_name`` of ``pipe`` (a :class:`tidal.core.pipeline.Pipeline`).

    Reads only ``meta.json`` of the committed tokenize steps the mix step reads (a source whose
    tokenize step is not committed, or has no ``meta.json``, has ``available`` None) and, once the
    mix step is committed, the counts it took from its ``mixture.json``.
    """
    mix = pipe.graph[step_name]
    cfg = mix.config
    available: dict[str, int | None] = {}
    seq_len = None
    for src, name in cfg["inputs"].items():
        step = pipe.graph[name]
        seq_len = seq_len or step.config["seq_len"]
        available[src] = None
        if pipe.storage.is_committed(step.step_id):
            try:
                available[src] = int(json.loads(pipe.storage.read_text(step.step_id, "meta.json"))["n_sequences"])
            except FileNotFoundError:
                pass
    table = plan_table(cfg["weights"], int(seq_len), cfg.get("size"), cfg.get("n_sequences"), available)
    if pipe.storage.is_committed(mix.step_id):  # what the mix step took, not what it would take
        try:
            counts = json.loads(pipe.storage.read_text(mix.step_id, "mixture.json"))["counts"]
        except FileNotFoundError:
            return table
        table = replace(table, taken={src: counts.get(src) for src in table.taken})
    return table
