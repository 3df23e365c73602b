"""The knowledge-graph example's model step alone, one process, no TorchRec: what its arithmetic costs.

The entity and relation rows of one rank's batch are plain tensors (what the sharded lookup
returns), so the figures are the scoring, the loss and the backward, without the tables' lookup,
exchange or optimizer. ``--scoring`` picks how the batch is scored:

* ``batch``  the model's: ``models.batch_scores`` (TransE-L2's batch in one autograd node)
* ``split``  the batch's rows split in three and each part scored on its own (TransE-L2's chunk
  distances still written out): the split's backward concatenates the parts' gradients (the
  scoring before ``batch_scores``)
* ``cdist``  ``split``, with TransE-L2's chunk distances by ``torch.cdist`` and its autograd
  instead of the written-out backward (the former scoring)

Alternating repetitions of ``--steps`` steps each; medians in ms a step, and the top operators by
self CPU time of the last repetition (torch.profiler):

    python benchmarks/time_graph_model.py --scoring batch split --repeats 5

Until the relations became a table of the sharded collection, ``--relations touched|split|dense|cdist``
picked the relation path too (``models.RelationTable``, or a dense ``nn.Embedding`` and
``torch.optim.Adagrad``); docs/performance.md's figures before that name it.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Sequence

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a script: `benchmarks`, `examples`, and `torchrec_frugal` where no installed one wins
    sys.path.append(str(ROOT))

import torch  # noqa: E402
from torch.profiler import profile  # noqa: E402

from examples.graph.models import KGEConfig, batch_scores, kge_loss, query, score_candidates, score_pairs  # noqa: E402


def make_step(kind: str, args: argparse.Namespace) -> Callable[[], None]:
    """One training step scored as ``kind`` on fixed rows (Zipf relations, as the generator)."""
    cfg = KGEConfig(model=args.model, dim=args.dim)
    b, k, m = args.positives, args.chunk_size, args.negatives
    gen = torch.Generator().manual_seed(0)
    emb = torch.randn(2 * b + b // k * m, args.dim, generator=gen).mul_(cfg.init_bound).requires_grad_()
    table = torch.randn(args.relations, args.dim, generator=gen).mul_(cfg.init_bound)
    ids = torch.multinomial(1.0 / torch.arange(1, args.relations + 1.0), b, replacement=True, generator=gen)
    rel = table.index_select(0, ids).requires_grad_()
    sign = torch.tensor([1.0])

    def candidates(q: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        if kind == "cdist" and cfg.model == "transe_l2":
            return cfg.gamma - torch.cdist(q, c, p=2.0)
        return score_candidates(cfg, q, c)

    def step() -> None:
        if kind == "batch":
            loss = kge_loss(cfg, *batch_scores(cfg, emb, rel, sign, k, m))
        else:
            anchor, true, negs = emb.split([b, b, emb.shape[0] - 2 * b])
            q = query(cfg, anchor, rel, sign)
            negative = candidates(q.reshape(-1, k, args.dim), negs.reshape(-1, m, args.dim)).reshape(b, m)
            loss = kge_loss(cfg, score_pairs(cfg, q, true), negative)
        loss.backward()
        emb.grad = rel.grad = None

    return step


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scoring", dest="kinds", nargs="+", choices=("batch", "split", "cdist"), default=["batch", "split"])
    ap.add_argument("--model", default="transe_l2")
    ap.add_argument("--dim", type=int, default=400)
    ap.add_argument("--positives", type=int, default=512, help="one rank's share of the benchmark's batch")
    ap.add_argument("--chunk-size", type=int, default=128)
    ap.add_argument("--negatives", type=int, default=128)
    ap.add_argument("--num-relations", dest="relations", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--top", type=int, default=8)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    steps = {kind: make_step(kind, args) for kind in args.kinds}
    for s in steps.values():
        for _ in range(5):
            s()
    times: Dict[str, List[float]] = {kind: [] for kind in args.kinds}
    for rep in range(args.repeats):
        for kind in args.kinds[rep % len(args.kinds) :] + args.kinds[: rep % len(args.kinds)]:
            t0 = time.perf_counter()
            for _ in range(args.steps):
                steps[kind]()
            times[kind].append(1e3 * (time.perf_counter() - t0) / args.steps)
    for kind in args.kinds:
        print(f"{kind:<8} {statistics.median(times[kind]):6.2f} ms a step (median of {args.repeats}; "
              f"{min(times[kind]):.2f}-{max(times[kind]):.2f})")  # fmt: skip
        with profile() as prof:
            for _ in range(args.steps):
                steps[kind]()
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top)
        print("\n".join(line[:110] for line in table.splitlines()))


if __name__ == "__main__":
    main()
