"""What receiving a batch from a DataLoader worker costs the training thread, in the DLRM example.

Side by side, on the same synthetic batches, alternating within each repetition:

* ``packed``: the example's loader (``SyntheticClickData.batches(workers=1)``): each batch travels
  as one buffer and is unpacked as views of it on the training side.
* ``tensors``: a DataLoader worker returning the ``Batch`` itself (dense features, ids, lengths,
  offsets, labels: five tensors, each a shared-memory segment and a connection of its own).

The consuming thread sleeps ``--step-ms`` between batches (the training step), so the worker is
ahead and ``next()`` measures receiving alone. Prints the median microseconds of ``next()`` per
variant and repetition, and the median over repetitions.

    python benchmarks/time_loader.py --batch-size 1024
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, Iterator, List

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torchrec.datasets.utils import Batch  # noqa: E402

from examples.dlrm.configs import get_config  # noqa: E402
from examples.dlrm.data import SyntheticClickData  # noqa: E402


class BatchesAsTensors(torch.utils.data.Dataset):
    """The batches of one rank as ``Batch`` objects: what a worker sent before batches were packed."""

    def __init__(self, data: SyntheticClickData, num: int) -> None:
        self.data, self.num = data, num

    def __len__(self) -> int:
        return self.num

    def __getitem__(self, i: int) -> Batch:
        return self.data.batch(0, i)


def loader(variant: str, data: SyntheticClickData, num: int) -> Iterator[Batch]:
    if variant == "packed":
        return data.batches(0, 0, num, workers=1)
    return iter(torch.utils.data.DataLoader(
        BatchesAsTensors(data, num), batch_size=None, num_workers=1, prefetch_factor=4,
        generator=torch.Generator().manual_seed(0),
    ))  # fmt: skip


def time_next(batches: Iterator[Batch], num: int, step_s: float, warmup: int) -> float:
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
    p.add_argument("--config", default="criteo-kaggle")
    p.add_argument("--scale", type=float, default=0.001, help="table sizes (the ids' range; not what is timed)")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--batches", type=int, default=150)
    p.add_argument("--step-ms", type=float, default=20.0)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(1)
    cfg = get_config(args.config, scale=args.scale)
    data = SyntheticClickData(cfg.dataset, cfg.rows(), args.batch_size, seed=0)
    out: Dict[str, List[float]] = {"packed": [], "tensors": []}
    for r in range(args.repeats):
        for variant in (("packed", "tensors") if r % 2 == 0 else ("tensors", "packed")):
            out[variant].append(time_next(loader(variant, data, args.batches), args.batches, args.step_ms / 1e3, 20))
            print(f"repetition {r}: {variant:<8} next() {1e6 * out[variant][-1]:8.1f} µs (median)", flush=True)
    for variant, times in out.items():
        print(f"{variant:<8} next() median over {args.repeats} repetitions: {1e6 * statistics.median(times):8.1f} µs")


if __name__ == "__main__":
    main()
