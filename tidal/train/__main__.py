"""Pod entrypoint: ``python -m tidal.train STEP_DIR [--stop-after N] [--profile N]``.

Reads ``STEP_DIR/spec.json`` (written by :func:`tidal.train.run`) and trains, resuming from
the newest verified checkpoint in ``STEP_DIR/checkpoints``. The same command runs as a local
subprocess (:mod:`tidal.launch.local`), in a Kubernetes pod and, once per host, in a
multi-host JobSet (the environment says how to join: :mod:`tidal.train.distributed`).

``STEP_DIR`` may be a bucket URI, the step's staging location (:mod:`tidal.storage.staging`):
then process 0 first takes the step's training lease in the bucket (:mod:`tidal.train.fence`: one
trainer per step at a time, across nodes; checked before every checkpoint upload), ``spec.json`` is
downloaded from it, training runs in a local work directory of this process
(``$TIDAL_STORAGE_CACHE/.resume/{step_id}``, emptied first: nothing an earlier process left on
this machine is trusted), inputs are read in place from the bucket, every checkpoint is uploaded
to the staging location as it is saved (in a multi-process run every process writes its own shards
there, :mod:`tidal.train.shards`) and a rerun on any node resumes from the newest one there
that verifies (:mod:`tidal.train.mirror`), and a finished run seals its outputs (the kind's
checks, ``manifest.json``) and uploads them to the staging location, ``manifest.json`` last, for
the commit task; the checkpoints already there are not sent again. Nothing is read from, or left
for another task on, this machine's disk.

``--profile N`` runs N steps from the initial state and writes ``STEP_DIR/profile.json``
(step time, tokens/s, MFU, peak memory) without reading or writing checkpoints, metrics or
the summary, so nothing is committed.

Exit codes: 0 done (``summary.json`` written, or stopped by ``--stop-after``, or profiled);
2 bad config or input data, or a checkpoint that does not fit the model (one
``tidal.train: error: ...`` line naming the file and the rule); 3 another process trains this step (one
line naming it; it held the training lease for 1.5x ``TIDAL_TRAIN_LEASE_TTL_S``, or took it over from this
one); 75 preempted by SIGTERM after
checkpointing the current step (rerun to resume); 76 no step finished for
``TIDAL_TRAIN_WATCHDOG_S`` seconds (stacks dumped; :mod:`tidal.train.watchdog`); 1 a checkpoint could not be saved (one
``tidal.train: error:`` line naming it and the cause; rerun to resume from the newest one that
was; it exits at once, not after orbax's 300 s wait for the failed save's signals), or the divergence guard
stopped the run (one line: step, loss, verdict, batch); anything else
is a crash with a traceback. In a multi-process run every failure exits at once, without jax's
shutdown barrier (which would wait for a peer that is gone); an unexpected one (a collective whose peer
died) prints its traceback and one ``error:`` line and exits 1. A peer that stops without closing its
connections is declared gone after ``TIDAL_TRAIN_PEER_TIMEOUT_S`` (default 100 s) of missed heartbeats.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import traceback
from pathlib import Path

from tidal.context import is_uri
from tidal.settings import SettingsError, current, entry_point
from tidal.storage import StorageError, staging, uris
from tidal.storage.layout import SPEC_JSON as SPEC_NAME
from tidal.storage.layout import SUMMARY_JSON as SUMMARY_NAME
from tidal.train.config import ConfigError
from tidal.train.distributed import launch_from_env
from tidal.train.divergence import Diverged
from tidal.train.loader import DataContractError
from tidal.train.mirror import CHECKPOINT_DIR, MANIFEST_DIR


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, train (or profile), and return the process exit code."""
    parser = argparse.ArgumentParser(prog="python -m tidal.train", description=__doc__.splitlines()[0])
    parser.add_argument("step_dir", help="step output directory holding spec.json, or its staging URI in the bucket")
    parser.add_argument("--stop-after", type=int, default=None,
                        help="testing aid: exit after completing this step (simulates preemption)")
    parser.add_argument("--profile", type=int, default=None, metavar="N",
                        help="run N steps and write profile.json (step time, tokens/s, memory); commit nothing")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stdout,
                        format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("tidal").setLevel(logging.INFO)
    from tidal.train.preemption import EXIT_PREEMPTED

    code = _exit_code(args)
    if code not in (0, EXIT_PREEMPTED) and (_multi_process() or _save_failed):
        # jax's shutdown barrier would wait for a peer that may be gone (up to its heartbeat timeout); after a
        # failed save, orbax's signalling threads (not daemons: the interpreter joins them at exit) wait 300 s
        # for the step directory that was never created. Nothing is left to flush but our own streams.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


_save_failed = False  # set by _exit_code: the process exits without joining orbax's threads (see main)


def _multi_process() -> bool:
    try:
        return launch_from_env().mode != "single"
    except ValueError:
        return False


def _exit_code(args: argparse.Namespace) -> int:
    """Train or profile; map each known failure to its exit code and one ``error:`` line."""
    from tidal.storage.lease import LeaseLost
    from tidal.train.checkpoints import CheckpointMismatch, CheckpointSaveFailed
    from tidal.train.fence import EXIT_HELD, TrainingHeld
    from tidal.train.preemption import EXIT_PREEMPTED, Preempted
    from tidal.train.profile import profile
    from tidal.train.trainer import load_spec, train

    try:
        with entry_point():
            return _run(args, load_spec, profile, train)
    except (ConfigError, DataContractError, CheckpointMismatch, SettingsError, StorageError) as err:
        print(f"tidal.train: error: {err}", file=sys.stderr, flush=True)
        return 2
    except (NotADirectoryError, IsADirectoryError, PermissionError) as err:  # STEP_DIR is not a step directory
        print(f"tidal.train: error: {args.step_dir}: {err.strerror or err} ({err.filename}); give the step "
              "directory holding spec.json, or its staging URI", file=sys.stderr, flush=True)
        return 2
    except Preempted as err:
        print(f"tidal.train: {err}", file=sys.stderr, flush=True)
        return EXIT_PREEMPTED
    except (TrainingHeld, LeaseLost) as err:
        print(f"tidal.train: error: {err}", file=sys.stderr, flush=True)
        return EXIT_HELD
    except CheckpointSaveFailed as err:
        if isinstance(err.__cause__, LeaseLost):  # fenced: another process took the step over
            print(f"tidal.train: error: {err.__cause__}", file=sys.stderr, flush=True)
            return EXIT_HELD
        global _save_failed
        _save_failed = True
        print(f"tidal.train: error: {err}", file=sys.stderr, flush=True)
        return 1
    except Diverged as err:
        print(f"tidal.train: error: {err}", file=sys.stderr, flush=True)
        return 1
    except Exception as err:
        if not _multi_process():
            raise
        import jax

        traceback.print_exc()
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(f"tidal.train: error: process {jax.process_index()} of {jax.process_count()}: {type(err).__name__}: "
              f"{first}; in a multi-process run this is most often a peer process gone (see its log): rerun every "
              "process, they resume from the newest checkpoint that counts", file=sys.stderr, flush=True)
        return 1


def _run(args: argparse.Namespace, load_spec, profile, train) -> int:
    """Train or profile ``args.step_dir`` under the entry point's settings."""
    location = args.step_dir
    fence = _hold(location) if is_uri(location) and args.profile is None else None
    try:
        return _train_or_profile(args, location, fence, load_spec, profile, train)
    finally:
        if fence is not None:
            fence.release()


def _hold(location: str):
    """Process 0 of the run takes the step's training lease (:mod:`tidal.train.fence`) before anything
    is written; None in the other processes."""
    from tidal.train import distributed
    from tidal.train.fence import hold

    distributed.start_once()
    return hold(location) if distributed.is_primary() else None


def _train_or_profile(args: argparse.Namespace, location: str, fence, load_spec, profile, train) -> int:
    step_dir = _local_work_dir(location) if is_uri(location) else Path(location)
    spec = load_spec(step_dir)
    if args.profile is not None:
        result = profile(step_dir, spec, args.profile)
        print(f"profile: {json.dumps({k: v for k, v in result.items() if k != 'environment_fingerprint'})}",
              flush=True)
        return 0
    train(step_dir, spec, stop_after=args.stop_after, mirror=location if is_uri(location) else None,
          fence=fence.check if fence is not None else None)
    if fence is not None:
        fence.check()  # still this process's step before its outputs are staged
    if is_uri(location) and (step_dir / SUMMARY_NAME).is_file():
        from tidal.train.shards import committed_entries  # heavy (TensorStore), like _exit_code's imports

        # a bucket run's checkpoints are in the bucket only, each object hashed by the process that wrote it
        staging.seal(spec["kind"], spec["config"], step_dir, step_id=spec["step_id"], where="the training run",
                     remote=committed_entries(location))

        staging.stage(step_dir, location, uploaded=(f"{CHECKPOINT_DIR}/", f"{MANIFEST_DIR}/"))
    return 0


def _local_work_dir(location: str) -> Path:
    """This machine's work directory for the step staged at ``location``, holding its ``spec.json``.

    Raises:
        ConfigError: ``spec.json`` is not there (prepare did not run, or the URI is wrong).
    """
    try:
        text = uris.read_bytes(uris.join(location, SPEC_NAME))
    except FileNotFoundError:
        raise ConfigError(f"{location}: no {SPEC_NAME} (run the step's prepare task first)") from None
    try:
        step_id = json.loads(text)["step_id"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as err:
        raise ConfigError(f"{uris.join(location, SPEC_NAME)}: not a spec written by the step's prepare task "
                          f"({type(err).__name__}: {err})") from None
    base = Path(current().storage_cache or "~/.cache/tidal/storage").expanduser()
    work_dir = base / ".resume" / step_id
    import shutil

    shutil.rmtree(work_dir, ignore_errors=True)  # this process's scratch: it resumes from the bucket
    work_dir.mkdir(parents=True, exist_ok=True)
    (work_dir / SPEC_NAME).write_bytes(text)
    return work_dir


if __name__ == "__main__":
    sys.exit(main())
