"""The README's swap example runs as a user runs it: torchrun, 2 ranks (gloo on CPU; on a one-GPU
machine the 2 ranks share the GPU over gloo), a few batches."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def test_swap_example_trains_with_two_ranks(tmp_path: Path) -> None:
    script = tmp_path / "readme_swap.py"
    subprocess.run(
        [sys.executable, str(REPO / "scripts" / "device_report.py"), "readme-example", str(script), "--batches", "4"],
        check=True,
    )
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    device, backend = ("cuda:0", "gloo") if torch.cuda.device_count() == 1 else ("cpu", "gloo")
    for rank in range(2):
        if torch.cuda.device_count() < 2:
            assert f"rank {rank} of 2 ({device}, {backend}): last loss" in r.stdout, r.stdout[-3000:]
        else:
            assert f"rank {rank} of 2 (cuda:{rank}, nccl): last loss" in r.stdout, r.stdout[-3000:]
