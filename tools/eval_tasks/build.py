"""Regenerate tidal/eval/tasks/ from a recipe's own clean steps (default recipes/tiny.yaml).

    .venv/bin/python tools/eval_tasks/build.py [--recipe recipes/tiny.yaml] [--storage-root DIR]

Runs (or reuses, when committed) the recipe's fetch and clean steps of ``brown`` and ``udhr``, then
``tidal.eval.build_tasks.build`` with the recipe's held-out split (seed, ``evaluation.heldout.fraction``).
Same recipe, same task files, byte for byte. Commit the changed files: their hashes are the eval step's.
"""

from __future__ import annotations

import argparse
import sys

from tidal.core.pipeline import Pipeline
from tidal.core.runner import run_step
from tidal.data.heldout import HeldoutSplit
from tidal.eval.build_tasks import TASKS_DIR, build


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="recipes/tiny.yaml")
    parser.add_argument("--storage-root", default=None)
    args = parser.parse_args(argv)
    pipe = Pipeline.load(args.recipe, storage_root=args.storage_root)
    if pipe.recipe.heldout_fraction is None:
        print(f"error: {args.recipe}: evaluation.heldout: needed (the Brown tasks use its held-out documents)")
        return 2
    for name in ("fetch-brown", "clean-brown", "fetch-udhr", "clean-udhr"):
        run_step(pipe.graph[name], pipe.storage)
    split = HeldoutSplit(fraction=pipe.recipe.heldout_fraction, seed=pipe.recipe.seed)
    names = build(pipe.storage.step_dir(pipe.graph["clean-brown"].step_id),
                  pipe.storage.step_dir(pipe.graph["clean-udhr"].step_id), split, TASKS_DIR)
    print("\n".join(names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
