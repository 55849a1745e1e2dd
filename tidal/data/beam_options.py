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
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions

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


FLINK_VERSION = "1.19"  # the Flink minor of the job server tools/flink/install.sh builds (Beam's runner for it)
EXTERNAL_POOL_HOST, EXTERNAL_POOL_PORT = "beam-worker-pool", 50000  # a TaskManager's SDK worker pool sidecar


def flink_args(flink_master: str, parallelism: int, job_server_jar: str,
               pool: str = f"{EXTERNAL_POOL_HOST}:{EXTERNAL_POOL_PORT}") -> list[str]:
    """Options that run a job on a Flink cluster as Flink on Kubernetes runs Beam Python: Beam's
    ``FlinkRunner`` submits one uber jar (the job server jar with the pipeline and its artifacts
    inside, so no TaskManager reads a file from the launcher's disk) to the JobManager's REST
    endpoint ``flink_master`` (``host:port``), and each TaskManager hands bundles to the SDK worker
    pool beside it at ``pool`` (``--environment_type=EXTERNAL``: the same address on every
    TaskManager, resolved by each to its own sidecar). ``job_server_jar`` is a tool of the
    launcher's image (``tools/flink/install.sh``), not data."""
    return ["--runner=FlinkRunner", f"--flink_master={flink_master}", f"--flink_version={FLINK_VERSION}",
            f"--flink_job_server_jar={job_server_jar}", "--flink_submit_uber_jar",
            "--environment_type=EXTERNAL", f"--environment_config={pool}", f"--parallelism={parallelism}"]


TEMP_DIR, STAGING_DIR = "beam-temp", "beam-staging"  # under a staged job's own prefix (….job/)


IN_PROCESS_RUNNERS = (None, "DirectRunner", "FnApiRunner", "SwitchingDirectRunner", "BundleBasedDirectRunner")


def one_worker(options: PipelineOptions) -> bool:
    """Whether a pipeline with ``options`` runs in this process on one worker (the in-process runner with
    ``direct_num_workers`` 1, tidal's default): there every stage is the same process, and a stage that
    spreads work over workers only adds the runner's fixed cost per stage."""
    runner = options.view_as(StandardOptions).runner
    name = runner if isinstance(runner, str) or runner is None else type(runner).__name__
    return name in IN_PROCESS_RUNNERS and options.view_as(DirectOptions).direct_num_workers == 1


def given(args: Sequence[str], option: str) -> bool:
    """True if ``--option`` (``--option=v`` or ``--option v``) is among ``args``."""
    return any(a == f"--{option}" or a.startswith(f"--{option}=") for a in args)


def staged_defaults(work_uri: str, args: Sequence[str]) -> list[str]:
    """The options a job with a bucket staging location gets unless ``args`` (with
    ``$TIDAL_BEAM_ARGS`` before them) set them: ``--temp_location`` and ``--staging_location`` under
    the attempt's own prefix ``work_uri`` (``{root}/.staging/{step_id}.{token}.job/``, deleted with it
    at commit; Dataflow needs both, ``gs://``), and ``--sdk_container_image`` from
    ``$TIDAL_BEAM_WORKER_IMAGE`` (the ``images/beam-worker`` image, where tidal is installed, so
    workers import ``tidal.data.*`` and nothing of the launcher's session is pickled:
    ``--no_save_main_session``, which Dataflow would otherwise default on with cloudpickle).
    Never a local path."""
    from tidal.settings import current

    seen = [*shlex.split(current().beam_args), *args]
    base = work_uri.rstrip("/")
    out = []
    if not given(seen, "temp_location"):
        out.append(f"--temp_location={base}/{TEMP_DIR}")
    if not given(seen, "staging_location"):
        out.append(f"--staging_location={base}/{STAGING_DIR}")
    if not given(seen, "save_main_session") and not given(seen, "no_save_main_session"):
        out.append("--no_save_main_session")  # Dataflow with cloudpickle would default it on
    image = current().beam_worker_image
    if image and not given(seen, "sdk_container_image"):
        out.append(f"--sdk_container_image={image}")
        if not given(seen, "sdk_location"):
            out.append("--sdk_location=container")  # the image's own Beam SDK: nothing to stage
    return out


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
