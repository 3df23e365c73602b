#!/usr/bin/env bash
# Fetch, on a development machine with pip and a package index, the TorchRec stack that
# scripts/device_check.sh installs on the GPU machine, which has no network. The wheels go to
# .whl/ (git-ignored), which travels with the working tree: everything carried is 64 MiB at most.
#
#     scripts/fetch_device_wheels.sh
#
# The GPU image targeted: Python 3.12 with torch 2.11 (CUDA 13.0), numpy, pytest, torchmetrics,
# tqdm, pyre-extensions and typing-inspect; no torchrec and no fbgemm_gpu. TorchRec 1.6.1 is the
# release built against torch 2.11, and fbgemm-gpu-cpu 1.6.0 its FBGEMM, as the small CPU build:
# frugal tables run no FBGEMM kernel, so it is enough for them on CUDA (FBGEMM's CUDA build is
# about 465 MB and cannot travel). tensordict, pyvers, iopath, portalocker, cloudpickle, orjson and
# importlib_metadata are what those import. Everything is pinned and fetched without dependencies.
# numba is not carried: its llvmlite wheel (60 MB) alone is over the limit, so on the GPU machine the
# engine's host loops run their numpy twins (torchrec_frugal/kernels), slower, with the same numbers.
# DEVICE_PYTHON_VERSION, DEVICE_WHEELS (the requirement list), CARRY_LIMIT_MB and PIP override.
set -euo pipefail
cd "$(dirname "$0")/.."
PYV=${DEVICE_PYTHON_VERSION:-3.12}
LIMIT_MB=${CARRY_LIMIT_MB:-48}
WHEELS=${DEVICE_WHEELS:-"torchrec==1.6.1 fbgemm-gpu-cpu==1.6.0 tensordict==0.11.0 pyvers==0.2.3 iopath==0.1.9 portalocker==4.4.2 cloudpickle==3.1.3 orjson==3.13.0 importlib_metadata==10.2.0"}
PIP=${PIP:-.venv/bin/python -m pip}
rm -rf .whl
mkdir -p .whl
# shellcheck disable=SC2086  # PIP and WHEELS are word lists
$PIP download --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d .whl $WHEELS
count=$(find .whl -maxdepth 1 -type f -name '*.whl' | wc -l)
expected=$(echo $WHEELS | wc -w)
if [ "$count" -ne "$expected" ]; then
  echo "fetched $count wheels for $expected requirements: .whl/ is incomplete" >&2
  exit 1
fi
kb=$(du -sk .whl | cut -f1)
ls -l .whl
if [ "$kb" -gt $((LIMIT_MB * 1024)) ]; then
  echo "the wheels take $((kb / 1024)) MiB, over the ${LIMIT_MB} MiB that may travel: they cannot be carried to the GPU machine" >&2
  exit 1
fi
echo "$((kb / 1024)).$(( (kb % 1024) * 10 / 1024 )) MiB in .whl/ ($count wheels): carry .whl with scripts/device_check.sh"
