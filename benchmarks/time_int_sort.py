"""PyTorch's CPU sort against the radix sorts of ``torchrec_frugal.int_sort``, side by side.

For each size, on the same random ids (row indices below ``--rows-per-id`` x size, as a batch's
inverse is, and fused row ids below ``--fused-rows``, as a batch's ids are), times the median of
``--repeats`` calls of: ``torch.argsort(stable=True)`` against ``stable_argsort`` on the inverse,
and ``torch.unique(return_inverse=True)`` against ``unique_inverse`` on the ids. One torch thread.
The results are checked equal before timing.

A second table times the other whole-batch operations on ids that planning a batch makes, in
PyTorch and in numpy on the same memory: a gather by a permutation (``t[idx]``, ``index_select``,
``np.take``), the inverse of a permutation (a scatter), a per-table lookup of each id's table size
(a gather from 26 values) and the check that every bag holds one id (``== 1`` then ``all``).

    python benchmarks/time_int_sort.py --sizes 4096 16384 26624 65536 106496
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, List, Tuple

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a script: `benchmarks`, `examples`, and `torchrec_frugal` where no installed one wins
    sys.path.append(str(ROOT))

import numpy as np  # noqa: E402
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
    print(f"\n{'ids':>8} {'op':<36} {'torch':>8} {'numpy':>8}   (ms, median of {args.repeats})")
    for n in args.sizes:
        for name, torch_op, numpy_op in id_ops(n, gen):
            assert np.array_equal(np.asarray(torch_op()), np.asarray(numpy_op())), name
            t, a = median_ms(torch_op, args.repeats), median_ms(numpy_op, args.repeats)
            print(f"{n:8d} {name:<36} {t:8.3f} {a:8.3f}", flush=True)


def id_ops(n: int, gen: torch.Generator) -> List[Tuple[str, Callable[[], object], Callable[[], object]]]:
    """(name, the PyTorch call, the numpy call) of the id operations a plan makes, on ``n`` ids."""
    perm, values = torch.randperm(n, generator=gen), torch.randint(0, 1 << 20, (n,), generator=gen)
    sizes, tables = torch.randint(1, 1 << 20, (26,), generator=gen), torch.randint(0, 26, (n,), generator=gen)
    lengths = torch.ones(n, dtype=torch.int64)
    p, v, s, t, ln = perm.numpy(), values.numpy(), sizes.numpy(), tables.numpy(), lengths.numpy()

    def scatter_torch() -> torch.Tensor:
        out = torch.empty_like(perm)
        out[perm] = torch.arange(n)
        return out

    def scatter_numpy() -> np.ndarray:
        out = np.empty_like(p)
        out[p] = np.arange(n)
        return out

    return [
        ("gather values[perm]", lambda: values[perm], lambda: np.take(v, p)),
        ("gather values.index_select(0, perm)", lambda: values.index_select(0, perm), lambda: np.take(v, p)),
        ("inverse permutation (scatter)", scatter_torch, scatter_numpy),
        ("table size of each id", lambda: sizes[tables], lambda: np.take(s, t)),
        ("every bag one id", lambda: bool((lengths == 1).all()), lambda: bool(np.all(ln == 1))),
    ]


if __name__ == "__main__":
    main()
