# syntax=docker/dockerfile:1.7
# tidal's Airflow image: the official apache/airflow image plus tidal, its operators, the DAG
# file and the recipes. The Helm chart runs every Airflow component (api-server, scheduler,
# dag-processor, triggerer, KubernetesExecutor task pods) and the MLflow server from it.
#
# Dependencies come from uv.lock, never from a fresh resolve: the `lock` stage runs
# `uv export --frozen` (fails if uv.lock is out of date with pyproject.toml) into a
# requirements file with a sha256 for every artifact, and the final stage installs it with
# `pip --require-hashes --no-deps`: exactly the locked closure, nothing resolved at build time.
# Why export + pip rather than `uv sync`: the base image keeps Airflow in a virtualenv
# (/home/airflow/.local) together with the providers and drivers the chart needs and our lock
# does not carry (postgres/psycopg2, google). `uv sync` would remove them unless run with
# `--inexact`; pip installs over the image's environment the way Airflow's own docs extend
# the image. uv.lock pins apache-airflow 3.3.2, the base image's version, so Airflow itself
# is untouched.
#
# Build (from the repository root; see README "Deploy on GKE"):
#   docker build -f images/airflow.Dockerfile --build-arg GIT_SHA=$(git rev-parse HEAD) \
#     -t REGION-docker.pkg.dev/PROJECT/tidal/airflow:SHA .
# Base images are pinned by tag; to pin by digest as well, append @sha256:... to each FROM
# (`docker buildx imagetools inspect IMAGE:TAG` prints it).

FROM python:3.11.18-slim-bookworm AS lock
COPY --from=ghcr.io/astral-sh/uv:0.13.9 /uv /usr/local/bin/uv
WORKDIR /src
COPY pyproject.toml uv.lock README.md ./
COPY images/build-constraints.txt images/
COPY tidal/ tidal/
COPY operators/ operators/
RUN uv export --frozen --no-dev --no-emit-project --format requirements.txt \
        --output-file /out/requirements.txt \
    && uv build --wheel --build-constraints images/build-constraints.txt --require-hashes \
        --out-dir /out/dist

FROM apache/airflow:3.3.2-python3.11
ARG GIT_SHA=unknown
LABEL org.opencontainers.image.title="tidal-airflow" \
      org.opencontainers.image.description="Apache Airflow 3.3.2 with tidal's operators, DAGs and recipes" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.base.name="docker.io/apache/airflow:3.3.2-python3.11" \
      org.opencontainers.image.revision="${GIT_SHA}"
# The base image's user: uid 50000, group 0 (OpenShift-style group-writable files).
USER 50000
RUN --mount=type=bind,from=lock,source=/out,target=/tmp/tidal \
    pip install --no-cache-dir --no-deps --require-hashes -r /tmp/tidal/requirements.txt \
    && pip install --no-cache-dir --no-deps /tmp/tidal/dist/tidal-0.1.0-py3-none-any.whl
# DAGs baked into the image (the chart can use git-sync instead): dags/pretrain.py finds the
# recipes in ../recipes, which is /opt/airflow/recipes here and <repo>/recipes under git-sync.
COPY --chown=50000:0 dags/ /opt/airflow/dags/
COPY --chown=50000:0 recipes/ /opt/airflow/recipes/
ENV TIDAL_GIT_SHA="${GIT_SHA}"
# No HEALTHCHECK: one image serves five Airflow components with different health endpoints;
# Kubernetes ignores Dockerfile HEALTHCHECK and the Airflow chart defines a probe per component.
