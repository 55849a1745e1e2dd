"""Pod entrypoint: ``python -m tidal.train STEP_DIR [--stop-after N] [--profile N]``.

Reads ``STEP_DIR/spec.json`` (written by :func:`tidal.train.run`) and trains, resuming from
the newest verified checkpoint in ``STEP_DIR/checkpoints``. The same command runs as a local
subprocess (:mod:`tidal.launch.local`), in a Kubernetes pod and, once per host, in a
multi-host JobSet (the environment says how to join: :mod:`tidal.train.distributed`).

``--profile N`` runs N steps from the initial state and writes ``STEP_DIR/profile.json``
(step time, tokens/s, MFU, peak memory) without reading or writing checkpoints, metrics or
the summary, so nothing is committed.

Exit codes: 0 done (``summary.json`` written, or stopped by ``--stop-after``, or profiled);
2 bad config or input data, or a checkpoint that does not fit the model (one
``tidal.train: error: ...`` line naming the file and the rule); 75 preempted by SIGTERM after
checkpointing the current step (rerun to resume); anything else is a crash with a traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, train (or profile), and return the process exit code."""
    parser = argparse.ArgumentParser(prog="python -m tidal.train", description=__doc__.splitlines()[0])
    parser.add_argument("step_dir", type=Path, help="step output directory holding spec.json")
    parser.add_argument("--stop-after", type=int, default=None,
                        help="testing aid: exit after completing this step (simulates preemption)")
    parser.add_argument("--profile", type=int, default=None, metavar="N",
                        help="run N steps and write profile.json (step time, tokens/s, memory); commit nothing")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stdout,
                        format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("tidal").setLevel(logging.INFO)
    from tidal.settings import SettingsError, entry_point
    from tidal.train.checkpoints import CheckpointMismatch
    from tidal.train.config import ConfigError
    from tidal.train.loader import DataContractError
    from tidal.train.preemption import EXIT_PREEMPTED, Preempted
    from tidal.train.profile import profile
    from tidal.train.trainer import load_spec, train

    try:
        with entry_point():
            return _run(args, load_spec, profile, train)
    except (ConfigError, DataContractError, CheckpointMismatch, SettingsError) as err:
        print(f"tidal.train: error: {err}", file=sys.stderr, flush=True)
        return 2
    except Preempted as err:
        print(f"tidal.train: {err}", file=sys.stderr, flush=True)
        return EXIT_PREEMPTED


def _run(args: argparse.Namespace, load_spec, profile, train) -> int:
    """Train or profile ``args.step_dir`` under the entry point's settings."""
    spec = load_spec(args.step_dir)
    if args.profile is not None:
        result = profile(args.step_dir, spec, args.profile)
        print(f"profile: {json.dumps({k: v for k, v in result.items() if k != 'environment_fingerprint'})}",
              flush=True)
    else:
        train(args.step_dir, spec, stop_after=args.stop_after)
    return 0


if __name__ == "__main__":
    sys.exit(main())
