#!/usr/bin/env bash
# Install torchrec_frugal into a fresh virtual environment as docs/install.md tells a user to, and
# use it from outside the checkout (`make test-install`, run by .ci/run):
#
#   1. a fresh venv in a temporary directory; the blocks of docs/install.md marked
#      "check_install.sh runs this block" run as written: the CPU stack, then the wheel build;
#   2. pip's dry-run report of the wheel install: into that stack it installs torchrec_frugal alone,
#      and even into an empty environment (--ignore-installed) nothing but numpy, tqdm and numba (with llvmlite) besides:
#      no torch, FBGEMM, TorchRec or NVIDIA package, whatever torch an environment has;
#   3. the wheel install block; then, from a directory outside the checkout (the checkout on no
#      path, torchrec_frugal imported from the venv's site-packages): the check block, the swap
#      example on 2 ranks under torch.distributed.run, and TorchRec tests copied out of tests/.
#
# The temporary directory is removed at the end, failed or not (KEEP_INSTALL_CHECK=1 keeps it).
# PYTHON (default python3.11) makes the venv; SWAP_EXAMPLE (default examples/swap_dlrm.py, the
# README's swap) and INSTALL_TESTS (files under tests/) choose what runs.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd -P)
DOC=$REPO/docs/install.md
PYTHON=${PYTHON:-python3.11}
SWAP_EXAMPLE=${SWAP_EXAMPLE:-examples/swap_dlrm.py}
INSTALL_TESTS=${INSTALL_TESTS:-"tests/torchrec/test_torchrec_planner.py tests/torchrec/test_torchrec_patches.py"}
start=$SECONDS

WORK=$(mktemp -d "${TMPDIR:-/tmp}/frugal-install-check.XXXXXX")
WORK=$(cd "$WORK" && pwd -P)
cleanup() {
  if [ "${KEEP_INSTALL_CHECK:-0}" = 1 ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
case "$WORK/" in "$REPO"/*) echo "the temporary directory $WORK is inside the checkout" >&2; exit 1 ;; esac
VENV=$WORK/venv
RUN=$WORK/run
mkdir -p "$RUN"

step() { echo "== check_install [$((SECONDS - start)) s]: $*"; }

block() {  # the fenced block that follows the marker "...: NAME -->" in docs/install.md
  local text
  text=$(awk -v name="$1" '
    index($0, ": " name " -->") && /^<!-- check_install.sh runs this block/ { found = 1; next }
    found == 1 && /^```/ { found = 2; next }
    found == 2 && /^```/ { exit }
    found == 2 { print }
  ' "$DOC")
  if [ -z "$text" ]; then echo "$DOC has no block marked '$1'" >&2; return 1; fi
  printf '%s\n' "$text"
}

run_block() {  # NAME DIR: the block as written, in the venv, from DIR
  local text
  text=$(block "$1")
  step "docs/install.md, block '$1', in $2:"
  printf '%s\n' "$text" | sed 's/^/    $ /'
  (cd "$2" && bash -euo pipefail -c "$text")
}

# The venv is the active environment: `pip` and `python` in the blocks are its own. Nothing of the
# caller's set-up (PYTHONPATH, a .venv, the compat folder) reaches it.
step "fresh venv in $VENV ($PYTHON)"
"$PYTHON" -m venv "$VENV"
unset PYTHONPATH PYTHONHOME PYTHONSTARTUP
export VIRTUAL_ENV=$VENV PATH=$VENV/bin:$PATH PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_PROGRESS_BAR=off
if [ "$(command -v pip)" != "$VENV/bin/pip" ] || [ "$(command -v python)" != "$VENV/bin/python" ]; then
  echo "pip and python are not the venv's: $(command -v pip), $(command -v python)" >&2; exit 1
fi

run_block cpu-stack "$WORK"
python -c "import torch, fbgemm_gpu, torchrec; print('stack:', torch.__version__, fbgemm_gpu.__version__, torchrec.__version__)"

# A wheel left in dist/ by an earlier build would also match dist/torchrec_frugal-*.whl, and a
# stale build/lib could put files no longer in the source into the wheel.
rm -rf build dist/torchrec_frugal-*.whl
run_block wheel-build "$REPO"
wheels=(dist/torchrec_frugal-*.whl)
[ "${#wheels[@]}" = 1 ] && [ -f "${wheels[0]}" ] || { echo "expected one wheel in dist/, found: ${wheels[*]}" >&2; exit 1; }

install=$(block wheel-install)
case "$install" in "pip install "*) ;; *) echo "the wheel-install block is not one 'pip install': $install" >&2; exit 1 ;; esac
step "pip's dry-run report of the wheel install, into the stack and into an empty environment"
(cd "$REPO" && bash -euo pipefail -c "${install/#pip install /pip install --dry-run --quiet --report $WORK/into-stack.json }")
(cd "$REPO" && bash -euo pipefail -c "${install/#pip install /pip install --dry-run --quiet --ignore-installed --report $WORK/into-empty.json }")
python - "$WORK/into-stack.json" "$WORK/into-empty.json" <<'EOF'
import json, re, sys

def installs(path):
    return sorted(re.sub(r"[-_.]+", "-", i["metadata"]["name"]).lower() + " " + i["metadata"]["version"]
                  for i in json.load(open(path))["install"])

into_stack, into_empty = installs(sys.argv[1]), installs(sys.argv[2])
print("  into the stack:", ", ".join(into_stack))
print("  into an empty environment:", ", ".join(into_empty))
assert [n.split()[0] for n in into_stack] == ["torchrec-frugal"], into_stack
assert sorted(n.split()[0] for n in into_empty) == ["llvmlite", "numba", "numpy", "torchrec-frugal", "tqdm"], into_empty
EOF

run_block wheel-install "$REPO"

# From here on nothing runs in the checkout: the check, the example and the tests run from $RUN.
step "the installed torchrec_frugal, from $RUN"
cd "$RUN"
python - "$REPO" <<'EOF'
import pathlib, sys, sysconfig
import torchrec_frugal
where = pathlib.Path(torchrec_frugal.__file__).resolve()
site = pathlib.Path(sysconfig.get_paths()["purelib"]).resolve()
assert site in where.parents, f"torchrec_frugal imported from {where}, not from the venv's {site}"
assert not any(p and pathlib.Path(p).resolve().is_relative_to(sys.argv[1]) for p in sys.path), sys.path
print("  torchrec_frugal from", where)
EOF
run_block check "$RUN"

step "the swap example on 2 ranks, copied out of the checkout: $SWAP_EXAMPLE --batches 4"
cp -r "$REPO/examples" "$RUN/examples"
find "$RUN/examples" -name __pycache__ -prune -exec rm -rf {} +
OMP_NUM_THREADS=1 python -m torch.distributed.run --standalone --nproc_per_node=2 "$SWAP_EXAMPLE" --batches 4

step "tests copied out of the checkout: $INSTALL_TESTS"
cp -r "$REPO/tests" "$RUN/tests"
find "$RUN/tests" -name __pycache__ -prune -exec rm -rf {} +
# The copied conftest.py puts tests/harness/ (the copy) on the path and nothing else; this test fails if
# anything under the checkout were importable, or torchrec_frugal came from elsewhere than the venv.
cat > "$RUN/tests/test_installed_wheel.py" <<EOF
import pathlib, sys, sysconfig

import torchrec_frugal


def test_the_installed_wheel_is_what_runs():
    site = pathlib.Path(sysconfig.get_paths()["purelib"]).resolve()
    assert site in pathlib.Path(torchrec_frugal.__file__).resolve().parents, torchrec_frugal.__file__
    assert not any(p and pathlib.Path(p).resolve().is_relative_to("$REPO") for p in sys.path), sys.path
EOF
pip install --quiet pytest pytest-timeout
# shellcheck disable=SC2086  # INSTALL_TESTS is a word list
python -m pytest -x -q -p no:cacheprovider tests/test_installed_wheel.py $INSTALL_TESTS

step "passed"
