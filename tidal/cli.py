"""The ``tidal`` command: plan, explain, run, report and fetch archives for a recipe.

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

from tidal.recipe import RecipeError


def _cmd_plan(args: argparse.Namespace) -> int:
    from tidal.pipeline import Pipeline

    pipe = Pipeline.load(args.recipe, storage_root=args.storage_root)
    print(f"recipe {pipe.recipe.name} v{pipe.recipe.version}  storage {pipe.storage.root}")
    width = max(len(s.step_id) for s in pipe.graph)
    for step in pipe.graph:
        status = pipe.status(step.name)
        reason = {
            "skip": "committed",
            "run": "inputs ready" if step.inputs else "no inputs",
            "blocked": "waits on " + ", ".join(d.name for d in step.inputs if pipe.status(d.name) != "skip"),
        }[status]
        print(f"  {step.step_id:<{width}}  {status:<7}  {step.kind:<9}  {reason}")
    return 0


def _cmd_explain(args: argparse.Namespace) -> int:
    from tidal.pipeline import Pipeline

    pipe = Pipeline.load(args.recipe, storage_root=args.storage_root)
    step = pipe.graph.find(args.step)
    print(f"{step.step_id}  ({pipe.status(step.name)}, output {pipe.storage.step_dir(step.step_id)})")
    print("hashed:")
    print(json.dumps(step.hash_input, indent=2, sort_keys=True))
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from tidal.pipeline import Pipeline

    pipe = Pipeline.load(args.recipe, storage_root=args.storage_root)
    run_key = args.run_key or f"cli__{datetime.now(UTC):%Y%m%dT%H%M%S}"
    names = [pipe.graph.find(args.step).name] if args.step else [s.name for s in pipe.graph]
    forced = {pipe.graph.find(name).name for name in args.force or []}
    started = time.perf_counter()
    for name in names:
        result = pipe.run(name, run_key=run_key, force=name in forced)
        print(f"{result.status:<4} {result.step_id}  {result.seconds:.2f} s", flush=True)
    print(f"done in {time.perf_counter() - started:.1f} s; MLflow run key {run_key}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from tidal.pipeline import Pipeline
    from tidal.report import build_report, format_report

    pipe = Pipeline.load(args.recipe, storage_root=args.storage_root)
    print(format_report(build_report(pipe, args.run_key)))
    return 0


def _cmd_archives(args: argparse.Namespace) -> int:
    from tidal.data.archives import ensure_archives
    from tidal.recipe import load_recipe

    recipe = load_recipe(args.recipe)
    for path in ensure_archives([s.archive.model_dump() for s in recipe.sources.values()]):
        print(path)
    return 0


def _cmd_forecast(args: argparse.Namespace) -> int:
    from tidal.pipeline import Pipeline
    from tidal.scaling.forecast import ForecastUnavailable, forecast_suite, format_forecast

    pipe = Pipeline.load(args.recipe, storage_root=args.storage_root)
    try:
        result = forecast_suite(pipe, args.flops)
    except (ForecastUnavailable, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=1, sort_keys=True) if args.json else format_forecast(result))
    return 0


def _cmd_recipe_schema(args: argparse.Namespace) -> int:
    from tidal.recipe import Recipe

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

    add("plan", _cmd_plan, "print every step with its id and run / skip / blocked")
    add("explain", _cmd_explain, "show what went into a step's id").add_argument("step", help="step name or id")
    run = add("run", _cmd_run, "run the recipe's steps in-process (without Airflow)")
    run.add_argument("--step", help="run only this step (its inputs must be committed)")
    run.add_argument("--force", action="append", help="recompute this step even if committed")
    run.add_argument("--run-key", help="MLflow parent run key (default: a timestamp)")
    add("report", _cmd_report, "summarize a run: steps, tokens, losses, gate, where things are").add_argument(
        "--run-key", help="MLflow parent run key (default: the newest run)"
    )
    add("archives", _cmd_archives, "download the recipe's pinned source archives and check sha256")
    forecast = add("forecast", _cmd_forecast, "scaling suite: N*, D* and predicted loss at a compute budget")
    forecast.add_argument("--flops", type=float, required=True, help="training compute C in FLOPs, e.g. 1e21")
    forecast.add_argument("--json", action="store_true", help="print the forecast as JSON")
    schema = sub.add_parser("recipe-schema", help="print the JSON schema of a recipe (every field, its type and help)")
    schema.set_defaults(func=_cmd_recipe_schema)
    return parser


# Errors that describe bad input or a failed check, not a bug: one line, no traceback.
# Matched by class name so that catching them imports nothing heavy.
USER_ERRORS = frozenset({
    "RecipeError", "StepBlocked", "StorageError", "ArchiveError", "GateFailed", "StatsIncomplete",
    "TrainingFailed", "TokenizerMismatch", "DataContractError", "ConfigError", "MixtureError",
    "TokenizerFileError", "GateConfigError",
})


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``tidal`` console script.

    Exit status: 0 ok; 1 a step or check failed (one ``error:`` line, no traceback);
    2 bad recipe or unknown step name; 130 interrupted (Ctrl-C).
    """
    from tidal.logs import quiet_libraries

    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    quiet_libraries()
    try:
        return args.func(args)
    except RecipeError as err:
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
        if not {cls.__name__ for cls in type(err).__mro__} & USER_ERRORS:
            raise
        print(f"error: {type(err).__name__}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
