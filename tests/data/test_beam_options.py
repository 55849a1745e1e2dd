"""Runner options of the Beam data jobs for Dataflow, Flink and Spark (built, never run)."""

from __future__ import annotations

import pytest
from apache_beam.options.pipeline_options import (
    DirectOptions,
    FlinkRunnerOptions,
    GoogleCloudOptions,
    SetupOptions,
    SparkRunnerOptions,
    StandardOptions,
    WorkerOptions,
)

from tidal.data import beam_options
from tidal.data.jobcli import _pipeline_options
from tidal.recipe import parse_recipe

DATAFLOW = {"project": "tidal-prod", "region": "europe-west4", "temp_location": "gs://tidal-tmp/beam",
            "max_num_workers": 40, "machine_type": "n2-standard-8", "save_main_session": True,
            "sdk_container_image": "europe-docker.pkg.dev/tidal/beam:1", "use_public_ips": False}
FLINK = {"flink_master": "flink-jobmanager:8081", "parallelism": 16, "environment_type": "DOCKER"}
SPARK = {"spark_master_url": "spark://spark-master:7077", "environment_type": "LOOPBACK"}


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    monkeypatch.delenv(beam_options.BEAM_ARGS_ENV, raising=False)


def test_dataflow_options_reach_their_views():
    options = beam_options.runner_options("DataflowRunner", DATAFLOW)
    gcp = options.view_as(GoogleCloudOptions)
    assert options.view_as(StandardOptions).runner == "DataflowRunner"
    assert (gcp.project, gcp.region, gcp.temp_location) == ("tidal-prod", "europe-west4", "gs://tidal-tmp/beam")
    worker = options.view_as(WorkerOptions)
    assert worker.max_num_workers == 40 and worker.machine_type == "n2-standard-8"
    assert worker.sdk_container_image == "europe-docker.pkg.dev/tidal/beam:1"
    assert options.view_as(SetupOptions).save_main_session is True
    assert "--use_public_ips" not in beam_options.runner_args("DataflowRunner", DATAFLOW)  # False: omitted


def test_flink_options_reach_their_views():
    options = beam_options.runner_options("FlinkRunner", FLINK)
    flink = options.view_as(FlinkRunnerOptions)
    assert options.view_as(StandardOptions).runner == "FlinkRunner"
    assert (flink.flink_master, flink.parallelism) == ("flink-jobmanager:8081", 16)
    assert options.get_all_options()["environment_type"] == "DOCKER"


def test_spark_options_reach_their_views():
    options = beam_options.runner_options("SparkRunner", SPARK)
    assert options.view_as(StandardOptions).runner == "SparkRunner"
    assert options.view_as(SparkRunnerOptions).spark_master_url == "spark://spark-master:7077"


def test_default_is_the_in_process_runner_and_env_adds_workers(monkeypatch):
    assert beam_options.beam_options().view_as(StandardOptions).runner == "FnApiRunner"
    monkeypatch.setenv(beam_options.BEAM_ARGS_ENV, "--direct_num_workers=4 --direct_running_mode=multi_processing")
    direct = beam_options.beam_options().view_as(DirectOptions)
    assert (direct.direct_num_workers, direct.direct_running_mode) == (4, "multi_processing")


def test_recipe_beam_section_builds_the_same_flags_as_the_airflow_provider(tiny_data):
    """The recipe's `beam:` section -> our flags == the Beam provider's own conversion."""
    from airflow.providers.apache.beam.hooks.beam import beam_options_to_args

    for runner, options in (("DataflowRunner", DATAFLOW), ("FlinkRunner", FLINK), ("SparkRunner", SPARK)):
        recipe = parse_recipe({**tiny_data, "beam": {"launcher": "provider", "runner": runner,
                                                     "pipeline_options": options}})
        ours = beam_options.runner_args(recipe.beam.runner, recipe.beam.pipeline_options)
        provider = ["--runner=" + runner, *beam_options_to_args(dict(sorted(recipe.beam.pipeline_options.items())))]
        if runner == "DataflowRunner":  # the provider spells use_public_ips=False as --no_use_public_ips
            provider.remove("--no_use_public_ips")
        assert ours == provider


def test_job_command_line_options_go_through_the_environment():
    """`python -m tidal.data.clean --runner=FlinkRunner --flink_master=...` (tidal/data/jobcli.py)."""
    with _pipeline_options(beam_options.runner_args("FlinkRunner", FLINK)):
        options = beam_options.beam_options()
    assert options.view_as(StandardOptions).runner == "FlinkRunner"
    assert options.view_as(FlinkRunnerOptions).flink_master == "flink-jobmanager:8081"
    assert beam_options.beam_options().view_as(StandardOptions).runner == "FnApiRunner"  # restored


def test_bad_option_names_are_refused():
    with pytest.raises(ValueError, match="bare option name"):
        beam_options.runner_args("FlinkRunner", {"--flink_master": "x"})
    with pytest.raises(ValueError, match="bare option name"):
        beam_options.runner_args("FlinkRunner", {"runner": "DataflowRunner"})
