"""Recipe sections that never enter a step id: where training runs (``train.resources``),
where Beam steps run (``beam``), how outputs reach storage (``storage``), when Airflow reruns
the recipe (``schedule``) and what a run is compared with (``baseline``). They change where,
how fast or whether a run passes, never what a step computes; the planner leaves them out."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic import Strict as StrictType

from tidal.config import EndpointUrl, PositiveInt, Strict
from tidal.launch.config import AcceleratorConfig, ResourceConfig
from tidal.storage import StorageSettings

__all__ = ["AcceleratorConfig", "BeamConfig", "ResourceConfig"]


# Beam runners a data step may name (`beam.runner`). FnApiRunner is the in-process batch engine
# that Beam's DirectRunner itself uses; the DirectRunner first tries PrismRunner, which downloads a
# Go binary at run time (see tidal/data/beam_options.py), so tidal names FnApiRunner by default.
BEAM_RUNNERS = ("FnApiRunner", "DirectRunner", "PrismRunner", "DataflowRunner", "FlinkRunner", "SparkRunner",
                "PortableRunner")
# Arguments of the job command line itself (tidal/data/jobcli.py); pipeline options cannot set them.
BEAM_JOB_ARGS = ("config", "input", "out", "seed", "name", "runner")


class BeamConfig(Strict):
    """How the Beam data steps (clean, tokenize) run. Not hashed: runners never change the bytes."""

    launcher: Literal["inprocess", "provider"] = Field(
        default="inprocess",
        description="inprocess: inside the step task ($TIDAL_BEAM_ARGS); provider: the Beam provider's "
        "BeamRunPythonPipelineOperator runs `python -m tidal.data.<kind>` (operators/beam.py)",
    )
    runner: str = Field(
        default="FnApiRunner", description=f"Beam runner (launcher: provider): {', '.join(BEAM_RUNNERS)}")
    pipeline_options: dict[str, str | bool | int | float | list[str]] = Field(
        default_factory=dict,
        description="Beam pipeline options for the runner (launcher: provider), e.g. project, region, "
        "temp_location, sdk_container_image, flink_master; a list gives a repeated option (experiments, "
        "job_server_jvm_properties), one flag per item",
    )

    @field_validator("runner")
    @classmethod
    def _known_runner(cls, runner: str) -> str:
        if runner not in BEAM_RUNNERS:
            raise ValueError(f"unknown Beam runner {runner!r}; valid: {', '.join(BEAM_RUNNERS)}")
        return runner

    @field_validator("pipeline_options")
    @classmethod
    def _option_names(cls, options: dict) -> dict:
        for key in options:
            if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", key):
                raise ValueError(f"pipeline option {key!r}: write the bare name (temp_location), no dashes or '='")
            if key in BEAM_JOB_ARGS:
                raise ValueError(f"pipeline option {key!r} is set by tidal (job arguments and `beam.runner`)")
        return options

    @model_validator(mode="after")
    def _provider_only(self) -> BeamConfig:
        if self.launcher == "inprocess" and (self.runner != "FnApiRunner" or self.pipeline_options):
            raise ValueError("`runner` and `pipeline_options` apply to `launcher: provider`; in-process Beam "
                             "steps take runner options from $TIDAL_BEAM_ARGS")
        return self

# Presets Airflow accepts for a periodic schedule (airflow.timetables / "Cron Presets" in the docs).
SCHEDULE_PRESETS = ("@hourly", "@daily", "@weekly", "@monthly", "@quarterly", "@yearly")


class BaselineConfig(Strict):
    """A known-good run that scheduled validation runs are compared with (tidal/quality/baseline.py).

    Not hashed: it decides whether a run *passes*, never what a step computes. ``file`` may
    not exist yet when the recipe is loaded: ``tidal baseline RECIPE`` writes it from a run of
    this very recipe. Until it exists ``tidal plan`` shows it as MISSING and every comparison
    fails naming this field and that command (a run never passes uncompared).
    """

    file: str = Field(
        min_length=1,
        description="baseline JSON (stats and loss curve), relative to the recipe file; "
        "written by `tidal baseline RECIPE --from-run KEY` or by hand",
    )
    loss_tolerance: Annotated[float, Field(ge=0.0)] = Field(
        default=0.05, description="allowed |got - expected| of each loss-curve point and the eval loss (nats)"
    )
    stats_tolerance: Annotated[float, Field(ge=0.0)] = Field(
        default=0.01, description="allowed relative difference |got - expected| / max(|expected|, 1) of each stat"
    )


class StorageConfig(Strict):
    """How step outputs reach the storage root (tidal/storage/base.py StorageSettings). Not hashed:
    where data lives and how fast it moves never change a step id."""

    endpoint_url: EndpointUrl = Field(
        default=None, description="S3 API endpoint for s3:// roots: none = AWS; https://storage.googleapis.com "
        "= GCS (HMAC keys); a MinIO URL. $TIDAL_S3_ENDPOINT_URL overrides it")
    region: str | None = Field(default=None, description="bucket region (default: boto3's, e.g. $AWS_DEFAULT_REGION)")
    max_attempts: PositiveInt = Field(default=10, description="botocore adaptive-mode attempts per request")
    multipart_threshold_mb: PositiveInt = Field(
        default=64, description="files at least this large upload in parts (MiB)")
    multipart_chunk_mb: Annotated[int, StrictType(), Field(ge=5)] = Field(
        default=16, description="multipart part size (MiB; S3's minimum part is 5 MiB)")
    max_concurrency: PositiveInt = Field(default=8, description="parallel transfers (parts per file, files per commit)")
    lease_ttl_s: Annotated[float, Field(gt=0)] = Field(
        default=120.0, description="seconds a step lease lives without a heartbeat (heartbeat every ttl/4)")
    lease_wait_s: Annotated[float, Field(ge=0)] = Field(
        default=1800.0, description="longest wait for another worker's lease on the same step (seconds)")
    failed_attempts_kept: Annotated[int, StrictType(), Field(ge=0)] = Field(
        default=3, description="failed attempts kept per step under {root}/.failed (newest; 0: none)")

    def settings(self) -> Any:
        """The :class:`tidal.storage.StorageSettings` these fields describe."""
        return StorageSettings(
            endpoint_url=self.endpoint_url, region=self.region, max_attempts=self.max_attempts,
            multipart_threshold_bytes=self.multipart_threshold_mb * 2**20,
            multipart_chunk_bytes=self.multipart_chunk_mb * 2**20, max_concurrency=self.max_concurrency,
            lease_ttl_s=self.lease_ttl_s, lease_wait_s=self.lease_wait_s,
            failed_attempts_kept=self.failed_attempts_kept)

