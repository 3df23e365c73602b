#!/usr/bin/env bash
# Device check of the CUDA path, one prepared run on a GPU machine (under 8 minutes):
#   1. installs the carried TorchRec stack (.whl/, see scripts/fetch_device_wheels.sh) into a
#      private folder on PYTHONPATH, never over the image's packages;
#   2. unit: the CUDA unit tests (mapped tables, a registration CUDA refuses, the flush stream);
#   3. torchrec: TorchRec with frugal tables on CUDA against TorchRec on CPU (2 and 4 ranks sharing
#      GPU 0, SGD and row-wise Adagrad, with and without FrugalTrainPipeline, a checkpoint);
#   4. examples: examples/swap_dlrm.py (the swap of TorchRec's golden script), examples/dlrm/train.py --sharder frugal and
#      examples/graph/train.py with 1 rank, and 2 and 4 ranks sharing the GPU (gloo);
#   5. engine: the engine's exactness with 2 and 4 ranks sharing GPU 0;
#   6. hostcpu: benchmarks/host_cpu.py --device cuda, the host CPU per step of each of an engine's
#      threads on CUDA (2 ranks sharing GPU 0, the paper's criteo shape), by call;
#   7. bench: benchmarks/bench_gpu.py, then docs/gpu.md from its measurements and the table of suites.
#
# Run from the repository root of a copy of the working tree on the GPU machine:
#     bash scripts/device_check.sh
# CHECK_PARTS="unit torchrec examples engine hostcpu bench" (the default, in this order) picks parts for
# a rerun of what failed or ran out of time. BENCH_ARGS adds arguments to bench_gpu.py: the DLRM
# example's measurements take a call of their own, e.g.
#     CHECK_PARTS=bench BENCH_ARGS="--suites dlrm --dlrm-runs 1x4096x10,2x4096x10,2x4096x0" bash scripts/device_check.sh
# and `bench_gpu.py --render first/gpu.json,second/gpu.json --tests first/tests.tsv,second/tests.tsv
# --md docs/gpu.md` writes both calls into one report.
# Results: docs/gpu.md in the tree; tests.tsv, status.tsv, gpu.json, gpu.md, the logs and the
# examples' summaries in $OUT (or /tmp/frugal-device-check) to bring back.
# Exit: 0 when every suite passed; 1 when any failed, timed out, skipped a CUDA test or did not
# run; 2 when there is no GPU or no CUDA build of torch (nothing ran, docs/gpu.md untouched).
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
DEADLINE=$((START + ${CHECK_BUDGET_S:-470}))
RES=${OUT:-/tmp/frugal-device-check}
mkdir -p "$RES/logs" "$RES/examples"
: >"$RES/tests.tsv"
: >"$RES/status.tsv"
PY=${PYTHON:-python3}
REPORT="$PY scripts/device_report.py"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
exec > >(tee -a "$RES/check.log") 2>&1

BENCH_RESERVE=${BENCH_RESERVE_S:-120}  # seconds kept for benchmarks/bench_gpu.py, whose JSON docs/gpu.md is written from
PARTS=${CHECK_PARTS:-unit torchrec examples engine hostcpu bench}
want() { [[ " $PARTS " == *" $1 "* ]]; }

left() { echo $((DEADLINE - $(date +%s))); }
budget() { # the smaller of $1 seconds and what is left before the deadline, less the benchmark's reserve
  local l; l=$(( $(left) - BENCH_RESERVE ))
  if [ "$l" -lt "$1" ]; then echo "$l"; else echo "$1"; fi
}

echo "== machine"
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; then
  echo "device check not run: no NVIDIA GPU here (nvidia-smi missing or failing); docs/gpu.md left as it is" >&2
  exit 2
fi
if ! $PY - <<'PY'; then
import sys, torch
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)
if not torch.cuda.is_available():
    sys.exit("torch sees no CUDA device")
print("device", torch.cuda.get_device_name(0), "count", torch.cuda.device_count())
PY
  echo "device check not run: $PY has no CUDA build of torch that sees the GPU; docs/gpu.md left as it is" >&2
  exit 2
fi

echo "== prepare"
SITE=/tmp/frugal-site
export PYTHONPATH="$PWD"
if compgen -G ".whl/*.whl" >/dev/null; then
  rm -rf "$SITE"
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .whl/*.whl >"$RES/logs/install.log" 2>&1
  rc=$?
  $REPORT suite "$RES" "carried wheels installed into a private folder" "$rc" "$RES/logs/install.log" --expect '^'
  export PYTHONPATH="$PWD:$SITE"
else
  echo "no carried wheels (.whl/): using the image's packages"
fi
stack=$($PY -c "
import sys, torch
try:
    import fbgemm_gpu, torchrec
    rec = f'torchrec {torchrec.__version__}, fbgemm_gpu {fbgemm_gpu.__version__} ({getattr(fbgemm_gpu, \"__variant__\", \"?\")} build)'
except Exception as e:
    rec = f'no TorchRec stack ({type(e).__name__}: {e})'
print(f'Python {sys.version.split()[0]}, torch {torch.__version__}, {rec}')
" 2>&1 | tail -n 1)
echo "$stack"
$REPORT info "$RES" "stack" "$stack"

# One pytest run: suite name, time limit, pytest arguments. A skipped test fails the suite.
suite() {
  local name=$1 limit=$2; shift 2
  local t; t=$(budget "$limit")
  local log="$RES/logs/$(echo "$name" | tr -c 'A-Za-z0-9' '_' | cut -c1-60).log"
  if [ "$t" -lt 20 ]; then
    echo "not run: out of time" >"$log"; $REPORT suite "$RES" "$name" 125 "$log"; return
  fi
  echo "== $name (at most ${t}s)"
  timeout "$t" $PY -m pytest -q -p no:cacheprovider -o timeout=0 "$@" 2>&1 | tee "$log"
  $REPORT suite "$RES" "$name" "${PIPESTATUS[0]}" "$log"
}

unit() {
  suite "registration checks: CUDA mocked, and the CUDA runtime torch loaded (tests/engine/test_device_paths.py)" 40 \
    tests/engine/test_device_paths.py -k "registration or loaded_runtime"
  suite "CUDA unit tests: mapped tables, a failed registration, staged copies, flush stream" 60 \
    tests/engine/test_cuda_engine.py -k "not ranks_sharing"
}
torchrec() {
  suite "TorchRec with frugal tables on CUDA vs TorchRec on CPU, 2 and 4 ranks, checkpoint (tests/torchrec/test_cuda_torchrec.py)" 240 \
    tests/torchrec/test_cuda_torchrec.py
}
engine() {
  suite "engine exactness on CUDA, 2 ranks sharing GPU 0" 100 "tests/engine/test_cuda_engine.py::test_engine_exact_with_ranks_sharing_one_gpu[2]"
  suite "engine exactness on CUDA, 4 ranks sharing GPU 0" 100 "tests/engine/test_cuda_engine.py::test_engine_exact_with_ranks_sharing_one_gpu[4]"
}

hostcpu() {
  local name="benchmarks/host_cpu.py --device cuda: host CPU per step of each thread, by call, 2 ranks sharing GPU 0"
  local log="$RES/logs/host_cpu.log" t; t=$(budget 150)
  if [ "$t" -lt 40 ]; then
    echo "not run: out of time" >"$log"; $REPORT suite "$RES" "$name" 125 "$log"; return
  fi
  echo "== host CPU per step on CUDA (at most ${t}s)"
  timeout "$t" $PY benchmarks/host_cpu.py --device cuda --repeats 1 --steps 100 --calls --json "$RES/host_cpu_cuda.json" 2>&1 | tee "$log"
  $REPORT suite "$RES" "$name" "${PIPESTATUS[0]}" "$log" --expect 'threads: .*host CPU'
}

# The examples as a user runs them; the three scripts of one rank count run side by side.
run_examples() {
  local n=$1 t; t=$(budget 90)
  local names=("examples/swap_dlrm.py on CUDA, $n rank(s)" "examples/dlrm/train.py --sharder frugal on CUDA, $n rank(s)"
    "examples/graph/train.py --sharder frugal on CUDA, $n rank(s)")
  local logs=("$RES/logs/swap_$n.log" "$RES/logs/dlrm_$n.log" "$RES/logs/graph_$n.log")
  if [ "$t" -lt 30 ]; then
    for i in 0 1 2; do echo "not run: out of time" >"${logs[$i]}"; $REPORT suite "$RES" "${names[$i]}" 125 "${logs[$i]}"; done
    return
  fi
  echo "== examples with $n rank(s) (at most ${t}s)"
  local run="timeout $t $PY -m torch.distributed.run --standalone --nproc_per_node=$n"
  $run examples/swap_dlrm.py --batches 20 >"${logs[0]}" 2>&1 &
  local p1=$!
  $run examples/dlrm/train.py --sharder frugal --config criteo-kaggle --scale 0.01 --batch-size 1024 --steps 60 \
    --warmup 10 --presample-steps 20 --log-every 20 --threads 2 --no-progress --summary "$RES/examples/dlrm_$n.json" \
    >"${logs[1]}" 2>&1 &
  local p2=$!
  $run examples/graph/train.py --sharder frugal --dataset synthetic --synthetic-entities 20000 --synthetic-relations 50 \
    --synthetic-triples 100000 --model transe_l2 --dim 64 --batch-size 512 --steps 60 --warmup 10 --presample-steps 20 \
    --eval-triples 200 --log-every 20 --threads 2 --no-progress --summary "$RES/examples/graph_$n.json" \
    >"${logs[2]}" 2>&1 &
  local p3=$!
  wait $p1; local r1=$?
  wait $p2; local r2=$?
  wait $p3; local r3=$?
  tail -n 3 "${logs[@]}"
  $REPORT suite "$RES" "${names[0]}" "$r1" "${logs[0]}" --expect "rank 0 of $n \(cuda:0, (gloo|nccl)\): tables frugal;"
  $REPORT suite "$RES" "${names[1]}" "$r2" "${logs[1]}" --summary "$RES/examples/dlrm_$n.json" --expect "ranks \((gloo|nccl), cuda"
  $REPORT suite "$RES" "${names[2]}" "$r3" "${logs[2]}" --summary "$RES/examples/graph_$n.json" --expect "ranks \((gloo|nccl), cuda"
}
examples() {
  for n in 1 2 4; do run_examples "$n"; done
}

# CHECK_PARTS picks parts for a rerun; a part left out is listed in the table, not run.
for part in unit torchrec examples engine hostcpu; do
  if want "$part"; then "$part"; else $REPORT info "$RES" "$part" "not selected (CHECK_PARTS=$PARTS)"; fi
done

echo "== benchmark"
t=$(left)
if ! want bench; then
  $REPORT info "$RES" "bench" "not selected (CHECK_PARTS=$PARTS)"
elif [ "$t" -ge 60 ]; then
  quick=""; [ "$t" -lt 240 ] && quick="--quick"  # the full benchmark builds a 4 GiB table
  echo "benchmarks/bench_gpu.py $quick (at most ${t}s)"
  # shellcheck disable=SC2086
  timeout "$t" $PY benchmarks/bench_gpu.py --json "$RES/gpu.json" $quick ${BENCH_ARGS:-} 2>&1 | tee "$RES/logs/bench_gpu.log"
  $REPORT suite "$RES" "benchmarks/bench_gpu.py $quick" "${PIPESTATUS[0]}" "$RES/logs/bench_gpu.log" --expect '"gate_stall_fraction"'
else
  echo "not run: out of time" >"$RES/logs/bench_gpu.log"; $REPORT suite "$RES" "benchmarks/bench_gpu.py" 125 "$RES/logs/bench_gpu.log"
fi

echo "== report"
cat "$RES/tests.tsv"
if [ -s "$RES/gpu.json" ]; then
  $PY benchmarks/bench_gpu.py --render "$RES/gpu.json" --tests "$RES/tests.tsv" --md docs/gpu.md >/dev/null \
    && cp docs/gpu.md "$RES/gpu.md" && echo "docs/gpu.md written (copy in $RES/gpu.md)"
else
  echo "no measurements: docs/gpu.md not written (the table of suites is $RES/tests.tsv)"
fi
echo "device check took $(( $(date +%s) - START ))s"
$REPORT verdict "$RES"
