"""Row-wise Adagrad on an owner's rows in host memory: the engine's update against its former rounding,
and how close each lands to FBGEMM's fused CPU kernel.

An owner on a CPU device applies each step's summed gradients to the rows it owns straight in the
host table (``engine.optimizers.update_rows``). This times that update alone, one thread, on the
knowledge-graph speed workload's shape (``--rows`` unique rows of ``--dim`` floats, other rows of a
``--table-rows`` table at every call), in alternating repetitions, for:

* ``fbgemm``   the engine's update: a multiplier ``lr / (sqrt(m) + eps)`` a row, ``w -= g * k``
  (FBGEMM's kernels compute it so)
* ``addcdiv``  the former rounding: ``(-lr * g) / (sqrt(m) + eps)`` element by element, in
  ``addcdiv_``'s order (one more pass over the rows' gradients)
* ``beside``   ``fbgemm``'s arithmetic on another layout: each row's state right after its weights
  (rows padded to a multiple of 16 floats), read where the row is and added with it in one
  ``index_add_`` of whole rows; the host tables keep the state apart, as FBGEMM does

Then both are stepped ``--steps`` times beside FBGEMM's CPU kernel (SplitTableBatchedEmbeddingBagsCodegen,
EXACT_ROWWISE_ADAGRAD) from the same table and gradients, and the share of weights equal to the
kernel's bit for bit and the largest difference are printed:

    python benchmarks/time_row_update.py --repeats 9
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a script: `benchmarks`, `examples`, and `torchrec_frugal` where no installed one wins
    sys.path.append(str(ROOT))

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from torchrec_frugal.config import OptimizerSpec  # noqa: E402
from torchrec_frugal.engine.optimizers import update_rows  # noqa: E402

Update = Callable[[torch.Tensor, torch.Tensor], None]
"""Updates the rows ``index`` of a table with their gradients ``grads``."""

PAD = 16  # ``beside``: floats a row takes, its weights then its state, a multiple of 16 (64-byte rows)


class Table:
    """A table of ``weights`` [n, d] and row-wise state as one variant lays them out and updates them."""

    def __init__(self, variant: str, spec: OptimizerSpec, weights: torch.Tensor) -> None:
        n, d = weights.shape
        self.spec, self.d = spec, d
        if variant == "beside":  # each row's state right after its weights, in the same pages
            width = (d + 1 + PAD - 1) // PAD * PAD
            self.rows = torch.zeros(n, width)
            self.rows[:, :d] = weights
            self.weights, self.state = self.rows[:, :d], self.rows[:, d : d + 1]
        else:
            self.weights, self.state = weights.clone(), torch.zeros(n, 1)
        self.update: Update = {"fbgemm": self._engine, "addcdiv": self._addcdiv, "beside": self._beside}[variant]

    def _engine(self, index: torch.Tensor, grads: torch.Tensor) -> None:
        update_rows(self.spec, self.weights, self.state, index, grads, 0)

    def _addcdiv(self, index: torch.Tensor, grads: torch.Tensor) -> None:
        """The engine's row-wise Adagrad before it took FBGEMM's multiplier: addcdiv_'s rounding."""
        m = self.state.index_select(0, index)[:, 0]
        m.add_(grads.pow(2).mean(dim=1))
        self.weights.index_add_(0, index, torch.mul(grads, -self.spec.lr).div_((m.sqrt() + self.spec.eps).unsqueeze(1)))
        self.state.index_copy_(0, index, m.unsqueeze(1))

    def _beside(self, index: torch.Tensor, grads: torch.Tensor) -> None:
        """The engine's arithmetic, the state read where the row is, both added in one pass of whole rows."""
        spec, d = self.spec, self.d
        square = torch.linalg.vecdot(grads, grads).div_(d)
        m = self.state.index_select(0, index)[:, 0].add_(square)
        denominator = m.sqrt().add_(spec.eps)
        k = torch.full_like(denominator, spec.lr).div_(denominator).unsqueeze(1)
        step = torch.zeros(index.shape[0], self.rows.shape[1])
        torch.mul(grads, k.neg_(), out=step[:, :d])
        step[:, d] = square  # m + square, as the engine's add_
        self.rows.index_add_(0, index, step)


VARIANTS = ("fbgemm", "addcdiv", "beside")


def time_updates(args: argparse.Namespace, spec: OptimizerSpec) -> Dict[str, float]:
    """Median ms of one update of ``args.rows`` rows, per variant, alternating repetitions."""
    gen = torch.Generator().manual_seed(0)
    weights = torch.rand(args.table_rows, args.dim, generator=gen)
    tables = {v: Table(v, spec, weights) for v in VARIANTS}
    del weights
    # other rows at every call, as an owner's steps have: rows updated again would be in the caches
    indices = [torch.randperm(args.table_rows, generator=gen)[: args.rows].sort().values for _ in range(args.calls)]
    grads = torch.randn(args.rows, args.dim, generator=gen).mul_(0.01)
    times: Dict[str, List[float]] = {v: [] for v in VARIANTS}
    for rep in tqdm(range(args.repeats), desc="time_row_update", unit="repeat"):
        for v in VARIANTS:
            update = tables[v].update
            t0 = time.perf_counter()
            for index in indices:
                update(index, grads)
            times[v].append((time.perf_counter() - t0) / args.calls * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def against_fbgemm(args: argparse.Namespace, spec: OptimizerSpec) -> Dict[str, Dict[str, float]]:
    """Each variant stepped beside FBGEMM's CPU kernel: share of weights equal bit for bit, largest difference."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import ComputeDevice, EmbeddingLocation, PoolingMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import SplitTableBatchedEmbeddingBagsCodegen

    rows = args.rows
    gen = torch.Generator().manual_seed(1)
    w0 = torch.rand(rows, args.dim, generator=gen).mul_(2).sub_(1)
    kernel = SplitTableBatchedEmbeddingBagsCodegen(
        [(rows, args.dim, EmbeddingLocation.HOST, ComputeDevice.CPU)],
        optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD, learning_rate=spec.lr, eps=spec.eps, pooling_mode=PoolingMode.SUM,
    )  # fmt: skip
    kernel.split_embedding_weights()[0].copy_(w0)
    tables = {v: Table(v, spec, w0) for v in VARIANTS}
    ids, offsets = torch.arange(rows), torch.arange(rows + 1)
    for _ in range(args.steps):
        grads = torch.randn(rows, args.dim, generator=gen).mul_(0.01)
        (kernel(ids, offsets) * grads).sum().backward()  # one id a bag: each row's gradient is its bag's
        for table in tables.values():
            table.update(ids, grads)
    want = kernel.split_embedding_weights()[0]
    return {
        v: {"equal": float((t.weights == want).float().mean()), "max_abs": float((t.weights - want).abs().max())}
        for v, t in tables.items()
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=2800, help="unique rows updated (an owner's share of a step)")
    p.add_argument("--dim", type=int, default=400)
    p.add_argument("--table-rows", type=int, default=2_000_000)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--eps", type=float, default=1e-10)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--calls", type=int, default=50, help="updates timed per repetition, each of other rows")
    p.add_argument("--steps", type=int, default=20, help="steps beside FBGEMM's kernel")
    args = p.parse_args()
    torch.set_num_threads(1)
    spec = OptimizerSpec(kind="rowwise_adagrad", lr=args.lr, eps=args.eps)
    times = time_updates(args, spec)
    close = against_fbgemm(args, spec)
    print(f"row-wise Adagrad, {args.rows} rows x {args.dim} of a {args.table_rows:,}-row table, one thread")
    print(f"{'update':10} {'ms (median)':>12} {'equal to FBGEMM':>16} {'max |diff|':>11}")
    for v in VARIANTS:
        print(f"{v:10} {times[v]:12.3f} {100 * close[v]['equal']:15.2f}% {close[v]['max_abs']:11.2e}")


if __name__ == "__main__":
    main()
