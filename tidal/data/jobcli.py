"""Run one step kind by hand: ``python -m tidal.data.<job> --config C --input NAME=DIR --out DIR``.

This is the standalone face of a step kind, for debugging a job outside Airflow and for
cluster runners. It builds the same :class:`~tidal.context.StepContext` the step runner
builds, but does not commit (no manifest, no ``_SUCCESS``): use ``tidal run`` for that, or
the Beam provider path (:mod:`tidal.core.beam_job`), which runs this command and commits.

Every location may be a bucket URI (how the Beam provider's prepare task hands them over,
:mod:`tidal.core.beam_job`): ``--config s3://…/config.json`` is read from the bucket,
``--input NAME=s3://…/{step_id}/`` is read in place (or downloaded, verified, into this
process's cache when the kind needs a local copy), and ``--out s3://…/.staging/…/`` makes the job
compute in a local scratch directory, seal it (the kind's output checks, ``manifest.json``),
upload it there and write its summary to ``….job/summary.json`` for the commit task. The Beam
jobs (clean, tokenize) do not compute locally: their workers, on whatever machines the runner
uses, write the outputs to that staging location and spill files under ``….job/spill/``; the
job then checks them in place and writes ``manifest.json`` from the workers' checksum records
(:func:`tidal.storage.staging.seal_staged`).

Other ``--options`` of a Beam job (clean, tokenize) are Beam pipeline options
(``--runner=DataflowRunner --project=P``); they are added after ``$TIDAL_BEAM_ARGS``
(:mod:`tidal.data.beam_options`; later wins) and never enter the step config.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shlex
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import ValidationError

from tidal.config import problems
from tidal.context import SPILL_PREFIX, MissingInput, StepContext, is_uri
from tidal.kinds import BEAM_KINDS, kind_spec
from tidal.settings import current, entry_point
from tidal.storage import StorageError, StorageSettings, open_storage, staging, uris
from tidal.storage.uris import storage_hint


class _Parser(argparse.ArgumentParser):
    """argparse, but a refusal is one line: ``error: python -m tidal.data.KIND: MESSAGE (see --help)``."""

    def error(self, message: str):
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def _seed(text: str) -> int:
    """An argparse type: a step seed is an integer >= 0 (:func:`tidal.steps.derive_seed` gives 63 bits)."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"a step seed is an integer >= 0, got {value}")
    return value


def main(module: ModuleType, kind: str, argv: list[str] | None = None) -> dict:
    """Parse the command line, run ``module.run`` once, print and return its summary.

    Raises:
        SystemExit: on a malformed ``--input`` (must be ``NAME=DIR``), a missing or unreadable
            config, a config the kind's model refuses (one line naming each key and rule, no
            traceback), or unknown arguments to a job that is not a Beam job.
    """
    prog = f"python -m {kind_spec(kind).module}"  # the command a user types (not tidal.data.clean.step)
    parser = _Parser(prog=prog, description=module.__doc__, allow_abbrev=False)
    parser.add_argument("--config", required=True, help="step config: a JSON file, its bucket URI, or inline JSON")
    parser.add_argument("--input", action="append", default=[],
                        help="NAME=DIR or NAME=URI of an input step's committed output")
    parser.add_argument("--out", required=True,
                        help="directory to write outputs into, or the staging URI to upload them to")
    parser.add_argument("--seed", type=_seed, default=None,
                        help="step seed, derived from the recipe seed and the step name (`tidal explain STEP` prints "
                             "it as 'step seed'); required by kinds that draw random numbers, refused by the others")
    parser.add_argument("--name", default=kind, help="step name (default: the kind)")
    args, pipeline_args = parser.parse_known_args(argv)
    seeded = kind_spec(kind).seeded
    if seeded and args.seed is None:
        parser.error(f"--seed is required: a {kind} step draws random numbers and never defaults its seed")
    if not seeded and args.seed is not None:
        parser.error(f"--seed: a {kind} step draws no random numbers and takes no seed")
    if pipeline_args and (kind not in BEAM_KINDS or any(not a.startswith("--") for a in pipeline_args)):
        parser.error(f"unrecognized arguments: {' '.join(pipeline_args)} (only the Beam jobs "
                     f"{', '.join(sorted(BEAM_KINDS))} take --pipeline_options)")
    if is_uri(args.config):
        try:
            text = uris.read_bytes(args.config).decode()
        except (FileNotFoundError, StorageError) as err:
            parser.error(f"--config {args.config}: {err}")
    elif Path(args.config).is_file():
        text = Path(args.config).read_text()
    elif not args.config.lstrip().startswith(("{", "[")):
        parser.error(f"--config {args.config}: file not found (give a JSON file or inline JSON)")
    else:
        text = args.config
    try:  # the config's one parse: its model's JSON -> the model every part of the job reads
        config = kind_spec(kind).parse_config(text)
    except ValidationError as err:
        invalid = [e["msg"] for e in err.errors() if e["type"] == "json_invalid"]
        if invalid:
            parser.error(f"--config is neither a readable file nor valid JSON: {invalid[0]}")
        parser.error(f"--config: {config_problems(err)}")
    except json.JSONDecodeError as err:  # a kind without a config model
        parser.error(f"--config is neither a readable file nor valid JSON: {err}")
    inputs = {}
    for item in args.input:
        name, sep, path = item.partition("=")
        if not sep:
            parser.error(f"--input {item!r}: expected NAME=DIR")
        inputs[name] = path if is_uri(path) else Path(path)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    staged = is_uri(args.out)
    if staged:
        try:
            staging.parse_location(args.out)  # never a committed step's prefix: only the commit writes there
        except StorageError as err:
            parser.error(f"--out {args.out}: {err}; a bucket --out is the staging location the step's prepare "
                         "task handed over")
    for name, location in inputs.items():
        if not name:
            parser.error(f"--input ={location}: the input needs a name (NAME=DIR or NAME=URI)")
    in_place = staged and kind in BEAM_KINDS  # the job's workers, on any machine, write to the bucket
    out_dir = Path(tempfile.mkdtemp(prefix=f"{args.name}.")) if staged else Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    ctx = StepContext(
        step_id=f"{args.name}-manual", name=args.name, kind=kind, config=config,
        out_dir=out_dir, inputs=inputs, input_ids={n: f"{n}-manual" for n in inputs}, seed=args.seed,
        resolve=materialize, out_uri=args.out if in_place else None,
        work_uri=staging.job_location(args.out) if in_place else None,
    )
    if in_place:
        from tidal.data.beam_options import staged_defaults

        pipeline_args = [*staged_defaults(staging.job_location(args.out), pipeline_args), *pipeline_args]
    with _pipeline_options(pipeline_args), entry_point():  # read after the pipeline options joined the environment
        try:
            summary = module.run(ctx)
            if in_place:
                _seal_in_place(kind, config, args.out, summary, args.name)
            elif staged:
                _stage(kind, config, out_dir, args.out, summary, args.name)
        except ValidationError as err:  # a model a kind builds from its config (e.g. a training spec)
            parser.error(f"--config: {config_problems(err)}")
        except MissingInput as err:
            parser.error(f"{err} (give each as --input NAME=DIR)")
        except StorageError as err:
            parser.error(str(err))
        except FileNotFoundError as err:  # an input that is not there (named by the kind's reader)
            parser.error(str(err))
        except Exception as err:
            if type(err).__module__.startswith(("botocore", "boto3")):
                parser.error(f"{type(err).__name__}: {err}; {storage_hint(err)}")
            raise
        finally:
            if staged:
                shutil.rmtree(out_dir, ignore_errors=True)  # this machine's scratch of the job, whatever happened
    print(json.dumps(summary, indent=1, sort_keys=True))
    return summary


def materialize(uri: str) -> Path:
    """A committed step's URI -> a verified local copy in this process's storage cache
    (:meth:`tidal.storage.Storage.input_dir`), for kinds that need a local directory."""
    root, _, step_id = uri.rstrip("/").rpartition("/")
    storage = open_storage(root, settings=StorageSettings(cache_dir=current().storage_cache))
    return storage.input_dir(step_id)


def _stage(kind: str, config: Any, out_dir: Path, location: str, summary: dict, name: str) -> None:
    """Seal the finished outputs, upload them to ``location`` and write the summary beside it.

    Outputs the kind's checks refuse are kept under the root's ``.failed/`` (evidence any machine
    reads) and the job exits with one ``error:`` line; nothing is staged.
    """
    try:
        staging.seal(kind, config, out_dir, step_id=name, where=f"the {kind} job")
    except ValueError as err:
        root, step_id = staging.parse_location(location)
        storage = open_storage(root, settings=StorageSettings(cache_dir=current().storage_cache))
        raise SystemExit(f"error: {err}; the refused outputs were kept at "
                         f"{storage.keep_failed(out_dir, step_id)} (never counted as committed)")
    staging.stage(out_dir, location)
    _write_summary(location, summary)
    shutil.rmtree(out_dir, ignore_errors=True)


def _seal_in_place(kind: str, config: Any, location: str, summary: dict, name: str) -> None:
    """Seal outputs the workers wrote straight to ``location`` (:func:`tidal.storage.staging.seal_staged`)
    and write the summary beside it. Outputs the kind's checks refuse stay where they are, never
    counted as committed, and the job exits with one ``error:`` line naming them."""
    uris.delete_dir(uris.join(staging.job_location(location), SPILL_PREFIX))  # the workers' intermediate files
    try:
        staging.seal_staged(kind, config, location, step_id=name, where=f"the {kind} job")
    except ValueError as err:
        raise SystemExit(f"error: {err}; the refused outputs are at {location} (never counted as committed; "
                         "its prepare task's next attempt starts a fresh location)") from None
    _write_summary(location, summary)


def _write_summary(location: str, summary: dict) -> None:
    """The job's summary (what ``run`` returned) at ``….job/summary.json``, for the commit task."""
    uris.write_bytes(uris.join(staging.job_location(location), staging.SUMMARY_FILE),
                     (json.dumps(summary, indent=1, sort_keys=True) + "\n").encode())


def config_problems(err: ValidationError) -> str:
    """A config model's refusal on one line: every problem as ``dotted.key: rule (got value)``
    (:func:`tidal.config.problems`)."""
    found = problems(err, unknown="unknown key")
    return f"{len(found)} problem(s) for {err.title}: " + "; ".join(found)


@contextlib.contextmanager
def _pipeline_options(args: list[str]) -> Iterator[None]:
    """While active, ``$TIDAL_BEAM_ARGS`` also holds ``args`` (after what it held: later wins)."""
    if not args:
        yield
        return
    from tidal.data.beam_options import BEAM_ARGS_ENV

    old = os.environ.get(BEAM_ARGS_ENV)
    os.environ[BEAM_ARGS_ENV] = shlex.join([*shlex.split(old or ""), *args])
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(BEAM_ARGS_ENV, None)
        else:
            os.environ[BEAM_ARGS_ENV] = old
