"""The ``tidal`` command: plan, explain, run, report, verify, lineage and fetch archives for a recipe;
export and sample a trained model.

No Airflow here: ``tidal run`` executes the same steps in-process (handy for debugging),
while Airflow runs them as one task per step through ``operators/``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from datetime import UTC, datetime
from typing import Any

from tidal.audit import commands as audit_commands  # tidal verify / tidal lineage
from tidal.audit import models  # tidal export / tidal sample
from tidal.audit.catalog import pipeline_of_run, write_run_plan
from tidal.audit.models import add_commands
from tidal.audit.run_keys import check_run_key, newest_run
from tidal.core.commit import step_seed
from tidal.core.load import load_pipeline
from tidal.core.mixture import mixture_table
from tidal.core.report import build_report, format_report
from tidal.data.archives import ensure_archives
from tidal.logs import quiet_libraries
from tidal.quality.baseline import (
    baseline_path,
    describe_baseline,
    read_run_values,
    step_dirs_of_run,
    write_baseline,
)
from tidal.recipe import Recipe, RecipeError, load_recipe
from tidal.recipe.loader import one_owner_warning
from tidal.recipe.reference import markdown_reference
from tidal.settings import SettingsError, entry_point
from tidal.settings import current as current_settings
from tidal.steps import CommittedStep
from tidal.storage import StorageError, open_storage
from tidal.storage.s3 import S3Storage
from tidal.storage.uris import storage_hint
from tidal.tracking import TrackingUnavailable
from tidal.tracking.failures import (
    CATALOG_DIR,
    build_record,
    format_groups,
    group_failures,
    list_failures,
    record_failure,
)
from tidal.train.size_command import plan_lines, print_search, print_sizings
from tidal.train.sizing import compiled_decides


def _check_bucket(storage) -> None:
    """An object-store root's bucket must exist before "not committed" can mean anything (a HEAD of a
    marker in a missing bucket answers 404 too).

    Raises:
        StorageError: naming the bucket and the setting.
    """
    if not isinstance(storage, S3Storage):
        return
    from botocore.exceptions import ClientError

    try:
        storage.client.head_bucket(Bucket=storage.bucket)
    except ClientError as err:
        if str(err.response.get("Error", {}).get("Code", "")) in ("404", "NoSuchBucket", "NotFound"):
            raise StorageError(f"storage root {storage.uri}: bucket {storage.bucket!r} does not exist (check "
                               "TIDAL_STORAGE_ROOT or the recipe's storage_root; tidal creates no bucket)") from None
        raise


def _overrides(args: argparse.Namespace) -> dict[str, Any] | None:
    """``--set train.steps=200`` (repeatable) as dotted recipe overrides, values parsed as YAML
    scalars; the same mechanism as the Airflow trigger form (validated by the recipe schema).

    Raises:
        tidal.config.RecipeError: an item without ``=``.
    """
    import yaml

    found: dict[str, Any] = {}
    for item in getattr(args, "set", None) or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise RecipeError(f"--set {item!r}: expected FIELD=VALUE with a dotted field, e.g. train.steps=200")
        try:
            found[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError:
            found[key.strip()] = value
    return found or None


def _cmd_plan(args: argparse.Namespace) -> int:
    pipe = load_pipeline(args.recipe, _overrides(args), storage_root=args.storage_root)
    _check_bucket(pipe.storage)
    print(f"recipe {pipe.recipe.name} v{pipe.recipe.version}  storage {pipe.storage.root}")
    problem = pipe.tracking_problem()
    if problem:  # Airflow tasks refuse to run like this (operators/run_context.py); `tidal run` only warns
        print(f"note: {problem}")
    baseline = describe_baseline(pipe)
    if baseline is not None:
        print(baseline)
    for name, source in sorted(pipe.recipe.sources.items()):
        if source.path is not None and source.snapshot_sha256 is None:
            planned = pipe.graph[f"fetch-{name}"].config.get("snapshot_sha256")
            print(f"note: source {name} reads {source.path} unpinned: " + (
                f"its files hash to {planned} now (the fetch step id follows it); pin "
                f"sources.{name}.snapshot_sha256: {planned} to keep this id and have fetch check the files"
                if planned else f"its step id follows the path, and a change to its files is not noticed (pin "
                f"sources.{name}.snapshot_sha256 with the value its fetch step logs)"))

    ref = pipe.graph["train"].config.get("continue_from") if "train" in pipe.graph.by_name else None
    if ref:
        print(f"train continues {ref['step']} from its checkpoint step {ref['checkpoint_step']} to step "
              f"{pipe.graph['train'].config['steps']} (checkpoint root {ref['checkpoint_root_hash'][:12]}, "
              f"schedule {ref['schedule']})")
    width = max(len(s.step_id) for s in pipe.graph)
    for step in pipe.graph:
        status = pipe.status(step.name)
        read_only = isinstance(step, CommittedStep)  # another run's output this graph reads
        reason = {
            "skip": f"committed ({step.name}: read, never recomputed)" if read_only else "committed",
            "run": "inputs ready" if step.inputs else "no inputs",
            "blocked": "waits on " + ", ".join(d.name for d in step.inputs if pipe.status(d.name) != "skip"),
        }[status]
        print(f"  {step.step_id:<{width}}  {status:<7}  {step.kind:<9}  {reason}")
    for line in plan_lines(pipe):  # a GKE recipe's train steps sized for their chips (from the sizing cache)
        print(line)
    return _print_mixture(pipe)


def _print_mixture(pipe) -> int:
    """The mixture table (tidal/core/mixture.py); 1 with one ``error:`` line when a source cannot give
    its share (``mixture.size`` / ``mixture.n_sequences``), known once its tokenize step is committed."""
    table = mixture_table(pipe)
    for line in table.lines():
        print(line)
    if table.problem:
        print(f"error: {pipe.recipe_path}: {table.problem}", file=sys.stderr)
        return 1
    return 0


def _cmd_explain(args: argparse.Namespace) -> int:
    pipe = load_pipeline(args.recipe, _overrides(args), storage_root=args.storage_root)
    step = pipe.graph.find(args.step)
    print(f"{step.step_id}  ({pipe.status(step.name)}, output {pipe.storage.step_uri(step.step_id)})")
    print("hashed:")
    print(json.dumps(step.hash_input, indent=2, sort_keys=True))

    seed = step_seed(step)
    if seed is not None:  # what a standalone job of this step needs: python -m tidal.data.mix --seed N
        print(f"step seed: {seed} (derived from the recipe seed {step.config['seed']} and the name {step.name})")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    pipe = load_pipeline(args.recipe, _overrides(args), storage_root=args.storage_root)
    problem = pipe.tracking_problem()
    if problem:  # one machine runs every step here, so its own store is enough
        print(f"warning: {problem}; this in-process run on one machine records into it anyway", file=sys.stderr)
    run_key = args.run_key or f"cli__{datetime.now(UTC):%Y%m%dT%H%M%S}"
    names = [pipe.graph.find(args.step).name] if args.step else [s.name for s in pipe.graph]
    forced = {pipe.graph.find(name).name for name in args.force or []}
    if getattr(pipe, "suite", None) is None:  # the run's own ids, where report / verify / lineage find them
        write_run_plan(pipe.storage, pipe.recipe.name, run_key, {s.name: s.step_id for s in pipe.graph},
                       pipe.overrides)
    started = time.perf_counter()
    for name in names:
        try:
            result = pipe.run(name, run_key=run_key, force=name in forced)
        except Exception as err:
            if type(err).__name__ != "StepBlocked":  # a step run too early did not fail: nothing to record
                _record_failure(pipe, name, run_key, err)
                _finish_parent(pipe, run_key, "FAILED")
                print(f"run key {run_key} failed at step {name}: tidal report {args.recipe} --run-key {run_key}",
                      file=sys.stderr)
            raise
        print(f"{result.status:<4} {result.step_id}  {result.seconds:.2f} s", flush=True)
    _finish_parent(pipe, run_key, "FINISHED")
    print(f"done in {time.perf_counter() - started:.1f} s; MLflow run key {run_key}")
    return 0


def _finish_parent(pipe, run_key: str, status: str) -> None:
    """Close the run's MLflow parent run (``FINISHED``/``FAILED``, with the final metrics) so no
    ``tidal run`` leaves it RUNNING (issue 21, item 7); never masks the step's own error."""
    try:
        parent = pipe.parent_run(run_key)
        if parent is not None:
            pipe.finish_run(parent, status)
    except Exception as problem:  # noqa: BLE001 - tracking never takes a run down (docs/architecture.md §5)
        print(f"warning: the MLflow run {run_key} could not be closed: {problem}", file=sys.stderr)


def _record_failure(pipe, name: str, run_key: str, err: Exception) -> None:
    """Add a failed in-process step to the failure catalog under the storage root (``tidal failures``
    on any machine lists it, as it lists the Airflow tasks' failures); never masks ``err``."""
    try:
        step = pipe.graph[name]
        record = build_record(err, dag_id="tidal-run", task_id=name, run_id=run_key, try_number=1,
                              recipe=pipe.recipe.name, recipe_hash=pipe.recipe_hash, step_id=step.step_id,
                              launcher="cli")
        print(f"failure recorded: {record_failure(pipe.storage, record)}", file=sys.stderr)
    except Exception as problem:  # noqa: BLE001 - the step's own error is what the user must see
        print(f"warning: the failure of {name} could not be recorded: {problem}", file=sys.stderr)


def _cmd_report(args: argparse.Namespace) -> int:
    written = load_pipeline(args.recipe, storage_root=args.storage_root)
    run_key = args.run_key
    if run_key is None:  # the newest run of the recipe, with whatever overrides it ran (tidal/audit/run_keys.py)
        newest = newest_run(written)
        run_key = newest.run_key if newest is not None else None
    else:
        check_run_key(written, run_key)  # exit 2 naming the nearest keys
    pipe = pipeline_of_run(args.recipe, run_key, args.storage_root)  # the run's own overrides
    print(format_report(build_report(pipe, run_key)))
    return 0


def _cmd_archives(args: argparse.Namespace) -> int:
    recipe = load_recipe(args.recipe)
    for path in ensure_archives([s.archive.model_dump() for s in recipe.sources.values() if s.archive is not None]):
        print(path)
    return 0


def _cmd_forecast(args: argparse.Namespace) -> int:
    from tidal.scaling.forecast import ForecastUnavailable, forecast_suite, format_forecast  # scipy: ~0.6 s

    pipe = load_pipeline(args.recipe, storage_root=args.storage_root)
    try:
        result = forecast_suite(pipe, args.flops)
    except (ForecastUnavailable, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=1, sort_keys=True) if args.json else format_forecast(result))
    return 0


def _cmd_model(args: argparse.Namespace) -> int:
    return models.run_command(args)


def _cmd_failures(args: argparse.Namespace) -> int:
    recipe_name = None
    if args.recipe:
        pipe = load_pipeline(args.recipe, storage_root=args.storage_root)
        storage, recipe_name = pipe.storage, pipe.recipe.name
    else:
        storage = open_storage(args.storage_root or current_settings().storage_root or ".tidal")
    records = list_failures(storage, recipe_name)[: args.limit]
    if args.json:
        print(json.dumps(records, indent=1, sort_keys=True, default=str))
    else:
        print(f"failure catalog {storage.object_uri(CATALOG_DIR + '/')}: {len(records)} failure(s)")
        print(format_groups(group_failures(records, storage.is_committed)))
    return 0


def _cmd_baseline(args: argparse.Namespace) -> int:
    from pathlib import Path

    pipe = load_pipeline(args.recipe, storage_root=args.storage_root)
    out = Path(args.out) if args.out else baseline_path(pipe)
    if out is None:
        print("error: the recipe has no `baseline.file`; pass --out FILE", file=sys.stderr)
        return 2

    try:
        stats_dir, train_dir, source = step_dirs_of_run(pipe, args.from_run)
    except TrackingUnavailable as err:  # only --from-run needs MLflow (the run's step ids)
        print(f"error: baseline from run {args.from_run}: {err}", file=sys.stderr)
        return 1
    values = read_run_values(stats_dir, train_dir)
    write_baseline(out, pipe.recipe.name, source, values)
    print(f"baseline {out}: {len(values['stats'])} stats, {len(values['loss_curve'])} loss points, "
          f"eval loss {values['eval_loss']} (from {source})")
    return 0


def _cmd_size(args: argparse.Namespace) -> int:
    if args.write and not args.search:
        raise RecipeError("--write writes what --search chose: give both")
    overrides = _overrides(args)
    with compiled_decides():  # the compiler gives its verdict, not the analytical plan recipe validation uses
        pipe = load_pipeline(args.recipe, overrides, storage_root=args.storage_root)
    if args.search:
        from tidal.recipe.edit import write_train_mesh

        return print_search(pipe, recipe_path=args.recipe, write=write_train_mesh if args.write else None,
                            overrides=overrides, as_json=args.json)
    return print_sizings(pipe, as_json=args.json)


def _cmd_recipe_schema(args: argparse.Namespace) -> int:
    if args.markdown:
        print(markdown_reference(Recipe.model_json_schema()), end="")
    else:
        print(json.dumps(Recipe.model_json_schema(), indent=1))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``tidal`` command."""
    parser = argparse.ArgumentParser(prog="tidal", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, func, help_text: str) -> argparse.ArgumentParser:
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        cmd.add_argument("recipe", help="recipe YAML file, e.g. recipes/tiny.yaml")
        cmd.add_argument("--storage-root", help="override the recipe's storage_root (not hashed)")
        cmd.set_defaults(func=func)
        return cmd

    def with_set(cmd: argparse.ArgumentParser) -> argparse.ArgumentParser:
        cmd.add_argument("--set", action="append", metavar="FIELD=VALUE",
                         help="override a recipe field for this run, as the Airflow trigger form does "
                              "(e.g. --set train.steps=200; repeatable; hashed like the recipe)")
        return cmd

    with_set(add("plan", _cmd_plan, "print every step with its id and run / skip / blocked"))
    with_set(add("explain", _cmd_explain, "show what went into a step's id")).add_argument(
        "step", help="step name or id")
    run = with_set(add("run", _cmd_run, "run the recipe's steps in-process (without Airflow)"))
    run.add_argument("--step", help="run only this step (its inputs must be committed)")
    run.add_argument("--force", action="append", help="recompute this step even if committed")
    run.add_argument("--run-key", help="MLflow parent run key (default: a timestamp)")
    report = add("report", _cmd_report, "summarize a run (buffered MLflow calls are sent first): steps, tokens, "
                 "losses, gate, where things are")
    report.add_argument("--run-key", help="the run to show (default: the newest run of the recipe, whatever "
                        "overrides it ran with); a key that names no run is exit 2 with the nearest keys")
    add("archives", _cmd_archives, "download the recipe's pinned source archives and check sha256")
    forecast = add("forecast", _cmd_forecast, "scaling suite: N*, D* and predicted loss at a compute budget")
    forecast.add_argument("--flops", type=float, required=True, help="training compute C in FLOPs, e.g. 1e21")
    forecast.add_argument("--json", action="store_true", help="print the forecast as JSON")
    for name, func, help_text in (
        ("verify", audit_commands.verify, ("recompute every content hash, step id and signature of committed steps; "
         "exit 1 on any mismatch")),
        ("lineage", audit_commands.lineage, ("the chain from source archives (licences) through each step to the final "
         "checkpoint")),
    ):
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        cmd.add_argument("target", help="recipe file, step directory, step id or MLflow run key")
        cmd.add_argument("--recipe", help="recipe whose storage root and tracking store hold a step id / run key")
        cmd.add_argument("--storage-root", help="storage root holding a step id / run key (or TIDAL_STORAGE_ROOT)")
        cmd.add_argument("--json", action="store_true", help="print JSON instead of text")
        cmd.set_defaults(func=func)
        if name == "verify":
            cmd.add_argument("--require-signature", action="store_true",
                             help="count unsigned steps and signatures that cannot be checked as failures "
                                  "(the default when TIDAL_SIGNING_KEY is set)")
            cmd.add_argument("--allow-unsigned", action="store_true",
                             help="with a signing key configured, accept unsigned steps and other keys' signatures")

    add_commands(sub, _cmd_model)
    failures = sub.add_parser("failures", help="list recorded task failures, newest first, grouped by fingerprint")
    failures.add_argument("recipe", nargs="?", help="recipe YAML (its storage root and name); default: all in "
                          "--storage-root / $TIDAL_STORAGE_ROOT / .tidal")
    failures.add_argument("--storage-root", help="storage root holding failures/")
    failures.add_argument("--limit", type=int, default=1000, help="newest N failures")
    failures.add_argument("--json", action="store_true", help="print the records as JSON")
    failures.set_defaults(func=_cmd_failures)
    size = with_set(add("size", _cmd_size, "size each train step for its accelerator before booking it: HBM, FLOPs, "
                        "collectives, step time and MFU per chip (a TPU slice: compiled ahead of time on this CPU); "
                        "exit 1 when it does not fit"))
    size.add_argument("--json", action="store_true", help="print the sizings as JSON")
    size.add_argument("--search", action="store_true", help="compile every data x fsdp x tensor mesh of the slice, "
                      "each with the fewest microbatches that fit, and rank those that fit by predicted MFU "
                      "(axes set in train.mesh stay fixed)")
    size.add_argument("--write", action="store_true", help="with --search: write the best mesh and microbatch "
                      "count into the recipe file (train.mesh, train.microbatches; comments kept)")
    base = add("baseline", _cmd_baseline, "write the recipe's baseline (stats, loss curve) from a committed run")
    base.add_argument("--from-run", help="MLflow run key of the known-good run (default: current step ids)")
    base.add_argument("--out", help="baseline file (default: the recipe's baseline.file)")
    schema = sub.add_parser("recipe-schema", help="print the JSON schema of a recipe (every field, its type and help)")
    schema.add_argument("--markdown", action="store_true",
                        help="print the short field reference (two levels) the docs site shows, as Markdown")
    schema.set_defaults(func=_cmd_recipe_schema)
    for cmd in sub.choices.values():  # every command: library INFO (absl, orbax, JAX) only when asked for
        cmd.add_argument("--verbose", action="store_true", help="also show the libraries' INFO logs (absl, orbax, "
                         "JAX); without it only their warnings and errors reach the terminal")
    return parser


# Errors that describe bad input or a failed check, not a bug: one line, no traceback.
# Matched by class name so that catching them imports nothing heavy.
USER_ERRORS = frozenset({
    "RecipeError", "StepBlocked", "StorageError", "ArchiveError", "SourceError", "GateFailed", "StatsIncomplete",
    "TrainingFailed", "TokenizerMismatch", "DataContractError", "ConfigError", "MixtureError",
    "TokenizerFileError", "GateConfigError", "SigningKeyError",
    "BaselineError", "BaselineMismatch",
    "TrackingUnavailable",  # a lookup that needs MLflow (e.g. a run key), and MLflow does not answer
    "BotoCoreError", "ClientError",  # object storage unreachable, no credentials, access denied
    "PermissionError", "FileNotFoundError", "NotADirectoryError", "IsADirectoryError",  # a root or cache not writable
    "DiskFull",  # tidal/storage/disk.py: the message says where and what to do
    "CheckpointMismatch",  # tidal export / sample: a checkpoint that does not fit its step's config
    "SizingError", "UnknownChip",  # tidal size: the sizer process failed; an accelerator with no constants
})


# Libraries whose INFO lines are their own bookkeeping (orbax's checkpoint handlers through absl: about 25
# lines around the 2 lines of `tidal sample`); --verbose lets them through.
CHATTY_AT_INFO = ("absl", "orbax", "jax", "jax._src")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``tidal`` console script.

    Exit status: 0 ok; 1 a step or check failed (one ``error:`` line, no traceback), or
    ``verify``/``lineage`` found nothing committed; 2 bad recipe, unknown step name, or a
    ``verify``/``lineage`` target that names nothing (tidal/audit/ancestry.py resolve_target);
    130 interrupted (Ctrl-C).
    """
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    quiet_libraries()
    if not getattr(args, "verbose", False):
        for name in CHATTY_AT_INFO:
            logging.getLogger(name).setLevel(logging.WARNING)
    # a recipe file sharing its name with another file of its folder: said once here (the DAG folder refuses
    # both; a command run on one file is that file's run), not by every task that loads the recipe
    warning = one_owner_warning(args.recipe) if isinstance(getattr(args, "recipe", None), str) else None
    if warning:
        print(warning, file=sys.stderr)
    try:
        with entry_point():
            return args.func(args)
    except (RecipeError, SettingsError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyError as err:
        print(f"error: {err.args[0]}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: nothing partial was committed; rerun to continue", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `tidal plan ... | head`
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as err:
        names = {cls.__name__ for cls in type(err).__mro__}
        if not names & USER_ERRORS:
            raise
        hint = ""
        if names & {"BotoCoreError", "ClientError"}:
            hint = f"; {storage_hint(err)}"
        elif isinstance(err, OSError) and type(err).__name__ != "DiskFull":
            hint = "; check that TIDAL_STORAGE_ROOT (or the recipe's storage_root) and TIDAL_STORAGE_CACHE are writable"
        print(f"error: {type(err).__name__}: {err}{hint}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
