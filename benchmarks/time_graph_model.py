"""The knowledge-graph example's model step alone, one process, no TorchRec: what its arithmetic costs.

The entity rows of one rank's batch are a plain tensor (what the sharded lookup returns), so the
figures are the scoring, the loss, the backward and the relation update, without the entity
table's lookup, exchange or optimizer. ``--relations`` picks the relation path:

* ``touched``  the model's step: ``models.batch_scores`` and ``models.RelationTable`` (Adagrad on
  the rows of the step, in the backward)
* ``split``    ``touched``, with the batch's rows split in three and each part scored on its own
  (TransE-L2's chunk distances still written out): the split's backward concatenates the parts'
  gradients (the scoring before ``batch_scores``)
* ``dense``    the former relation path: a dense ``nn.Embedding`` stepped in full by
  ``torch.optim.Adagrad`` (the batch's rows sliced three times, each slice's backward filling a
  zero tensor of them all)
* ``cdist``    ``split``, with TransE-L2's chunk distances by ``torch.cdist`` and its autograd
  instead of the written-out backward (the former scoring)

Alternating repetitions of ``--steps`` steps each; medians in ms a step, and the top operators by
self CPU time of the last repetition (torch.profiler):

    python benchmarks/time_graph_model.py --relations touched dense --repeats 5
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Sequence

sys.path.append(str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.profiler import profile  # noqa: E402

from examples.graph.models import (  # noqa: E402
    KGEConfig, RelationTable, batch_scores, kge_loss, query, score_candidates, score_pairs,
)  # fmt: skip


def make_step(kind: str, args: argparse.Namespace) -> Callable[[], None]:
    """One training step of ``kind``'s relation path on fixed ids (Zipf relations, as the generator)."""
    cfg = KGEConfig(model=args.model, dim=args.dim)
    b, k, m = args.positives, args.chunk_size, args.negatives
    gen = torch.Generator().manual_seed(0)
    emb = torch.randn(2 * b + b // k * m, args.dim, generator=gen).mul_(cfg.init_bound).requires_grad_()
    ids = torch.multinomial(1.0 / torch.arange(1, args.relations + 1.0), b, replacement=True, generator=gen)
    sign = torch.tensor([1.0])

    def candidates(q: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        if kind == "cdist" and cfg.model == "transe_l2":
            return cfg.gamma - torch.cdist(q, c, p=2.0)
        return score_candidates(cfg, q, c)

    def scores(anchor: torch.Tensor, true: torch.Tensor, negs: torch.Tensor, rel: torch.Tensor) -> torch.Tensor:
        q = query(cfg, anchor, rel, sign)
        negative = candidates(q.reshape(-1, k, args.dim), negs.reshape(-1, m, args.dim)).reshape(b, m)
        return kge_loss(cfg, score_pairs(cfg, q, true), negative)

    if kind == "touched":
        table = RelationTable(args.relations, args.dim, 0.1, torch.device("cpu"))

        def step() -> None:
            kge_loss(cfg, *batch_scores(cfg, emb, table(ids), sign, k, m)).backward()
            emb.grad = None

        return step
    if kind in ("split", "cdist"):
        table = RelationTable(args.relations, args.dim, 0.1, torch.device("cpu"))

        def step() -> None:
            anchor, true, negs = emb.split([b, b, emb.shape[0] - 2 * b])
            scores(anchor, true, negs, table(ids)).backward()
            emb.grad = None

        return step
    dense = nn.Embedding(args.relations, args.dim)
    opt = torch.optim.Adagrad(dense.parameters(), lr=0.1)

    def step_dense() -> None:
        scores(emb[:b], emb[b : 2 * b], emb[2 * b :], dense(ids)).backward()
        opt.step()
        opt.zero_grad()
        emb.grad = None

    return step_dense


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--relations", dest="kinds", nargs="+", choices=("touched", "split", "dense", "cdist"), default=["touched", "dense"])
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
