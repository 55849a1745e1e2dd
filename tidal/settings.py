"""Every environment variable tidal reads, in one typed settings object (pydantic-settings).

Invariant: no module of ``tidal/`` reads ``os.environ`` for its own configuration; it asks
:func:`current`. An entry point (``tidal`` CLI, a standalone job, the training entrypoint) reads
the environment once with :func:`entry_point`, and what it starts gets the settings explicitly
(:meth:`Settings.child_env`), so a pod or subprocess sees exactly what its parent decided. A
malformed value (``TIDAL_STATSD_PORT=abc``) is one error naming the variable, at start-up.

Outside an entry point (a library call, a test) :func:`current` reads the environment at the
call, so a changed variable is seen.

Variables of other programs stay theirs: ``JAX_*``/``TPU_*``/``MEGASCALE_*`` (JAX and GKE,
:mod:`tidal.train.distributed`), ``MLFLOW_HTTP_REQUEST_*`` (MLflow's client), ``AWS_*`` (boto3),
``TOKENIZERS_PARALLELISM`` (tokenizers), ``GX_ANALYTICS_ENABLED`` (Great Expectations).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Annotated

from pydantic import AliasChoices, Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from tidal.config import EndpointUrl, problems

TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
MLFLOW_RUN_ID_ENV = "TIDAL_MLFLOW_RUN_ID"
MLFLOW_EXPERIMENT_ENV = "TIDAL_MLFLOW_EXPERIMENT"
FLUSH_TIMEOUT_ENV = "TIDAL_TRACKING_FLUSH_TIMEOUT_S"


def _env(name: str, description: str, **kwargs):
    return Field(validation_alias=AliasChoices(name), description=f"${name}: {description}", **kwargs)


class SettingsError(ValueError):
    """An environment variable tidal reads has a malformed value; the message names it."""


class Settings(BaseSettings):
    """tidal's environment. Not hashed: none of these changes what a step computes."""

    model_config = SettingsConfigDict(frozen=True, extra="ignore", case_sensitive=True, populate_by_name=False)

    storage_root: str | None = _env("TIDAL_STORAGE_ROOT", "storage root (local path or s3://); overrides the recipe",
                                    default=None)
    storage_cache: str | None = _env("TIDAL_STORAGE_CACHE", "local cache of an object store's committed steps",
                                     default=None)
    s3_endpoint_url: EndpointUrl = _env("TIDAL_S3_ENDPOINT_URL", "S3 endpoint; overrides storage.endpoint_url",
                                       default=None)
    gcs_endpoint_url: EndpointUrl = _env("TIDAL_GCS_ENDPOINT_URL", "GCS JSON API endpoint for gs:// checkpoints and "
                                         "handed-over objects (an emulator); unset: Google's", default=None)
    tracking_uri: str | None = _env(TRACKING_URI_ENV, "MLflow tracking URI; overrides the recipe", default=None)
    tracking_pending_dir: str | None = _env("TIDAL_TRACKING_PENDING_DIR",
                                            "where undelivered MLflow calls are buffered", default=None)
    tracking_flush_timeout_s: Annotated[float, Field(gt=0)] = _env(
        FLUSH_TIMEOUT_ENV, "seconds live metrics may take to flush at close", default=60.0)
    mlflow_ui_url: str | None = _env("TIDAL_MLFLOW_UI_URL", "MLflow UI base URL for links", default=None)
    mlflow_run_id: str | None = _env(MLFLOW_RUN_ID_ENV, "the live run a training process logs into",
                                     default=None)
    mlflow_experiment: str | None = _env(MLFLOW_EXPERIMENT_ENV, "the experiment of that live run",
                                         default=None)
    statsd_host: str | None = _env("TIDAL_STATSD_HOST", "StatsD host; unset: no metrics", default=None)
    statsd_port: Annotated[int, Field(gt=0, lt=65536)] = _env("TIDAL_STATSD_PORT", "StatsD UDP port", default=8125)
    statsd_prefix: str = _env("TIDAL_STATSD_PREFIX", "StatsD metric prefix", default="tidal")
    signing_key: SecretStr | None = _env("TIDAL_SIGNING_KEY", "hex HMAC key that signs commits", default=None)
    git_sha: str | None = _env("TIDAL_GIT_SHA", "git sha recorded in provenance (images have no .git)",
                               default=None)
    archive_cache: str | None = _env("TIDAL_ARCHIVE_CACHE", "where pinned corpus archives are cached",
                                     default=None)
    beam_args: str = _env("TIDAL_BEAM_ARGS", "extra Beam pipeline options (shell words)", default="")
    beam_worker_image: str | None = _env("TIDAL_BEAM_WORKER_IMAGE", "images/beam-worker image for cluster "
                                         "runners' SDK workers (--sdk_container_image)", default=None)
    recipes_dir: str | None = _env("TIDAL_RECIPES_DIR", "the recipes the DAG file and on-call page serve",
                                   default=None)
    fault_dir: str | None = _env("TIDAL_FAULT_DIR", "drills: a file named after a step makes it fail", default=None)
    pod_secret_env: str | None = _env("TIDAL_POD_SECRET_ENV", "secretKeyRef env entries of training pods",
                                      default=None)
    alert_webhook_url: SecretStr | None = _env("TIDAL_ALERT_WEBHOOK_URL", "failure alerts go here; unset: none",
                                               default=None)
    alert_format: str = _env("TIDAL_ALERT_FORMAT", "slack or pagerduty", default="slack")
    pagerduty_routing_key: SecretStr | None = _env("TIDAL_PAGERDUTY_ROUTING_KEY", "PagerDuty Events v2 key",
                                                   default=None)
    alert_timeout_s: Annotated[float, Field(gt=0)] = _env("TIDAL_ALERT_TIMEOUT_S", "seconds per alert POST",
                                                          default=5.0)
    train_watchdog_s: Annotated[float, Field(gt=0)] | None = _env(
        "TIDAL_TRAIN_WATCHDOG_S", "seconds without a training step before the trainer dumps its stacks and exits 76",
        default=None)
    train_peer_timeout_s: Annotated[int, Field(gt=0)] = _env(
        "TIDAL_TRAIN_PEER_TIMEOUT_S", "seconds without a heartbeat before a multi-process run declares a "
        "process gone (jax.distributed heartbeat_timeout_seconds)", default=100)
    train_lease_ttl_s: Annotated[float, Field(gt=0)] = _env(
        "TIDAL_TRAIN_LEASE_TTL_S", "seconds a trainer's lease on its step lives without a heartbeat; a second "
        "trainer of the step waits 1.5x this, then exits 3 (tidal/train/fence.py)", default=60.0)
    train_profile_steps: str | None = _env(
        "TIDAL_TRAIN_PROFILE_STEPS", "FIRST:LAST training steps to trace with jax.profiler (profile_trace/)",
        default=None)
    tools_cache: str | None = _env(
        "TIDAL_TOOLS_CACHE", "where make tools keeps Flink, the Kubernetes tools and libtpu (default "
        "~/.cache/tidal/tools)", default=None)
    libtpu_dir: str | None = _env(
        "TIDAL_LIBTPU_DIR", "folder holding the libtpu package the sizer compiles with (tidal size; default "
        "~/.cache/tidal/tools/libtpu-<version>, made by tools/tpu/install.sh)", default=None)
    sizing_cache: str | None = _env(
        "TIDAL_SIZING_CACHE", "where sizings are kept by content (default ~/.cache/tidal/sizing)", default=None)
    hold_before_marker: str | None = _env(
        "TIDAL_STORAGE_HOLD_BEFORE_MARKER", "tests only: a file to create, then pause before _SUCCESS", default=None)

    def child_env(self) -> dict[str, str]:
        """The variables a child process (a training subprocess, a job) gets from this one: every
        setting that is set, under its variable name; secrets in the clear (the child needs them)."""
        out = {}
        for name, field in type(self).model_fields.items():
            value = getattr(self, name)
            if value is None or value == field.default:
                continue
            env_name = field.validation_alias.choices[0]
            out[env_name] = value.get_secret_value() if isinstance(value, SecretStr) else str(value)
        return out


_ENTRY: list[Settings] = []


def read() -> Settings:
    """The settings in the environment now.

    Raises:
        SettingsError: a variable has a malformed value (names it and the rule).
    """
    try:
        return Settings()
    except ValidationError as err:
        raise SettingsError("environment: " + "; ".join(problems(err))) from None


def current() -> Settings:
    """The entry point's settings while one is active (:func:`entry_point`), else :func:`read`."""
    return _ENTRY[-1] if _ENTRY else read()


@contextlib.contextmanager
def entry_point(settings: Settings | None = None) -> Iterator[Settings]:
    """Read the environment once for an entry point's whole run (or use ``settings``).

    Raises:
        SettingsError: a variable has a malformed value.
    """
    _ENTRY.append(settings if settings is not None else read())
    try:
        yield _ENTRY[-1]
    finally:
        _ENTRY.pop()


__all__ = ["Settings", "SettingsError", "current", "entry_point", "read"]
