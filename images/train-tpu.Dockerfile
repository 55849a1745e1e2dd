# syntax=docker/dockerfile:1.7
# tidal's TPU training image: python:3.11-slim, a virtualenv with uv.lock's closure (minus
# Airflow) plus jax's TPU runtime (libtpu). Entrypoint: `python -m tidal.train STEP_URI`, the
# same command tidal.launch.local runs as a subprocess; pods on GKE TPU node pools run it.
#
# Dependencies: `uv export --frozen` of uv.lock (sha256 per artifact), then
# images/requirements-train-tpu.txt: jax[tpu]==<uv.lock's jax> resolved against uv.lock as a
# constraint, so jax, jaxlib and numpy stay the lock's versions and the only additions are
# libtpu (pinned by jax's `tpu` extra to one libtpu series, and here to one wheel by version and
# sha256; libtpu is on PyPI, so no find-links index is used at build time) and `requests`.
# images/lock-accelerators.sh regenerates that file; tests/deploy checks it against uv.lock.
#
# Build: docker build -f images/train-tpu.Dockerfile --build-arg GIT_SHA=$(git rev-parse HEAD) \
#          -t REGION-docker.pkg.dev/PROJECT/tidal/train-tpu:SHA .

FROM python:3.11.18-slim-bookworm AS build
COPY --from=ghcr.io/astral-sh/uv:0.13.9 /uv /usr/local/bin/uv
ENV UV_LINK_MODE=copy UV_COMPILE_BYTECODE=1 UV_NO_CACHE=1
WORKDIR /src
COPY pyproject.toml uv.lock README.md ./
COPY images/build-constraints.txt images/requirements-train-tpu.txt images/
COPY tidal/ tidal/
COPY operators/ operators/
RUN uv export --frozen --no-dev --no-emit-project --format requirements.txt \
        --prune apache-airflow --prune apache-airflow-providers-apache-beam \
        --prune apache-airflow-providers-cncf-kubernetes --prune apache-airflow-providers-standard \
        --output-file /tmp/requirements.txt \
    && uv build --wheel --build-constraints images/build-constraints.txt --require-hashes \
        --out-dir /tmp/dist \
    && uv venv /opt/venv --python /usr/local/bin/python3.11 \
    && uv pip install --python /opt/venv/bin/python --require-hashes --no-deps \
        -r /tmp/requirements.txt \
    && uv pip install --python /opt/venv/bin/python --require-hashes --no-deps \
        -r images/requirements-train-tpu.txt \
    && uv pip install --python /opt/venv/bin/python --no-deps /tmp/dist/tidal-0.1.0-py3-none-any.whl

FROM python:3.11.18-slim-bookworm
ARG GIT_SHA=unknown
LABEL org.opencontainers.image.title="tidal-train-tpu" \
      org.opencontainers.image.description="tidal training entrypoint with JAX on Cloud TPU (libtpu)" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.base.name="docker.io/library/python:3.11.18-slim-bookworm" \
      org.opencontainers.image.revision="${GIT_SHA}"
RUN groupadd --gid 10001 tidal \
    && useradd --uid 10001 --gid 10001 --no-log-init --create-home --home-dir /home/tidal tidal
COPY --from=build /opt/venv /opt/venv
ENV PATH="/opt/venv/bin:${PATH}" \
    VIRTUAL_ENV=/opt/venv \
    PYTHONUNBUFFERED=1 \
    TIDAL_GIT_SHA="${GIT_SHA}"
USER 10001
WORKDIR /home/tidal
# No HEALTHCHECK: a batch pod with no server; the Job/JobSet restart policy and the step's
# commit marker (_SUCCESS) decide success, and Kubernetes ignores Dockerfile health checks.
ENTRYPOINT ["python", "-m", "tidal.train"]
