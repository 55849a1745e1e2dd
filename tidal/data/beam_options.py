"""Beam pipeline options for every tidal data job: where and how fast, never what.

Default: Beam's in-process ``FnApiRunner`` with one worker. We name it rather than
``DirectRunner`` because Beam 2.6x+'s DirectRunner first tries the Prism runner, which
downloads a Go binary from GitHub at run time; tidal never downloads at run time, and the
FnApiRunner is what the DirectRunner falls back to anyway. ``$TIDAL_BEAM_ARGS`` (shell
words) adds or overrides options, e.g. ``--direct_num_workers=2
--direct_running_mode=multi_processing`` or ``--runner=DataflowRunner --project=...``.
Runner options are not part of any step config, so they never change a step id.

At scale the same jobs run on a cluster runner: :func:`runner_args` turns a recipe's
``beam: {runner, pipeline_options}`` (or an Airflow task's) into the command-line flags the
job takes (``python -m tidal.data.clean --runner=DataflowRunner --project=P ...``), with the
Beam provider's conventions (``True`` -> ``--flag``, ``False`` -> omitted, a list ->
repeated ``--key=v``), and :func:`runner_options` into the :class:`PipelineOptions` that
job builds.

:func:`create_spread` is how a job starts from a small list of work items (row groups,
shards) so that a runner with several workers shares them out.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

BEAM_ARGS_ENV = "TIDAL_BEAM_ARGS"
DEFAULT_ARGS = ("--runner=FnApiRunner", "--direct_num_workers=1")


def beam_args(extra: Sequence[str] = ()) -> list[str]:
    """The pipeline arguments: defaults, then ``$TIDAL_BEAM_ARGS``, then ``extra`` (later wins)."""
    from tidal.settings import current

    return [*DEFAULT_ARGS, *shlex.split(current().beam_args), *extra]


def beam_options(extra: Sequence[str] = ()) -> PipelineOptions:
    """:class:`PipelineOptions` from :func:`beam_args`."""
    return PipelineOptions(beam_args(extra))


CLUSTER_RUNNERS = ("DataflowRunner", "FlinkRunner", "SparkRunner")


def runner_args(runner: str, pipeline_options: Mapping[str, Any] | None = None) -> list[str]:
    """Command-line flags for ``runner`` and its options, in sorted option order.

    Args:
        runner: a Beam runner name (``DataflowRunner``, ``FlinkRunner``, ``SparkRunner`` ...).
        pipeline_options: bare option names to values, e.g. ``{"project": "p", "region":
            "europe-west4", "temp_location": "gs://b/tmp"}`` or ``{"flink_master":
            "host:8081", "parallelism": 8}``.

    Raises:
        ValueError: for an empty runner, or an option name that is not a bare identifier
            (``--x`` or ``a=b``) or is ``runner`` itself.
    """
    if not runner:
        raise ValueError("runner_args: the runner name is empty")
    args = [f"--runner={runner}"]
    for key, value in sorted((pipeline_options or {}).items()):
        if not key.isidentifier() or key == "runner":
            raise ValueError(f"pipeline option {key!r}: give a bare option name other than 'runner'")
        if isinstance(value, bool):
            if value:
                args.append(f"--{key}")
        elif isinstance(value, (list, tuple)):
            args += [f"--{key}={v}" for v in value]
        elif value is not None:
            args.append(f"--{key}={value}")
    return args


def runner_options(runner: str, pipeline_options: Mapping[str, Any] | None = None) -> PipelineOptions:
    """The :class:`PipelineOptions` a job gets for ``runner`` (after the defaults and
    ``$TIDAL_BEAM_ARGS``; the runner's flags win). No cluster is contacted."""
    return beam_options(runner_args(runner, pipeline_options))


def _values(_: bytes, values: list) -> list:
    """The items of :func:`create_spread`, whatever the ``Impulse`` element."""
    return values


def create_spread(pipeline: beam.Pipeline, label: str, items: Sequence[tuple[Any, Any]]) -> beam.PCollection:
    """``items``, ``(key, value)`` pairs with distinct keys, as a PCollection of ``(key,
    [value])`` (the value in an iterable of one) that a runner can share out among its workers.

    ``"<label>Once"`` (an ``Impulse``) and ``label`` (a ``FlatMap`` of the items) emit every
    item from one bundle; for more than one item a ``GroupByKey`` on the distinct keys
    (``"<label>Spread"``) lets the runner hand each to any worker. ``Create`` does the same
    with two more transforms and ``Reshuffle`` with six more (a coder round trip, random
    keys, timestamps kept and restored), each a fixed cost of every pipeline run.

    Raises:
        ValueError: if two items share a key (they would be grouped into one element).
    """
    keys = [key for key, _ in items]
    if len(set(keys)) != len(keys):
        raise ValueError(f"create_spread {label!r}: the item keys must be distinct, got {keys}")
    root = pipeline | f"{label}Once" >> beam.Impulse()
    if len(items) < 2:
        return root | label >> beam.FlatMap(_values, [(key, [value]) for key, value in items])
    return root | label >> beam.FlatMap(_values, list(items)) | f"{label}Spread" >> beam.GroupByKey()
