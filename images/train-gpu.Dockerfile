# syntax=docker/dockerfile:1.7
# tidal's GPU training image: NVIDIA's CUDA 12.9 Ubuntu 24.04 base, a uv-managed CPython 3.11
# and a virtualenv with uv.lock's closure (minus Airflow) plus jax[cuda12]. Entrypoint:
# `python -m tidal.train STEP_URI`, the same command tidal.launch.local runs as a subprocess.
#
# Why the `base` flavour of nvidia/cuda rather than `runtime`: jax[cuda12] brings CUDA's
# user-space libraries (cuBLAS, cuDNN, cuFFT, NCCL, nvJitLink, ...) as NVIDIA's own PyPI wheels,
# pinned by hash in images/requirements-train-gpu.txt, and JAX loads those. The `runtime`
# flavour would add a second, unpinned copy (~3 GB) that nothing loads. What the base image is
# for: NVIDIA's container environment (NVIDIA_VISIBLE_DEVICES, NVIDIA_DRIVER_CAPABILITIES,
# LD_LIBRARY_PATH including /usr/local/nvidia/lib64 where GKE mounts the host driver) and a
# CUDA 12.9 user space that matches the wheels. CUDA 12 rather than 13: GKE's default and
# `latest` driver versions serve CUDA 12; CUDA 13 needs an R580+ driver on every node.
#
# Dependencies: `uv export --frozen` of uv.lock (sha256 per artifact), then
# images/requirements-train-gpu.txt: jax[cuda12]==<uv.lock's jax> resolved with uv.lock as a
# constraint (jax, jaxlib, numpy stay the lock's versions); regenerate it with
# images/lock-accelerators.sh.
#
# Build: docker build -f images/train-gpu.Dockerfile --build-arg GIT_SHA=$(git rev-parse HEAD) \
#          -t REGION-docker.pkg.dev/PROJECT/tidal/train-gpu:SHA .

FROM nvidia/cuda:12.9.1-base-ubuntu24.04 AS build
COPY --from=ghcr.io/astral-sh/uv:0.13.9 /uv /usr/local/bin/uv
# Ubuntu 24.04 ships Python 3.12; tidal is locked for 3.11, so uv installs a pinned CPython
# 3.11 (python-build-standalone) into /opt/python, copied into the final stage unchanged.
ENV UV_LINK_MODE=copy UV_COMPILE_BYTECODE=1 UV_NO_CACHE=1 \
    UV_PYTHON_INSTALL_DIR=/opt/python UV_PYTHON_PREFERENCE=only-managed
WORKDIR /src
COPY pyproject.toml uv.lock README.md ./
COPY images/build-constraints.txt images/requirements-train-gpu.txt images/
COPY tidal/ tidal/
COPY operators/ operators/
RUN uv python install 3.11.18 \
    && uv export --frozen --no-dev --no-emit-project --format requirements.txt \
        --prune apache-airflow --prune apache-airflow-providers-apache-beam \
        --prune apache-airflow-providers-cncf-kubernetes --prune apache-airflow-providers-standard \
        --output-file /tmp/requirements.txt \
    && uv build --wheel --python 3.11.18 --build-constraints images/build-constraints.txt \
        --require-hashes --out-dir /tmp/dist \
    && uv venv /opt/venv --python 3.11.18 \
    && uv pip install --python /opt/venv/bin/python --require-hashes --no-deps \
        -r /tmp/requirements.txt \
    && uv pip install --python /opt/venv/bin/python --require-hashes --no-deps \
        -r images/requirements-train-gpu.txt \
    && uv pip install --python /opt/venv/bin/python --no-deps /tmp/dist/tidal-0.1.0-py3-none-any.whl

FROM nvidia/cuda:12.9.1-base-ubuntu24.04
ARG GIT_SHA=unknown
LABEL org.opencontainers.image.title="tidal-train-gpu" \
      org.opencontainers.image.description="tidal training entrypoint with JAX on NVIDIA GPUs (CUDA 12)" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.base.name="docker.io/nvidia/cuda:12.9.1-base-ubuntu24.04" \
      org.opencontainers.image.revision="${GIT_SHA}"
RUN groupadd --gid 10001 tidal \
    && useradd --uid 10001 --gid 10001 --no-log-init --create-home --home-dir /home/tidal tidal
COPY --from=build /opt/python /opt/python
COPY --from=build /opt/venv /opt/venv
ENV PATH="/opt/venv/bin:${PATH}" \
    VIRTUAL_ENV=/opt/venv \
    PYTHONUNBUFFERED=1 \
    TIDAL_GIT_SHA="${GIT_SHA}"
USER 10001
WORKDIR /home/tidal
# No HEALTHCHECK: a batch pod with no server (see train-tpu.Dockerfile).
ENTRYPOINT ["python", "-m", "tidal.train"]
