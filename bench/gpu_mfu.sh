#!/usr/bin/env bash
# MFU and tokens/s of tidal's ~1B preset (TinyLlama shape) in bf16 on one NVIDIA GPU (an H200).
#
#   bench/gpu_mfu.sh              # prepare Python, run bench/gpu_mfu.py, print its RESULT line
#   bench/gpu_mfu.sh --smoke      # the same machinery on a tiny model (any machine, CPU too)
#   bench/gpu_mfu.sh --batch 8 --remat    # extra arguments go to bench/gpu_mfu.py
#
# Python: a python3 that already imports a GPU JAX with flax and optax is used as is (machines
# without network, whose image brings them). Otherwise (or with TIDAL_GPU_FRESH_VENV=1) the
# script makes a uv virtual environment ($TIDAL_GPU_VENV, default /tmp/tidal-gpu-venv; pip
# installs uv if it is missing) and installs jax[cuda12] at the version uv.lock pins, with
# flax, optax and numpy at their locked versions; JAX_CUDA_EXTRA=cuda13 picks the CUDA 13 wheels.
# The whole run is bounded by TIDAL_GPU_TIMEOUT seconds (default 480: 8 minutes).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TIDAL_GPU_VENV:-/tmp/tidal-gpu-venv}"
EXTRA="${JAX_CUDA_EXTRA:-cuda12}"
DEADLINE=$(( $(date +%s) + ${TIDAL_GPU_TIMEOUT:-480} ))
PY=python3
SMOKE=0
for arg in "$@"; do [[ "$arg" == "--smoke" ]] && SMOKE=1; done

has_jax() {  # $1: python; GPU backend required unless --smoke
  "$1" - "$SMOKE" <<'PY' 2>/dev/null
import sys
import jax, flax, optax  # noqa: F401
sys.exit(0 if sys.argv[1] == "1" or jax.default_backend() == "gpu" else 1)
PY
}

locked() {  # version of package $1 in uv.lock
  python3 - "$1" "$REPO/uv.lock" <<'PY'
import sys, tomllib
with open(sys.argv[2], "rb") as f:
    lock = tomllib.load(f)
print(next(p["version"] for p in lock["package"] if p["name"] == sys.argv[1]))
PY
}

if [[ "$SMOKE" == 1 && "${TIDAL_GPU_FRESH_VENV:-0}" != 1 && -x "$REPO/.venv/bin/python" ]] && has_jax "$REPO/.venv/bin/python"; then
  PY="$REPO/.venv/bin/python"; echo "smoke: using the repository's $PY"
elif [[ "${TIDAL_GPU_FRESH_VENV:-0}" != 1 ]] && has_jax python3; then
  echo "using $(command -v python3) (jax, flax, optax already there)"
elif [[ "${TIDAL_GPU_FRESH_VENV:-0}" != 1 ]] && [[ -x "$VENV/bin/python" ]] && has_jax "$VENV/bin/python"; then
  PY="$VENV/bin/python"; echo "using $PY"
else
  command -v uv >/dev/null || python3 -m pip install --quiet uv
  UV="$(command -v uv || echo "python3 -m uv")"
  JAX="$(locked jax)"; FLAX="$(locked flax)"; OPTAX="$(locked optax)"; NUMPY="$(locked numpy)"
  echo "creating $VENV: jax[$EXTRA]==$JAX flax==$FLAX optax==$OPTAX numpy==$NUMPY (uv.lock)"
  $UV venv --quiet --python python3 "$VENV"
  $UV pip install --quiet --python "$VENV/bin/python" "jax[$EXTRA]==$JAX" "flax==$FLAX" "optax==$OPTAX" \
    "numpy==$NUMPY"
  PY="$VENV/bin/python"
fi

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
LEFT=$(( DEADLINE - $(date +%s) ))
if (( LEFT < 60 )); then echo "gpu_mfu.sh: only ${LEFT} s left of the time limit after setup" >&2; exit 1; fi
cd "$REPO"
# the benchmark measures the 1B model alone: let JAX take 95 % of the GPU's memory (default 75 %)
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.95}" PYTHONUNBUFFERED=1
exec timeout "$LEFT" "$PY" bench/gpu_mfu.py "$@"
