"""What ``tidal size`` and ``tidal plan`` print about sizings (:mod:`tidal.train.sizing` computes them)."""

from __future__ import annotations

import json
import sys
from typing import Any

from tidal.train.chips import UnknownChip
from tidal.train.sizing import cached_record, libtpu_installed, request, size_pipeline, size_step


def print_sizings(pipe: Any, *, as_json: bool = False) -> int:
    """``tidal size``: size every train step of ``pipe`` (compiling when needed, progress on stderr), print the
    sizings (text, or JSON with ``as_json``) and one ``error:`` line on stderr per step that does not fit.

    Returns:
        The exit status: 0 when every step fits (or there is nothing to size), 1 otherwise.
    """
    sizings = size_pipeline(pipe, progress=lambda line: print(line, file=sys.stderr, flush=True))
    if as_json:
        print(json.dumps([s.as_json() for s in sizings], indent=1))
    elif not sizings:
        acc = pipe.recipe.train.resources.accelerator
        print(f"recipe {pipe.recipe.name}: training runs on {acc.kind}, nothing to size against (set "
              "train.resources.accelerator to a TPU slice or GPUs)")
    for sizing in sizings:
        if not as_json:
            print("\n".join(sizing.describe()))
        if not sizing.fits:
            print(f"error: {sizing.refusal_line()}", file=sys.stderr)
    return 0 if all(s.fits for s in sizings) else 1


def plan_lines(pipe: Any) -> list[str]:
    """The sizing section of ``tidal plan`` for a recipe on GKE: each train step's sizing when it costs
    nothing (a TPU sizing in the cache, a GPU's analytical one), else how to make it; ``[]`` for a local
    or CPU run. Never compiles: ``tidal size`` does, once per content."""
    recipe = pipe.recipe
    acc = recipe.train.resources.accelerator
    if recipe.train.resources.launcher != "gke" or acc.kind not in ("tpu", "gpu"):
        return []
    lines = ["sizing (tidal size):"]
    for step in pipe.graph:
        if step.kind != "train":
            continue
        model_cfg = step.typed_config.model.shape(recipe.tokenizer.vocab_size)
        try:
            req = request(step.typed_config, recipe.tokenizer.vocab_size, recipe.tokenize.seq_len - 1, acc)
        except UnknownChip as err:
            lines.append(f"  {step.name}: not sized: {err}")
            continue
        record = cached_record(req) if acc.kind == "tpu" else None
        if acc.kind == "tpu" and record is None:
            how = "compiles it ahead of time" if libtpu_installed() else "sizes it (make tpu-tools first to compile)"
            lines.append(f"  {step.name}: not sized yet for {acc.type} {acc.topology}: `tidal size` with this "
                         f"command's arguments {how}")
            continue
        if record is not None and "error" in record:
            lines.append(f"  {step.name}: {record['error']}")
            continue
        sizing = size_step(step.name, req, model_cfg, record=None if record is None else (record, True))
        lines.extend("  " + line for line in sizing.describe())
    return lines
