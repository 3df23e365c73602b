#!/usr/bin/env bash
# Device check of the CUDA path: prepares a bare GPU machine, runs the CUDA tests with 2 and 4
# ranks sharing GPU 0, the TorchRec exactness test where that stack imports, and
# benchmarks/bench_gpu.py, then writes docs/gpu.md from what it measured. Under 8 minutes.
#
# Run from the repository root of a copy of the working tree on the GPU machine:
#     bash scripts/device_check.sh
# Wheels: the image it was written for has python3 with a CUDA build of torch, numpy and pytest,
# which is all the engine tests and the benchmark need. Anything else travels as wheels in .whl/
# (git-ignored), prepared on a development machine with scripts/fetch_device_wheels.sh and
# carried along; they are installed into a private folder, never over the image's packages.
# Results: docs/gpu.md in the tree, and docs/gpu.md, the JSON, the test table and the log in
# $OUT (or /tmp/frugal-device-check) to bring back.
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
DEADLINE=$((START + ${CHECK_BUDGET_S:-450}))
RES=${OUT:-/tmp/frugal-device-check}
mkdir -p "$RES"
LOG="$RES/check.log"
TESTS="$RES/tests.tsv"
: >"$TESTS"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
exec > >(tee -a "$LOG") 2>&1

left() { echo $((DEADLINE - $(date +%s))); }
budget() { # the smaller of $1 seconds and what is left before the deadline
  local l; l=$(left)
  if [ "$l" -lt "$1" ]; then echo "$l"; else echo "$1"; fi
}

echo "== machine"
if ! nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; then
  echo "no NVIDIA GPU here: the device check has not run (docs/gpu.md left as it is)"
  exit 2
fi
$PY - <<'PY' || { echo "python3 has no CUDA torch: the device check has not run"; exit 2; }
import sys, torch
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)
assert torch.cuda.is_available(), "torch sees no CUDA device"
print("device", torch.cuda.get_device_name(0), "count", torch.cuda.device_count())
PY

echo "== prepare"
SITE=/tmp/frugal-site
if compgen -G ".whl/*.whl" >/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
    || echo "installing the carried wheels failed; going on with the image's packages"
  export PYTHONPATH="$PWD:$SITE"
else
  echo "no carried wheels (.whl/): using the image's packages"
  export PYTHONPATH="$PWD"
fi
$PY -c "import numpy, pytest, torchrec_frugal.engine; print('numpy', numpy.__version__, 'pytest', pytest.__version__)" || exit 3

# One pytest run per line of the test table: suite name, timeout, pytest arguments.
suite() {
  local name=$1 limit=$2; shift 2
  local t; t=$(budget "$limit")
  if [ "$t" -lt 20 ]; then
    printf '%s\tnot run: out of time\n' "$name" >>"$TESTS"; return
  fi
  echo "== $name (at most ${t}s)"
  local out; out=$(mktemp)
  timeout "$t" $PY -m pytest -q -p no:cacheprovider -o timeout=0 "$@" 2>&1 | tee "$out"
  local rc=${PIPESTATUS[0]}
  local summary; summary=$(grep -E '(passed|failed|error|skipped)' "$out" | tail -n 1 | sed 's/=//g; s/^ *//; s/ *$//')
  [ "$rc" -eq 124 ] && summary="timed out after ${t}s ($summary)"
  printf '%s\t%s (exit %s)\n' "$name" "${summary:-no summary}" "$rc" >>"$TESTS"
}

suite "device layer, CPU parts (tests/test_device_paths.py)" 90 tests/test_device_paths.py
suite "CUDA unit tests: mapped tables, staged copies, flush stream" 60 tests/test_cuda_engine.py -k "not ranks_sharing"
suite "engine exactness on CUDA, 2 ranks on one GPU" 120 "tests/test_cuda_engine.py::test_engine_exact_with_ranks_sharing_one_gpu[2]"
suite "engine exactness on CUDA, 4 ranks on one GPU" 120 "tests/test_cuda_engine.py::test_engine_exact_with_ranks_sharing_one_gpu[4]"

echo "== TorchRec"
if why=$($PY -c "import torchrec, fbgemm_gpu; print('torchrec', torchrec.__version__, 'fbgemm_gpu', fbgemm_gpu.__version__)" 2>&1); then
  echo "$why"
  suite "TorchRec exactness (tests/test_torchrec_distributed.py, gloo)" 150 tests/test_torchrec_distributed.py
else
  printf '%s\tnot run: the TorchRec stack does not import here (%s)\n' "TorchRec exactness" \
    "$(echo "$why" | tail -n 1 | cut -c1-160)" >>"$TESTS"
fi

echo "== benchmark"
t=$(budget 240)
if [ "$t" -ge 60 ]; then
  timeout "$t" $PY benchmarks/bench_gpu.py --json "$RES/gpu.json" || echo "bench_gpu.py failed or timed out (exit $?)"
else
  echo "no time left for the benchmark"
fi

echo "== report"
cat "$TESTS"
if [ -s "$RES/gpu.json" ]; then
  $PY benchmarks/bench_gpu.py --render "$RES/gpu.json" --tests "$TESTS" --md docs/gpu.md >/dev/null && cp docs/gpu.md "$RES/gpu.md"
  echo "docs/gpu.md written (copy in $RES/gpu.md)"
else
  echo "no measurements: docs/gpu.md not written"
fi
echo "device check took $(( $(date +%s) - START ))s"
# Failure: a suite that ran and did not pass, a CUDA test skipped on this GPU machine, or no
# measurements (a suite that could not run is reported, not failed).
if grep -v $'\tnot run:' "$TESTS" | grep -qvE '\(exit 0\)$' || grep -E '^(CUDA|engine exactness on CUDA)' "$TESTS" | grep -q skipped \
  || [ ! -s "$RES/gpu.json" ]; then
  exit 1
fi
exit 0
