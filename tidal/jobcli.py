"""Run one step kind by hand: ``python -m tidal.data.<job> --config C --input NAME=DIR --out DIR``.

This is the standalone face of a step kind, for debugging a job outside Airflow and for
cluster runners. It builds the same :class:`~tidal.context.StepContext` the step runner
builds, but does not commit (no manifest, no ``_SUCCESS``): use ``tidal run`` for that.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from types import ModuleType

from tidal.context import StepContext


def main(module: ModuleType, kind: str, argv: list[str] | None = None) -> dict:
    """Parse the command line, run ``module.run`` once, print and return its summary.

    Raises:
        SystemExit: on a malformed ``--input`` (must be ``NAME=DIR``) or unreadable config.
    """
    parser = argparse.ArgumentParser(prog=f"python -m {module.__name__}", description=module.__doc__)
    parser.add_argument("--config", required=True, help="step config: a JSON file or inline JSON")
    parser.add_argument("--input", action="append", default=[], help="NAME=DIR of an input step's output")
    parser.add_argument("--out", required=True, type=Path, help="directory to write outputs into")
    parser.add_argument("--seed", type=int, default=0, help="step seed (normally derived from the recipe)")
    parser.add_argument("--name", default=kind, help="step name (default: the kind)")
    args = parser.parse_args(argv)
    text = Path(args.config).read_text() if Path(args.config).is_file() else args.config
    try:
        config = json.loads(text)
    except json.JSONDecodeError as err:
        parser.error(f"--config is neither a readable file nor valid JSON: {err}")
    inputs = {}
    for item in args.input:
        name, sep, path = item.partition("=")
        if not sep:
            parser.error(f"--input {item!r}: expected NAME=DIR")
        inputs[name] = Path(path)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    ctx = StepContext(
        step_id=f"{args.name}-manual", name=args.name, kind=kind, config=config,
        out_dir=args.out, inputs=inputs, input_ids={n: f"{n}-manual" for n in inputs}, seed=args.seed,
    )
    summary = module.run(ctx)
    print(json.dumps(summary, indent=1, sort_keys=True))
    return summary
