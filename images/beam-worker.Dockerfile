# syntax=docker/dockerfile:1.7
# tidal's Beam worker image: the Apache Beam Python 3.11 SDK container (its /opt/apache/beam/boot
# entrypoint is what Dataflow, Flink and Spark portable runners start) plus tidal's data jobs.
# Pass it as `--sdk_container_image=REGION-docker.pkg.dev/PROJECT/tidal/beam-worker:SHA`
# (through TIDAL_BEAM_ARGS) so workers import tidal.data.* without staging anything.
#
# Dependencies come from uv.lock: `uv export --frozen` with sha256 hashes, installed with
# `pip --require-hashes --no-deps`. Airflow and its providers are pruned from the export
# (`--prune`): tidal's core never imports Airflow, and the workers only run tidal.data code.
# uv.lock pins apache-beam 2.77.0, the SDK image's version, so the SDK harness is unchanged.
#
# Build: docker build -f images/beam-worker.Dockerfile --build-arg GIT_SHA=$(git rev-parse HEAD) \
#          -t REGION-docker.pkg.dev/PROJECT/tidal/beam-worker:SHA .

FROM python:3.11.18-slim-bookworm AS lock
COPY --from=ghcr.io/astral-sh/uv:0.13.9 /uv /usr/local/bin/uv
WORKDIR /src
COPY pyproject.toml uv.lock README.md ./
COPY images/build-constraints.txt images/
COPY tidal/ tidal/
COPY operators/ operators/
RUN uv export --frozen --no-dev --no-emit-project --format requirements.txt \
        --prune apache-airflow --prune apache-airflow-providers-apache-beam \
        --prune apache-airflow-providers-cncf-kubernetes --prune apache-airflow-providers-standard \
        --output-file /out/requirements.txt \
    && uv build --wheel --build-constraints images/build-constraints.txt --require-hashes \
        --out-dir /out/dist

FROM apache/beam_python3.11_sdk:2.77.0
ARG GIT_SHA=unknown
LABEL org.opencontainers.image.title="tidal-beam-worker" \
      org.opencontainers.image.description="Apache Beam 2.77.0 Python 3.11 SDK worker with tidal's data jobs" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.base.name="docker.io/apache/beam_python3.11_sdk:2.77.0" \
      org.opencontainers.image.revision="${GIT_SHA}"
# The SDK image installs into the system interpreter as root; install there, then drop to a
# numeric non-root user for run time.
RUN --mount=type=bind,from=lock,source=/out,target=/tmp/tidal \
    pip install --no-cache-dir --no-deps --require-hashes -r /tmp/tidal/requirements.txt \
    && pip install --no-cache-dir --no-deps /tmp/tidal/dist/tidal-0.1.0-py3-none-any.whl \
    && groupadd --gid 10001 tidal \
    && useradd --uid 10001 --gid 10001 --no-log-init --create-home --home-dir /home/tidal tidal
ENV TIDAL_GIT_SHA="${GIT_SHA}"
USER 10001
# ENTRYPOINT stays the SDK's /opt/apache/beam/boot. No HEALTHCHECK: the runner supervises the
# SDK harness over its control channel; a Docker health check has nothing to add there.
