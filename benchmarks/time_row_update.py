"""Row-wise Adagrad on an owner's rows in host memory: the engine's update against its former rounding,
and how close each lands to FBGEMM's fused CPU kernel.

An owner on a CPU device applies each step's summed gradients to the rows it owns straight in the
host table (``engine.optimizers.update_rows``). This times that update alone, one thread, on the
knowledge-graph speed workload's shape (``--rows`` unique rows of ``--dim`` floats, spread over a
``--table-rows`` table), in alternating repetitions, for:

* ``fbgemm``   the engine's update: a multiplier ``lr / (sqrt(m) + eps)`` a row, ``w -= g * k``
  (FBGEMM's kernels compute it so)
* ``addcdiv``  the former rounding: ``(-lr * g) / (sqrt(m) + eps)`` element by element, in
  ``addcdiv_``'s order (one more pass over the rows' gradients)

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
from typing import Callable, Dict

sys.path.append(str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from torchrec_frugal.config import OptimizerSpec  # noqa: E402
from torchrec_frugal.engine.optimizers import update_rows  # noqa: E402

Update = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]


def former_update(spec: OptimizerSpec) -> Update:
    """The engine's row-wise Adagrad before it took FBGEMM's multiplier: addcdiv_'s rounding."""

    def update(weights: torch.Tensor, state: torch.Tensor, index: torch.Tensor, grads: torch.Tensor) -> None:
        m = state.index_select(0, index)[:, 0]
        m.add_(grads.pow(2).mean(dim=1))
        weights.index_add_(0, index, torch.mul(grads, -spec.lr).div_((m.sqrt() + spec.eps).unsqueeze(1)))
        state.index_copy_(0, index, m.unsqueeze(1))

    return update


def updates(spec: OptimizerSpec) -> Dict[str, Update]:
    return {
        "fbgemm": lambda w, s, i, g: update_rows(spec, w, s, i, g, 0),
        "addcdiv": former_update(spec),
    }


def time_updates(args: argparse.Namespace, spec: OptimizerSpec) -> Dict[str, float]:
    """Median ms of one update of ``args.rows`` rows, per variant, alternating repetitions."""
    gen = torch.Generator().manual_seed(0)
    table = torch.rand(args.table_rows, args.dim, generator=gen)
    state = torch.zeros(args.table_rows, 1)
    index = torch.randperm(args.table_rows, generator=gen)[: args.rows].sort().values
    grads = torch.randn(args.rows, args.dim, generator=gen).mul_(0.01)
    times: Dict[str, list] = {k: [] for k in updates(spec)}
    for rep in range(args.repeats):
        for name, update in updates(spec).items():
            t0 = time.perf_counter()
            for _ in range(args.calls):
                update(table, state, index, grads)
            times[name].append((time.perf_counter() - t0) / args.calls * 1e3)
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
    ours = {k: (w0.clone(), torch.zeros(rows, 1)) for k in updates(spec)}
    ids, offsets = torch.arange(rows), torch.arange(rows + 1)
    for _ in range(args.steps):
        grads = torch.randn(rows, args.dim, generator=gen).mul_(0.01)
        (kernel(ids, offsets) * grads).sum().backward()  # one id a bag: each row's gradient is its bag's
        for name, update in updates(spec).items():
            update(*ours[name], ids, grads)
    want = kernel.split_embedding_weights()[0]
    return {
        name: {"equal": float((w == want).float().mean()), "max_abs": float((w - want).abs().max())}
        for name, (w, _) in ours.items()
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=2800, help="unique rows updated (an owner's share of a step)")
    p.add_argument("--dim", type=int, default=400)
    p.add_argument("--table-rows", type=int, default=2_000_000)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--eps", type=float, default=1e-10)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--calls", type=int, default=50, help="updates timed per repetition")
    p.add_argument("--steps", type=int, default=20, help="steps beside FBGEMM's kernel")
    args = p.parse_args()
    torch.set_num_threads(1)
    spec = OptimizerSpec(kind="rowwise_adagrad", lr=args.lr, eps=args.eps)
    times = time_updates(args, spec)
    close = against_fbgemm(args, spec)
    print(f"row-wise Adagrad, {args.rows} rows x {args.dim} of a {args.table_rows:,}-row table, one thread")
    print(f"{'update':10} {'ms (median)':>12} {'equal to FBGEMM':>16} {'max |diff|':>11}")
    for name in times:
        print(f"{name:10} {times[name]:12.3f} {100 * close[name]['equal']:15.2f}% {close[name]['max_abs']:11.2e}")


if __name__ == "__main__":
    main()
