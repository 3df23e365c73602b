"""What receiving a batch from a DataLoader worker costs the training thread, in the DLRM or graph example.

Side by side, on the same synthetic batches, alternating within each repetition:

* ``packed``: the example's loader (``SyntheticClickData.batches(workers=1)``, or
  ``ChunkedNegativeSampler.batches(workers=1)`` with ``--example graph``): each batch travels as
  one buffer and is unpacked as views of it on the training side.
* ``tensors``: a DataLoader worker returning the batch itself (DLRM's ``Batch``: dense features,
  ids, lengths, offsets, labels; the graph's ``KGBatch``: ids, lengths, offsets, relations, sign:
  five tensors, each a shared-memory segment and a connection of its own).

The consuming thread sleeps ``--step-ms`` between batches (the training step), so the worker is
ahead and ``next()`` measures receiving alone. Prints the median microseconds of ``next()`` per
variant and repetition, and the median over repetitions.

    python benchmarks/time_loader.py --batch-size 1024
    python benchmarks/time_loader.py --example graph --batch-size 1024    # one rank's share of 2
"""
from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a script: `benchmarks`, `examples`, and `torchrec_frugal` where no installed one wins
    sys.path.append(str(ROOT))

import torch  # noqa: E402

from examples.dlrm.configs import get_config  # noqa: E402
from examples.dlrm.data import SyntheticClickData  # noqa: E402
from examples.graph.sampler import ChunkedNegativeSampler  # noqa: E402


class BatchesAsObjects(torch.utils.data.Dataset):
    """Rank 0's batches as the examples' batch objects: what a worker sent before batches were packed."""

    def __init__(self, batch: Callable[[int], Any], num: int) -> None:
        self.batch, self.num = batch, num

    def __len__(self) -> int:
        return self.num

    def __getitem__(self, i: int) -> Any:
        return self.batch(i)


def dlrm_click_data(args: argparse.Namespace) -> SyntheticClickData:
    cfg = get_config(args.config, scale=args.scale)
    return SyntheticClickData(cfg.dataset, cfg.rows(), args.batch_size, seed=0)


def graph_sampler(args: argparse.Namespace) -> ChunkedNegativeSampler:
    """The graph benchmark's shape: chunks of 128 positives with 128 shared negatives, 2 ranks."""
    gen = torch.Generator().manual_seed(0)
    entities, relations, triples = 2_000_000, 1_000, 1_000_000
    train = torch.stack([torch.randint(0, entities, (triples,), generator=gen), torch.randint(0, relations, (triples,), generator=gen),
                         torch.randint(0, entities, (triples,), generator=gen)], 1)  # fmt: skip
    return ChunkedNegativeSampler(train, entities, batch_size=2 * args.batch_size, chunk_size=128, negatives=128, world_size=2)


def loader(variant: str, example: str, source: Any, num: int) -> Iterator[Any]:
    if variant == "packed":
        return source.batches(0, 0, num, workers=1) if example == "dlrm" else source.batches(0, num, workers=1)
    batch = functools.partial(source.batch, 0) if example == "dlrm" else functools.partial(source.rank_batch, rank=0)
    return iter(torch.utils.data.DataLoader(
        BatchesAsObjects(batch, num), batch_size=None, num_workers=1, prefetch_factor=4,
        generator=torch.Generator().manual_seed(0),
    ))  # fmt: skip


def time_next(batches: Iterator[Any], num: int, step_s: float, warmup: int) -> float:
    """Median seconds of ``next(batches)`` after ``warmup`` batches, ``step_s`` between batches."""
    times = []
    for i in range(num):
        t0 = time.perf_counter()
        next(batches)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
        time.sleep(step_s)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--example", choices=("dlrm", "graph"), default="dlrm")
    p.add_argument("--config", default="criteo-kaggle", help="dlrm: the dataset's shape")
    p.add_argument("--scale", type=float, default=0.001, help="table sizes (the ids' range; not what is timed)")
    p.add_argument("--batch-size", type=int, default=1024, help="per rank (graph: positives of rank 0 of 2)")
    p.add_argument("--batches", type=int, default=150)
    p.add_argument("--step-ms", type=float, default=20.0)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(1)
    source = dlrm_click_data(args) if args.example == "dlrm" else graph_sampler(args)
    out: Dict[str, List[float]] = {"packed": [], "tensors": []}
    for r in range(args.repeats):
        for variant in (("packed", "tensors") if r % 2 == 0 else ("tensors", "packed")):
            out[variant].append(time_next(loader(variant, args.example, source, args.batches), args.batches, args.step_ms / 1e3, 20))
            print(f"repetition {r}: {variant:<8} next() {1e6 * out[variant][-1]:8.1f} µs (median)", flush=True)
    for variant, times in out.items():
        print(f"{variant:<8} next() median over {args.repeats} repetitions: {1e6 * statistics.median(times):8.1f} µs")


if __name__ == "__main__":
    main()
