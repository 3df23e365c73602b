"""PyTorch's CPU sort against the radix sorts of ``torchrec_frugal.int_sort``, side by side.

For each size, on the same random ids (row indices below ``--rows-per-id`` x size, as a batch's
inverse is, and fused row ids below ``--fused-rows``, as a batch's ids are), times the median of
``--repeats`` calls of: ``torch.argsort(stable=True)`` against ``stable_argsort`` on the inverse,
and ``torch.unique(return_inverse=True)`` against ``unique_inverse`` on the ids. One torch thread.
The results are checked equal before timing.

    python benchmarks/time_int_sort.py --sizes 4096 16384 26624 65536 106496
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from torchrec_frugal.int_sort import stable_argsort, unique_inverse  # noqa: E402


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[4096, 16384, 26624, 65536, 106496])
    p.add_argument("--rows-per-id", type=float, default=0.6, help="unique rows per id of the inverse's range")
    p.add_argument("--fused-rows", type=int, default=3_381_001, help="the ids' range (criteo-kaggle x0.1's rows)")
    p.add_argument("--repeats", type=int, default=30)
    args = p.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    print(f"{'ids':>8} {'argsort torch':>14} {'radix':>8} {'unique torch':>13} {'radix':>8}   (ms, median of {args.repeats})")
    for n in args.sizes:
        inverse = torch.randint(0, max(1, int(args.rows_per_id * n)), (n,), generator=gen)
        ids = torch.randint(0, args.fused_rows, (n,), generator=gen)
        assert torch.equal(stable_argsort(inverse), torch.argsort(inverse, stable=True))
        assert all(torch.equal(a, b) for a, b in zip(unique_inverse(ids), torch.unique(ids, return_inverse=True)))
        cols = (
            median_ms(lambda: torch.argsort(inverse, stable=True), args.repeats),
            median_ms(lambda: stable_argsort(inverse), args.repeats),
            median_ms(lambda: torch.unique(ids, return_inverse=True), args.repeats),
            median_ms(lambda: unique_inverse(ids), args.repeats),
        )
        print(f"{n:8d} {cols[0]:14.3f} {cols[1]:8.3f} {cols[2]:13.3f} {cols[3]:8.3f}", flush=True)


if __name__ == "__main__":
    main()
