"""Scheduled validation: compare a run's stats and loss curve with a known-good baseline.

Invariant: a baseline describes *one exact recipe computation*. It is read from committed
step outputs only (``stats.parquet`` of the ``stats`` step, ``metrics.jsonl`` and
``summary.json`` of the ``train`` step), never from what a run logged elsewhere, so a
comparison can always be reproduced from the storage root. The recipe's ``baseline`` section
(file and tolerances) is not hashed: it decides whether a run passes, not what it computes.

Baseline file (JSON, written by ``tidal baseline RECIPE [--from-run KEY]`` or by hand)::

    {"recipe": "tiny", "source": "run key or step ids it was read from",
     "stats": {"<source>/<metric>": value, ...},
     "loss_curve": [[step, loss], ...],
     "eval_loss": float | null}

Tolerances (recipe ``baseline``): a stat passes when ``|got - expected| <= stats_tolerance *
max(|expected|, 1)`` (relative, with an absolute floor of ``stats_tolerance`` for values
near zero such as rates); a loss point and the eval loss pass when ``|got - expected| <=
loss_tolerance`` (absolute, in nats). Loss-curve points are matched by training step; a
step in the baseline that the run did not log is a difference too.

A missing baseline file: the recipe still loads (``tidal baseline RECIPE`` writes the file
from a committed run *of that recipe*, so it cannot be required before the first run, and the
section is not hashed), but it is never silent: ``tidal plan`` prints it as MISSING
(:func:`describe_baseline`), and a comparison (:func:`check_pipeline`, the Airflow report task)
fails with a :class:`BaselineError` naming the recipe file, ``baseline.file``, the resolved
path and the command that writes it. A run is never passed without a comparison.
A scaling suite has no single ``train`` step: its baselines are refused with a clear error.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidal.storage.layout import SUMMARY_JSON, atomic_write_text
from tidal.tracking import STEP_TAG_PREFIX, parent_run

STATS_FILE = "stats.parquet"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = SUMMARY_JSON


class BaselineError(ValueError):
    """The baseline file is missing or malformed, or the run lacks what it compares; names the file."""


class BaselineMismatch(RuntimeError):
    """A run differs from its baseline beyond tolerance. ``err.differences`` lists them;
    ``str(err)`` is one readable line per difference (metric, expected, got, tolerance)."""

    def __init__(self, differences: list[Difference], baseline_file: Path):
        self.differences = differences
        lines = [f"{len(differences)} difference(s) from baseline {baseline_file}:"]
        lines += [f"  {d}" for d in differences]
        super().__init__("\n".join(lines))


@dataclass(frozen=True)
class Difference:
    """One metric outside tolerance. ``got`` is None when the run lacks the metric."""

    metric: str
    expected: float
    got: float | None
    tolerance: float

    def __str__(self) -> str:
        got = "missing" if self.got is None else f"{self.got:.6g}"
        return f"{self.metric}: expected {self.expected:.6g}, got {got} (tolerance {self.tolerance:.3g})"


def read_run_values(stats_dir: Path | None, train_dir: Path | None) -> dict[str, Any]:
    """The comparable values of one run from committed step directories.

    Args:
        stats_dir: committed ``stats`` step directory (``stats.parquet``), or None.
        train_dir: committed ``train`` step directory (``metrics.jsonl``, ``summary.json``), or None.

    Returns:
        ``{"stats": {"src/metric": float}, "loss_curve": [[step, loss]], "eval_loss": float|None}``.
    """
    values: dict[str, Any] = {"stats": {}, "loss_curve": [], "eval_loss": None}
    if stats_dir is not None and (stats_dir / STATS_FILE).is_file():
        import pandas as pd

        table = pd.read_parquet(stats_dir / STATS_FILE)
        values["stats"] = {f"{r.source}/{r.metric}": float(r.value) for r in table.itertuples(index=False)}
    if train_dir is not None:
        metrics = train_dir / METRICS_FILE
        if metrics.is_file():
            for line in metrics.read_text().splitlines():
                record = json.loads(line) if line.strip() else {}
                if "loss" in record and "step" in record:
                    values["loss_curve"].append([int(record["step"]), float(record["loss"])])
        summary = train_dir / SUMMARY_FILE
        if summary.is_file():
            values["eval_loss"] = json.loads(summary.read_text()).get("eval_loss")
    return values


def write_baseline(path: Path, recipe_name: str, source: str, values: dict[str, Any]) -> Path:
    """Write a baseline file (see the module doc) atomically; returns ``path``."""
    payload = {"recipe": recipe_name, "source": source, **values}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(payload, indent=1, sort_keys=True) + "\n")
    return path


def load_baseline(path: Path) -> dict[str, Any]:
    """Read a baseline file.

    Raises:
        BaselineError: the file is missing, not JSON, or lacks ``stats``/``loss_curve``.
    """
    try:
        data = json.loads(path.read_text())
    except OSError as err:
        raise BaselineError(f"{path}: cannot read baseline: {err.strerror}") from None
    except json.JSONDecodeError as err:
        raise BaselineError(f"{path}: baseline is not JSON: line {err.lineno}: {err.msg}") from None
    if not isinstance(data, dict) or not isinstance(data.get("stats"), dict) or not isinstance(
        data.get("loss_curve"), list
    ):
        raise BaselineError(f"{path}: a baseline needs a `stats` mapping and a `loss_curve` list of [step, loss]")
    return data


def compare(baseline: dict[str, Any], run: dict[str, Any], *, loss_tolerance: float,
            stats_tolerance: float) -> list[Difference]:
    """Every metric of ``baseline`` that ``run`` misses or differs in beyond tolerance.

    Args:
        baseline: from :func:`load_baseline`.
        run: from :func:`read_run_values`.
        loss_tolerance: absolute, nats (loss points and eval loss).
        stats_tolerance: relative with a floor (see the module doc).

    Returns:
        Differences in baseline order: stats (sorted by name), loss points by step, eval loss.
    """
    diffs: list[Difference] = []
    for name in sorted(baseline["stats"]):
        expected = float(baseline["stats"][name])
        got = run["stats"].get(name)
        tol = stats_tolerance * max(abs(expected), 1.0)
        if got is None or not math.isfinite(got) or abs(got - expected) > tol:
            diffs.append(Difference(f"stats {name}", expected, got, tol))
    curve = {int(step): float(loss) for step, loss in run["loss_curve"]}
    for step, loss in baseline["loss_curve"]:
        got = curve.get(int(step))
        if got is None or not math.isfinite(got) or abs(got - float(loss)) > loss_tolerance:
            diffs.append(Difference(f"loss at step {int(step)}", float(loss), got, loss_tolerance))
    if baseline.get("eval_loss") is not None:
        expected, got = float(baseline["eval_loss"]), run.get("eval_loss")
        if got is None or not math.isfinite(got) or abs(got - expected) > loss_tolerance:
            diffs.append(Difference("eval_loss", expected, got, loss_tolerance))
    return diffs


def baseline_path(pipe: Any) -> Path | None:
    """The baseline file of ``pipe``'s recipe (relative paths resolve against the recipe file), or None."""
    config = pipe.recipe.baseline
    if config is None:
        return None
    path = Path(config.file)
    return path if path.is_absolute() else (pipe.recipe_path.parent / path)


def _refuse_suite(pipe: Any) -> None:
    if getattr(pipe, "suite", None) is not None:
        raise BaselineError(f"{pipe.recipe_path}: a scaling suite has no single `train` step to take a baseline "
                            f"from or compare with; baselines belong to recipes (its base recipe is "
                            f"{pipe.recipe.name!r})")


def missing_file_message(pipe: Any, path: Path) -> str:
    """What to do about a ``baseline.file`` that does not exist (names recipe, field, path, command)."""
    return (f"{pipe.recipe_path}: baseline.file {pipe.recipe.baseline.file!r}: {path} does not exist; write it "
            f"from a known-good run with `tidal baseline {pipe.recipe_path} [--from-run RUN_KEY]`, or remove the "
            "`baseline` section")


def describe_baseline(pipe: Any) -> str | None:
    """One line on the recipe's baseline for ``tidal plan``: its path and size, or MISSING /
    unreadable with what to do; None when the recipe has no ``baseline`` (or is a suite)."""
    if getattr(pipe, "suite", None) is not None:
        return None
    path = baseline_path(pipe)
    if path is None:
        return None
    if not path.exists():
        return (f"baseline {path}: MISSING: runs that compare with it fail until `tidal baseline "
                f"{pipe.recipe_path}` writes it from a known-good run")
    try:
        data = load_baseline(path)
    except BaselineError as err:
        return f"baseline {path}: UNREADABLE: {err}"
    return f"baseline {path}: {len(data['stats'])} stats, {len(data['loss_curve'])} loss points"


def check_pipeline(pipe: Any) -> list[Difference]:
    """Compare ``pipe``'s committed stats and train outputs with its recipe's baseline.

    Returns:
        The differences (empty: the run matches). No baseline configured: empty.

    Raises:
        BaselineError: the baseline file does not exist (:func:`missing_file_message`) or is
            unreadable, or ``pipe`` is a scaling suite.
        BaselineMismatch: differences were found (raised, so a task fails with the text).
    """
    path = baseline_path(pipe)
    if path is None:
        return []
    _refuse_suite(pipe)
    if not path.exists():
        raise BaselineError(missing_file_message(pipe, path))
    baseline = load_baseline(path)
    stats, train = pipe.graph["stats"], pipe.graph["train"]
    run = read_run_values(
        pipe.storage.input_dir(stats.step_id) if pipe.storage.is_committed(stats.step_id) else None,
        pipe.storage.input_dir(train.step_id) if pipe.storage.is_committed(train.step_id) else None,
    )
    config = pipe.recipe.baseline
    diffs = compare(baseline, run, loss_tolerance=config.loss_tolerance, stats_tolerance=config.stats_tolerance)
    if diffs:
        raise BaselineMismatch(diffs, path)
    return diffs


def step_dirs_of_run(pipe: Any, run_key: str | None) -> tuple[Path, Path, str]:
    """Committed ``stats`` and ``train`` directories of a run, and a description of the source.

    ``run_key`` None: the recipe's current step ids. Otherwise the MLflow parent run with that
    key supplies the ids (its ``tidal.step_id.<name>`` tags), so a baseline can be taken from an
    earlier run even after the recipe changed.

    Raises:
        BaselineError: the run is unknown, a step it names is not committed, or ``pipe`` is a
            scaling suite.
        tidal.tracking.TrackingUnavailable: ``run_key`` given and MLflow does not answer (its
            message names the tracking URI).
    """
    _refuse_suite(pipe)
    ids = {"stats": pipe.graph["stats"].step_id, "train": pipe.graph["train"].step_id}
    source = "current recipe: " + ", ".join(ids.values())
    if run_key is not None:
        if "'" in run_key:
            raise BaselineError(f"no MLflow run with key {run_key!r}: a run key holds no single quote")
        run = parent_run(pipe.tracking_uri, pipe.experiment, run_key)
        if run is None:
            raise BaselineError(f"no MLflow run with key {run_key!r} in experiment {pipe.experiment}")
        ids = {name: run.tags.get(f"{STEP_TAG_PREFIX}{name}", ids[name]) for name in ids}
        source = f"run {run_key}: " + ", ".join(ids.values())
    dirs = []
    for name, step_id in ids.items():
        if not pipe.storage.is_committed(step_id):
            raise BaselineError(f"{name} step {step_id} is not committed in {pipe.storage.uri}; run the recipe first")
        dirs.append(pipe.storage.input_dir(step_id))
    return dirs[0], dirs[1], source
