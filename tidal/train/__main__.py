"""Pod entrypoint: ``python -m tidal.train STEP_DIR [--stop-after N]``.

Reads ``STEP_DIR/spec.json`` (written by :func:`tidal.train.run`) and trains, resuming from
the newest verified checkpoint in ``STEP_DIR/checkpoints``. The same command runs as a local
subprocess (:mod:`tidal.launch.local`) and in a Kubernetes pod.

Exit codes: 0 done (``summary.json`` written, or stopped by ``--stop-after``); 2 bad config
or input data (one ``tidal.train: error: ...`` line naming the file and the rule); anything
else is a crash with a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, train, and return the process exit code."""
    parser = argparse.ArgumentParser(prog="python -m tidal.train", description=__doc__.splitlines()[0])
    parser.add_argument("step_dir", type=Path, help="step output directory holding spec.json")
    parser.add_argument("--stop-after", type=int, default=None,
                        help="testing aid: exit after completing this step (simulates preemption)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stdout,
                        format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("tidal").setLevel(logging.INFO)
    from tidal.train.loader import DataContractError
    from tidal.train.trainer import ConfigError, load_spec, train

    try:
        spec = load_spec(args.step_dir)
        train(args.step_dir, spec, stop_after=args.stop_after)
    except (ConfigError, DataContractError) as err:
        print(f"tidal.train: error: {err}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
