#!/usr/bin/env bash
# libtpu (the TPU compiler and runtime, a PyPI wheel of about 700 MB) for sizing runs ahead of time
# (tidal/train/sizing.py, `tidal size`), once per machine, into a cache keyed by version:
#   $TIDAL_TOOLS_CACHE (default ~/.cache/tidal/tools)/libtpu-$LIBTPU_VERSION/libtpu/libtpu.so
# Not in the locked virtual environment on purpose: a JAX process that finds libtpu on its path loads the
# TPU plugin, and training and test processes on CPU must not (each leaves /tmp/libtpu_lockfile, and a
# left-over lockfile makes the next one fail). The sizer alone puts this folder on its PYTHONPATH.
# LIBTPU_VERSION is the one the locked jax asks for (jax's `tpu` extra: libtpu==0.0.42.*).
# --print: the folder (installed or not).
set -euo pipefail
cd "$(dirname "$0")/../.."
LIBTPU_VERSION="${LIBTPU_VERSION:-0.0.42.1}"
cache="${TIDAL_TOOLS_CACHE:-$HOME/.cache/tidal/tools}"
target="$cache/libtpu-$LIBTPU_VERSION"
if [ "${1:-}" = "--print" ]; then echo "$target"; exit 0; fi
if [ -f "$target/libtpu/libtpu.so" ]; then exit 0; fi
UV="$(command -v uv || echo "$HOME/.local/bin/uv")"
mkdir -p "$cache"
work="$(mktemp -d "$cache/.install-libtpu.XXXXXX")"
trap 'rm -rf "$work"' EXIT
echo "== libtpu $LIBTPU_VERSION into $target (PyPI wheel, about 700 MB; once per machine)"
start=$(date +%s)
"$UV" pip install --quiet --no-deps --python .venv/bin/python --target "$work/libtpu-$LIBTPU_VERSION" \
  "libtpu==$LIBTPU_VERSION"
rm -rf "$target" && mv "$work/libtpu-$LIBTPU_VERSION" "$target"
echo "== libtpu installed in $(( $(date +%s) - start )) s"
