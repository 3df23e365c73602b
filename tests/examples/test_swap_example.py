"""examples/swap_dlrm.py (TorchRec's golden training script with the sharder and pipeline swapped)
runs as a user runs it: torchrun, 2 ranks (gloo on CPU; on a one-GPU machine the 2 ranks share the
GPU over gloo). ``DistributedModelParallel`` plans it with TorchRec's own planner: every table must
come out frugal, and the loss on random labels must settle near ln 2."""
from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `examples`


def test_swap_example_plans_frugal_and_trains_with_two_ranks(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(REPO / "examples" / "swap_dlrm.py"), "--batches", "40", "--num-embeddings", "20000"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    # stock TorchRec's known warnings are hidden, and no warning comes from our own calls (another
    # TorchRec release may print warnings of its own: the examples hide the ones listed)
    from examples.stock_warnings import LOGGED, WARNED  # noqa: E402

    for _, pattern in WARNED:
        assert not re.search(pattern, r.stderr), (pattern, r.stderr[-3000:])
    for _, start in LOGGED:
        assert start not in r.stderr, (start, r.stderr[-3000:])
    ours = [line for line in r.stderr.splitlines() if "Warning" in line and re.search(r"torchrec_frugal/|examples/", line)]
    assert not ours, ours
    device, backend = ("cuda:0", "gloo") if torch.cuda.device_count() == 1 else ("cpu", "gloo")
    for rank in range(2):
        where = f"cuda:{rank}, nccl" if torch.cuda.device_count() >= 2 else f"{device}, {backend}"
        m = re.search(rf"rank {rank} of 2 \({where}\): tables (\S+); mean loss of the last 20 batches ([0-9.]+)", r.stdout)
        assert m is not None, r.stdout[-3000:]
        assert m.group(1) == "frugal", m.group(0)
        assert abs(float(m.group(2)) - math.log(2)) < 0.05, m.group(0)


def test_swap_example_runs_as_one_process_without_torchrun(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")}
    r = subprocess.run(
        [sys.executable, str(REPO / "examples" / "swap_dlrm.py"), "--batches", "20", "--num-embeddings", "5000"],
        cwd=tmp_path, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert re.search(r"rank 0 of 1 \((cpu|cuda:0), gloo\): tables frugal;", r.stdout), r.stdout[-2000:]


def test_swap_example_refuses_bad_arguments_before_starting() -> None:
    for argv, message in ((["--batches", "0"], "--batches must be at least 1, got 0"),
                          (["--lookahead", "-1"], "lookahead must be >= 0, got -1")):  # fmt: skip
        r = subprocess.run([sys.executable, str(REPO / "examples" / "swap_dlrm.py"), *argv],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
        assert r.returncode == 2 and message in r.stderr, r.stderr[-2000:]
        assert len(r.stderr.strip().splitlines()) == 2, r.stderr  # one line and where the options are: no usage screen
