#!/usr/bin/env bash
# Prepare, on a development machine with pip and network access, the wheels that
# scripts/device_check.sh installs on a GPU machine that has no network. They go to .whl/
# (git-ignored) and travel with the working tree (64 MiB at most in all).
#
#     scripts/fetch_device_wheels.sh              # the engine's CUDA tests and bench_gpu.py
#     scripts/fetch_device_wheels.sh --torchrec   # also the TorchRec stack, for its exactness test
#
# The GPU image targeted (python3 3.12 with a CUDA build of torch, numpy and pytest) already has
# everything the engine tests and the benchmark use, so the first form fetches nothing. The
# TorchRec stack must match the image's torch: set TORCHREC_VERSION and FBGEMM_VERSION to the
# release pair built for it. FBGEMM's CUDA wheel is larger than the carry limit on its own; the
# script stops with that message rather than leave a folder that cannot travel.
set -euo pipefail
cd "$(dirname "$0")/.."
PYV=${DEVICE_PYTHON_VERSION:-3.12}
LIMIT_MB=${CARRY_LIMIT_MB:-60}
mkdir -p .whl
if [ "${1:-}" != "--torchrec" ]; then
  echo "nothing to fetch: the GPU image has what the engine tests and bench_gpu.py need"
  exit 0
fi
: "${TORCHREC_VERSION:?set TORCHREC_VERSION to the torchrec release built for the GPU image's torch}"
: "${FBGEMM_VERSION:?set FBGEMM_VERSION to the fbgemm-gpu release built for the GPU image's torch}"
PIP=${PIP:-.venv/bin/python -m pip}
$PIP download --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d .whl \
  "torchrec==$TORCHREC_VERSION" "fbgemm-gpu==$FBGEMM_VERSION" tensordict iopath portalocker
mb=$(du -sm .whl | cut -f1)
ls -l .whl
if [ "$mb" -gt "$LIMIT_MB" ]; then
  echo "the wheels take ${mb} MiB, over the ${LIMIT_MB} MiB that can travel: the TorchRec stack cannot be brought to the GPU machine this way" >&2
  exit 1
fi
echo "${mb} MiB in .whl/: carry .whl with scripts/device_check.sh"
