"""Peak host memory and time of saving and loading the frugal tables of a DLRM with
torch.distributed.checkpoint, on N CPU ranks of one machine.

The tables are criteo-kaggle's 26 (33.8M rows at scale 1.0) x dim 32 with row-wise Adagrad
state, all "frugal"; each rank saves and loads its row block. Peak memory is the machine's
anonymous plus shared memory (page cache excluded), sampled every 5 ms by rank 0, above its
level just before the phase: it counts every rank.

    python benchmarks/bench_checkpoint.py --scale 1.0 --ranks 2 --json benchmarks/results/checkpoint_scale1.json
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if __package__ in (None, ""):  # run as a script: `benchmarks`, `examples`, and `torchrec_frugal` where no installed one wins
    sys.path.append(REPO)


def _used_bytes() -> int:
    """Memory the processes hold (anonymous and shared), page cache left out: what `free` calls
    used plus shared memory. The checkpoint's own files (clean or dirty page cache) do not count."""
    info: Dict[str, int] = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, value = line.split(":", 1)
            info[key] = int(value.split()[0]) * 1024
    cache = info["Cached"] - info["Shmem"] + info["Buffers"] + info["SReclaimable"]
    return info["MemTotal"] - info["MemFree"] - cache


class PeakSampler:
    """The highest machine memory use seen since :meth:`start`, sampled by a thread."""

    def __init__(self, period_s: float = 0.005) -> None:
        self.period_s = period_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _used_bytes())
            time.sleep(self.period_s)

    def start(self) -> int:
        base = _used_bytes()
        self.peak = base
        return base

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _rank(rank: int, world: int, args: argparse.Namespace, directory: str) -> Optional[Dict[str, Any]]:
    """Save and load ``--repeats`` times; rank 0 returns the timings and peaks (medians)."""
    import torch.distributed.checkpoint as dcp
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torch import nn
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan
    from torchrec.distributed.types import ShardingEnv, ShardingPlan

    from examples.dlrm.configs import DATASETS
    from torchrec_frugal import FrugalConfig
    from torchrec_frugal.torchrec import FrugalEmbeddingBagCollectionSharder, frugal

    rows = DATASETS[args.config].rows(args.scale)
    ebc = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(name=f"t{i}", embedding_dim=args.dim, num_embeddings=n, feature_names=[f"f{i}"])
            for i, n in enumerate(rows)
        ],
        device=torch.device("meta"),
    )
    model = nn.Module()
    model.ebc = ebc
    sharder = FrugalEmbeddingBagCollectionSharder(
        fused_params={"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.01},
        config=FrugalConfig(lookahead=0, cache_ratio=0.01),
    )
    plan = ShardingPlan(
        {"ebc": construct_module_sharding_plan(ebc, {f"t{i}": frugal() for i in range(len(rows))}, sharder=sharder,
                                               local_size=world, world_size=world, device_type="cpu")}
    )
    dmp = DistributedModelParallel(model, env=ShardingEnv.from_process_group(dist.GroupMember.WORLD),
                                   device=torch.device("cpu"), plan=plan, sharders=[sharder])
    sampler = PeakSampler() if rank == 0 else None
    result: Dict[str, Any] = {"rows": sum(rows), "tables": len(rows), "dim": args.dim, "ranks": world}

    def phase(name: str, fn: Any) -> None:
        dist.barrier()
        base = sampler.start() if sampler else 0
        t0 = time.perf_counter()
        fn()
        dist.barrier()
        if sampler:
            result.setdefault(f"{name}_s_runs", []).append(time.perf_counter() - t0)
            result.setdefault(f"{name}_peak_bytes_runs", []).append(sampler.peak - base)

    def save() -> None:
        dcp.save({"model": dmp.state_dict(), "optim": dmp.fused_optimizer.state_dict()}, checkpoint_id=directory)

    def load() -> None:
        state = {"model": dmp.state_dict(), "optim": dmp.fused_optimizer.state_dict()}
        dcp.load(state, checkpoint_id=directory)
        dmp.load_state_dict(state["model"])
        dmp.fused_optimizer.load_state_dict(state["optim"])

    for _ in range(args.repeats):
        phase("save", save)
        phase("load", load)
    if not sampler:
        return None
    sampler.stop()
    for key in [k for k in result if k.endswith("_runs")]:
        result[key[: -len("_runs")]] = statistics.median(result[key])
    result["table_bytes"] = sum(rows) * (args.dim + 1) * 4
    return result


def main(argv: List[str] | None = None) -> Dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="criteo-kaggle")
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3, help="saves and loads, each reported as the median")
    p.add_argument("--dir", default=None, help="where the checkpoint goes (default: a temporary directory, removed)")
    p.add_argument("--json", default=None, help="write the result here")
    args = p.parse_args(argv)
    from torchrec_frugal.host.launch import run_ranks

    directory = args.dir or tempfile.mkdtemp(prefix="frugal_ckpt_bench_")
    try:
        result = run_ranks(args.ranks, _rank, args, directory, timeout=3600, pg_timeout_s=1800)[0]
    finally:
        if args.dir is None:
            shutil.rmtree(directory, ignore_errors=True)
    gib = 2**30
    print(
        f"{args.config} scale {args.scale}: {result['rows']:,} rows x {args.dim} on {args.ranks} ranks "
        f"({result['table_bytes'] / gib:.2f} GiB with state), median of {args.repeats} | save {result['save_s']:.1f} s, peak +{result['save_peak_bytes'] / gib:.2f} GiB "
        f"| load {result['load_s']:.1f} s, peak +{result['load_peak_bytes'] / gib:.2f} GiB"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(result, config=args.config, scale=args.scale), f, indent=1)
    return result


if __name__ == "__main__":
    main()
