"""What planning one batch costs the planner thread: ``FrugalEmbeddingLookup.plan``, timed alone.

FrugalTrainPipeline's planner thread makes each batch's plan (ids checked and deduplicated, the
engine's step plan, the bags laid out sample by sample, their transposition for the backward)
while earlier steps train. On an accelerator a step takes milliseconds, and one planner thread
per rank must keep up with it: this times the plan of one batch on one thread, median of
``--repeats``, for batches shaped as the paper's datasets (one id a bag, as criteo and avazu) and
as multi-hot features (bags of 0 to ``2 x --hot`` ids), the lookup's tables served by one engine
(one table group, as the DLRM example's).

    python benchmarks/time_plan.py --config criteo-kaggle --scale 0.1 --batch-sizes 1024 4096
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a script: `benchmarks`, `examples`, and `torchrec_frugal` where no installed one wins
    sys.path.append(str(ROOT))

import torch  # noqa: E402
from torchrec.modules.embedding_configs import PoolingType  # noqa: E402
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor  # noqa: E402

from torchrec_frugal.config import FrugalConfig, OptimizerSpec  # noqa: E402
from torchrec_frugal.datasets import get_config  # noqa: E402
from torchrec_frugal.torchrec.embedding_lookup import FrugalEmbeddingLookup  # noqa: E402
from torchrec_frugal.torchrec.types import FrugalTable  # noqa: E402

SHAPES = ("one-hot", "multi-hot")


def batch(rows: List[int], batch_size: int, shape: str, hot: int, seed: int) -> KeyedJaggedTensor:
    """A batch of ``batch_size`` samples over tables of ``rows``, feature-major as a KJT lists it."""
    g = torch.Generator().manual_seed(seed)
    f = len(rows)
    if shape == "one-hot":
        lengths = torch.ones(f * batch_size, dtype=torch.int64)
    else:
        lengths = torch.randint(0, 2 * hot + 1, (f * batch_size,), generator=g)
    per_feature = lengths.view(f, batch_size).sum(1).tolist()
    ids = torch.cat([(torch.rand(n, generator=g) ** 3 * r).to(torch.int64) for n, r in zip(per_feature, rows)])
    return KeyedJaggedTensor(keys=[f"f{t}" for t in range(f)], values=ids, lengths=lengths, stride=batch_size)


def median_ms(lookup: FrugalEmbeddingLookup, batches: List[KeyedJaggedTensor], repeats: int) -> float:
    lookup.plan(batches[0])
    times = []
    for i in range(repeats):
        t0 = time.perf_counter()
        lookup.plan(batches[i % len(batches)])
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="criteo-kaggle")
    p.add_argument("--scale", type=float, default=0.1)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES))
    p.add_argument("--hot", type=int, default=3, help="multi-hot: mean ids a bag")
    p.add_argument("--repeats", type=int, default=30)
    args = p.parse_args()
    torch.set_num_threads(1)
    cfg = get_config(args.config, scale=args.scale)
    rows = cfg.rows()
    tables = [
        FrugalTable(
            name=f"t{t}", num_embeddings=n, embedding_dim=cfg.model.embedding_dim, feature_names=[f"f{t}"],
            pooling=PoolingType.SUM, init_fn=lambda w: torch.nn.init.uniform_(w, -0.01, 0.01),
            optimizer=OptimizerSpec("rowwise_adagrad", lr=0.01), cache_ratio=0.05, presample_counts=None,
        )
        for t, n in enumerate(rows)
    ]
    results: Dict[str, Dict[int, float]] = {s: {} for s in args.shapes}
    with tempfile.TemporaryDirectory() as shm_dir:
        lookup = FrugalEmbeddingLookup(tables, True, FrugalConfig(shm_dir=shm_dir), None, torch.device("cpu"))
        try:
            for shape in args.shapes:
                for b in args.batch_sizes:
                    batches = [batch(rows, b, shape, args.hot, seed) for seed in range(4)]
                    results[shape][b] = median_ms(lookup, batches, args.repeats)
        finally:
            lookup.close()
    print(f"{args.config} at scale {args.scale}: {len(rows)} tables, one engine; ms to plan a batch, median of {args.repeats}")
    print(f"{'batch':>8} " + " ".join(f"{s:>12}" for s in args.shapes))
    for b in args.batch_sizes:
        print(f"{b:>8} " + " ".join(f"{results[s][b]:12.3f}" for s in args.shapes))


if __name__ == "__main__":
    main()
