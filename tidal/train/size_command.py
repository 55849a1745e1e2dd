"""What ``tidal size`` and ``tidal plan`` print about sizings (:mod:`tidal.train.sizing` computes them)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from tidal.config import RecipeError
from tidal.train.chips import UnknownChip
from tidal.train.memory import default_mesh
from tidal.train.sizing import libtpu_installed, mesh_dict, size_pipeline, size_without_compiling


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
    """The sizing section of ``tidal plan`` for a recipe on GKE: each train step's sizing, the compiled one
    when the cache holds it, else the analytical one and, for a TPU slice, how to compile it; ``[]`` for a
    local or CPU run. Never compiles: ``tidal size`` does, once per content."""
    recipe = pipe.recipe
    acc = recipe.train.resources.accelerator
    if recipe.train.resources.launcher != "gke" or acc.kind not in ("tpu", "gpu"):
        return []
    lines = ["sizing (tidal size):"]
    for step in pipe.graph:
        if step.kind != "train":
            continue
        try:
            sizing = size_without_compiling(step, recipe)
        except UnknownChip as err:
            lines.append(f"  {step.name}: not sized: {err}")
            continue
        lines.extend("  " + line for line in sizing.describe())
        if acc.kind == "tpu" and sizing.method == "analytical":  # the compiler's sizing is one command away
            how = "compiles it ahead of time" if libtpu_installed() else "compiles it (make tpu-tools first)"
            lines.append(f"  not compiled yet for {acc.type} {acc.topology}: `tidal size` with this command's "
                         f"arguments {how}")
    return lines


def print_search(pipe: Any, *, recipe_path: str, write: Callable[..., bool] | None = None,
                 overrides: dict[str, Any] | None = None, as_json: bool = False) -> int:
    """``tidal size --search``: rank the meshes and microbatch counts of every train step on its slice
    (:func:`tidal.train.mesh_search.search_step`) and print them; with ``write``
    (:func:`tidal.recipe.edit.write_train_mesh`), put the best one into the recipe file (one train step only,
    and no ``--set`` but ``train.mesh.*``, which constrains the search).

    Returns:
        0 when a configuration fits every step, 1 otherwise (one ``error:`` line per step).

    Raises:
        RecipeError: the search cannot run here, or ``--write`` cannot edit the file.
    """
    from tidal.train import mesh_search

    others = sorted(k for k in (overrides or {}) if not k.startswith("train.mesh."))
    if write and others:
        raise RecipeError(f"--write edits {recipe_path}: set {', '.join(others)} in the file first (only "
                          "--set train.mesh.* may stay on the command line: it fixes an axis of the search)")
    recipe = pipe.recipe
    steps = [step for step in pipe.graph if step.kind == "train"]
    if write and len(steps) != 1:
        raise RecipeError(f"--write edits the recipe's train section, and {recipe_path} has {len(steps)} train "
                          "steps: write the chosen mesh of each into its suite by hand")
    progress = lambda line: print(line, file=sys.stderr, flush=True)
    found = []
    for step in steps:
        model_cfg = step.typed_config.model.shape(recipe.tokenizer.vocab_size)
        found.append((step.name, mesh_search.search_step(
            step.name, step.typed_config, recipe.tokenizer.vocab_size, recipe.tokenize.seq_len - 1,
            recipe.train.resources.accelerator, model_cfg, progress=progress)))
    if as_json:
        print(json.dumps([{"step": name, "candidates": [c.as_json() for c in cands]} for name, cands in found],
                         indent=1))
    status = 0
    for name, cands in found:
        if not as_json:
            print("\n".join(mesh_search.describe(name, cands)))
        if not cands or not cands[0].fits:
            print(f"error: {name}: no mesh and microbatch count of the slice fits; the smallest tried: "
                  f"{min(cands, key=lambda c: c.sizing.total_bytes if c.sizing else float('inf')).as_json()['mesh']}"
                  "; use a larger topology or a smaller model or batch", file=sys.stderr)
            status = 1
    if write and status == 0:
        best = found[0][1][0]
        default = mesh_dict(default_mesh(best.sizing.chips, recipe.train.resources.accelerator.slices, None))
        if write(recipe_path, best.mesh, best.microbatches, default):
            print(f"wrote train.mesh {best.mesh} (and train.microbatches {best.microbatches} where it is not 1 or the "
                  f"file names a count) to {recipe_path}: the mesh is hashed, so the train step has a new id",
                  file=sys.stderr)
        else:
            print(f"{recipe_path} unchanged: the best is what it already says, or the mesh the trainer derives with "
                  "one microbatch", file=sys.stderr)
    return status
