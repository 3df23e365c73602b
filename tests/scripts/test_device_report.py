"""benchmarks/bench_gpu.py without a GPU: it refuses to measure, and its report renders every section."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
FACTS = {"gpu": "GPU-X", "driver": "1.0", "cuda_runtime": "13.0", "torch": "2.x", "python": "3.12", "date": "D"}


def _bench():
    from benchmarks import bench_gpu

    return bench_gpu


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_bench_refuses_without_cuda() -> None:
    r = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_gpu.py")], capture_output=True, text=True)
    assert r.returncode != 0 and "needs CUDA" in r.stderr


def test_report_renders_every_section(tmp_path: Path) -> None:
    """Shape check of the markdown with placeholder values (never written to docs/)."""
    results = {
        "facts": FACTS,
        "paths": {
            "table_bytes": 1 << 30,
            "gather": [{"dim": 32, "rows": 10, "path": p, "ms": 1.0, "gb_s": 2.0} for p in ("zero_copy", "pinned", "device", "register")],
            "flush": [{"dim": 32, "rows": 10, "path": p, "ms": 1.0, "rows_s": 1e7, "gb_s": 2.0} for p in ("zero_copy", "pinned")],
        },
        "gate": [
            {"world": w, "batch": 8, "steps": 3, "lookahead": 10, "host_path": "zero_copy", "step_ms_mean": 1.0,
             "gate_wait_ms_mean": 0.1, "gate_wait_ms_p90": 0.2, "gate_stall_fraction": 0.1, "exchange_wait_ms_mean": 0.3,
             "rows_flushed_per_step": 5.0, "cache_hit_ratio": 0.5, "wall_ms_per_step": 2.0, "dense_ms": 0.5,
             **{f"{k}_ms": 0.01 for k in ("announce", "lookup", "exchange", "update", "bookkeeping", "flush")}, **fw}
            for w in (2, 4) for fw in ({}, {"flush_workers": 0})
        ],
        "reads": {
            "table_bytes": 1 << 32, "dim": 32,
            "reads": [{"ids": 16384, "distinct": 9000, "path": p, "order": o, "ms": 1.0, "gb_s_distinct": 1.2}
                      for p in ("zero_copy", "pinned") for o in ("as_is", "distinct_sorted")],
            "calibration": [{"rows": 1024.0, "read_zero_copy_s": 1e-4, "read_pinned_s": 2e-4,
                             "write_zero_copy_s": 1e-4, "write_pinned_s": 2e-4}],
            "path_by_size": {"read": [[1024, "zero_copy"]], "write": [[1024, "zero_copy"]]},
        },
    }
    tests = tmp_path / "tests.tsv"
    tests.write_text("suite a\t3 passed (exit 0)\nTorchRec exactness\tnot run: no torchrec\n")
    md = _bench().render(results, str(tests))
    assert "GPU-X, driver 1.0" in md and "| suite a | 3 passed (exit 0) |" in md
    for heading in ("## Tests", "## Host reads", "## Host reads of a step", "## Flushes", "## Gate stall per step"):
        assert heading in md
    assert "| 16384 | 9000 | pinned | distinct_sorted | 1.000 | 1.2 |" in md
    assert "| 1024 | 0.100 | 0.200 | 0.100 | 0.200 |" in md  # calibration, ms per call
    assert "| 2 | 10 | zero_copy | 1 (default) | 2.00 | 0.01 | 0.01 | 0.01 | 0.01 | 0.01 | 0.01 | 0.10 | 0.30 | 0.50 |" in md
    assert "| 2 | 10 | zero_copy | 0 | 2.00 | 0.01 |" in md  # a mode run with --gate-flush-workers 0
    assert md.count("| zero_copy |") >= 2 and "| 4 | 8 | 10 | zero_copy | 1 (default) |" in md


def test_dlrm_suite_runs_the_example_and_renders(tmp_path: Path) -> None:
    """The dlrm suite's driving and report on CPU (tiny tables); on a GPU the same code runs on CUDA."""
    bench = _bench()
    runs = bench.bench_dlrm("1x64x2", scale=0.002, steps=60)
    (r,) = runs
    assert (r["ranks"], r["batch"], r["lookahead"], r["steps"]) == (1, 64, 2, 60)
    assert r["samples_per_second"] > 0 and r["rate_min"] <= r["rate_max"] and len(r["intervals"]) == 1
    assert set(r["engine_ms_per_step"]) == set(bench.PHASES) and r["engine_ms_per_step"]["lookup"] > 0
    tests = tmp_path / "tests.tsv"
    tests.write_text("")
    md = bench.render({"facts": FACTS, "dlrm": runs}, str(tests))
    assert "## The DLRM example on this GPU" in md and "| 1 | 64 | 2 | " in md
