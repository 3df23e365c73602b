"""The examples check their arguments and data paths before any rank starts (errors that say what
to do), and --help shows every default."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DLRM = ROOT / "examples" / "dlrm" / "train.py"
GRAPH = ROOT / "examples" / "graph" / "train.py"
# The examples' imports (torch, TorchRec) take a few seconds on a loaded 2-core machine; planning and
# sharding the default model, which a late check came after, took about 25 s more.
BOUND_S = 40.0


def run(script: Path, *args: str) -> "tuple[subprocess.CompletedProcess, float]":
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(script), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    return proc, time.perf_counter() - t0


@pytest.mark.parametrize(
    "script,args,says",
    [
        (DLRM, ["--data", "criteo-npy", "--data-path", "{missing}"],
         ["no such file or directory", "_dense.npy", "python -m torchrec.datasets.scripts.npy_preproc_criteo",
          "--output_dir {missing}", "leave out --data"]),
        (DLRM, ["--data", "criteo-tsv", "--data-path", "{missing}"],
         ["no such file or directory", "train.txt", "day_*", "leave out --data"]),
        (DLRM, ["--data", "criteo-tsv"], ["needs --data-path", "train.txt"]),
        (GRAPH, ["--dataset", "tsv", "--data-path", "{missing}"], ["not a directory", "train, valid and test"]),
    ],
)  # fmt: skip
def test_a_missing_data_path_stops_before_any_rank_starts(tmp_path, script, args, says) -> None:
    missing = str(tmp_path / "criteo")
    proc, took = run(script, *(a.format(missing=missing) for a in args))
    assert proc.returncode == 2, proc.stdout + proc.stderr  # argparse's error exit
    err = proc.stderr
    for s in says:
        assert s.format(missing=missing) in err, (s, err)
    assert "Traceback" not in err and "[dlrm]" not in proc.stdout and "[graph]" not in proc.stdout
    assert took < BOUND_S, took


@pytest.mark.parametrize("script,sharder", [(DLRM, "frugal"), (GRAPH, "frugal")])  # one default: the plugin's
def test_help_shows_every_default(script, sharder) -> None:
    proc, _ = run(script, "--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())  # argparse wraps lines
    assert re.search(r"--sharder \{torchrec,frugal\} .*?\(default: " + sharder + r"\)", text)
    entries = re.split(r"\n  (?=-)", proc.stdout.split("options:", 1)[1])[1:]  # one per option
    options = [" ".join(e.split()) for e in entries if not e.startswith("-h")]
    assert len(options) > 20
    assert [o.split()[0] for o in options if "(default:" not in o] == []


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity on this platform")
def test_bind_cores_gives_each_local_rank_its_block() -> None:
    """bind_cores: local rank r of n takes the r-th of n equal blocks of the allowed cores; with
    more ranks than cores nothing is bound (run in child processes: the binding is process-wide)."""
    allowed = sorted(os.sched_getaffinity(0))
    code = "from examples.common import bind_cores; import os; print(bind_cores(), sorted(os.sched_getaffinity(0)))"
    for local_rank, local_world in [(0, 1), (0, 2), (1, 2), (0, len(allowed) + 1)]:
        env = dict(os.environ, LOCAL_RANK=str(local_rank), LOCAL_WORLD_SIZE=str(local_world), PYTHONWARNINGS="ignore")
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        share = len(allowed) // local_world
        want = allowed[local_rank * share : (local_rank + 1) * share] if share else None
        assert out.stdout.strip() == f"{want} {want or allowed}"


def test_the_plan_line_reports_what_was_planned() -> None:
    """The run's plan line names each kind of sharding with its tables, and for frugal tables the
    planned cache ratio and L (with --hardware the planner's, not the options')."""
    from types import SimpleNamespace

    sys.path.insert(0, str(ROOT))
    from examples.common import PlannedSharding

    def plan(*kinds: str) -> SimpleNamespace:
        return SimpleNamespace(plan={"m": {f"t{i}": SimpleNamespace(sharding_type=k) for i, k in enumerate(kinds)}})

    mixed = PlannedSharding(None, plan("table_wise", "frugal", "frugal"), 2, 0.01)  # type: ignore[arg-type]
    assert mixed.describe() == "frugal x2, table_wise x1 (cache 0.01, L=2)"
    assert mixed.shardings == {"t0": "table_wise", "t1": "frugal", "t2": "frugal"}
    stock = PlannedSharding(None, plan("row_wise"), None, None)  # type: ignore[arg-type]
    assert stock.describe() == "row_wise"
    assert PlannedSharding(None, plan("frugal"), 10, 0.0).describe() == "frugal (cache 0, L=10)"  # type: ignore[arg-type]


def test_the_graph_example_fills_its_machine_defaults_in_a_copy() -> None:
    """The cache ratio (none on a CPU device), the lookahead (none without a cache on a CPU device)
    and the loader's workers (none for a rank with one core) are resolved for the device and
    cores in a copy: the parsed options stay as given."""
    import torch

    sys.path.insert(0, str(ROOT))
    from torchrec_frugal.config import CACHE_RATIO, LOOKAHEAD
    from examples.graph.train import machine_defaults, parse_args

    args = parse_args(["--sharder", "frugal"])
    cpu = machine_defaults(args, torch.device("cpu"), 1)
    assert (cpu.cache_ratio, cpu.lookahead, cpu.loader_workers) == (0.0, 0, 0)
    gpu = machine_defaults(args, torch.device("cuda", 0), 4)
    assert (gpu.cache_ratio, gpu.lookahead, gpu.loader_workers) == (CACHE_RATIO, LOOKAHEAD, 1)
    assert (args.cache_ratio, args.lookahead, args.loader_workers) == (None, None, None)
    given = machine_defaults(parse_args(["--cache-ratio", "0.2", "--loader-workers", "3"]), torch.device("cpu"), 1)
    assert (given.cache_ratio, given.lookahead, given.loader_workers) == (0.2, LOOKAHEAD, 3)
    asked = machine_defaults(parse_args(["--lookahead", "4"]), torch.device("cpu"), 1)
    assert (asked.cache_ratio, asked.lookahead) == (0.0, 4)
