"""`make demo`: multi-process embedding training through the Frugal engine on this machine.

Two ranks learn embedding tables (Zipf-skewed ids) for a planted linear target, once with
proactive flushing (lookahead 10) and once with write-through (lookahead 0), on the same data.
Both runs are exact, so they must end with the same tables; the demo prints what it measured.
"""
from __future__ import annotations

import argparse
import os
import socket
import time
from datetime import timedelta
from typing import Dict, List

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tqdm import tqdm

from .config import FrugalConfig, OptimizerSpec, TableSpec
from .engine import FrugalEngine
from .workload import ZipfWorkload

TABLE_ROWS = (200_000, 50_000, 20_000, 5_000)
DIM = 16


def _train(rank: int, world: int, lookahead: int, args: argparse.Namespace) -> Dict[str, float]:
    wl = ZipfWorkload(TABLE_ROWS, args.batch, s=1.2, seed=args.seed)
    gen = torch.Generator().manual_seed(1234)
    probe = torch.randn(DIM, generator=gen)  # fixed readout: prediction = <sum of embeddings, probe>
    target_rows = torch.randn(sum(TABLE_ROWS), generator=gen)  # planted per-row contribution
    eng = FrugalEngine(
        [TableSpec(f"t{i}", n, DIM) for i, n in enumerate(TABLE_ROWS)],
        OptimizerSpec("rowwise_adagrad", lr=0.05),
        FrugalConfig(lookahead=lookahead, cache_ratio=0.05),
        presample_counts=wl.counts(rank, 20),
        seed=args.seed,
    )
    off = eng.table_offsets

    def batch(step: int) -> torch.Tensor:  # [B, tables] fused rows, one id per table per sample
        return torch.stack([ids + off[t] for t, ids in enumerate(wl.batch(rank, step))], dim=1)

    for t in range(lookahead):
        eng.push_lookahead(batch(t).reshape(-1))
    losses: List[float] = []
    gate = flushed = hits = lookups = 0.0
    bar = tqdm(range(args.steps), desc=f"lookahead={lookahead}", disable=rank != 0, leave=False)
    t0 = time.perf_counter()
    for step in bar:
        if lookahead and step + lookahead < args.steps:
            eng.push_lookahead(batch(step + lookahead).reshape(-1))
        rows = batch(step)
        flat = rows.reshape(-1)
        eng.begin_step(flat)
        emb = eng.lookup(flat).view(rows.shape[0], rows.shape[1], DIM).requires_grad_()
        pred = emb.sum(dim=1) @ probe
        loss = torch.nn.functional.mse_loss(pred, target_rows[rows].sum(dim=1))
        loss.backward()
        uniq, inv = torch.unique(flat, return_inverse=True)
        grads = torch.zeros(uniq.shape[0], DIM).index_add_(0, inv, emb.grad.reshape(-1, DIM))
        eng.apply_gradients(uniq, grads)
        m = eng.last_metrics
        gate += m.gate_wait_s
        flushed += m.bytes_flushed
        hits += m.cache_hits
        lookups += m.lookups
        losses.append(loss.item())
        if rank == 0 and step % 50 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
    elapsed = time.perf_counter() - t0
    eng.flush()
    weights, _ = eng.read_rows()
    eng.close()
    return {
        "samples_per_s": args.batch * args.steps * world / elapsed,
        "loss_first": float(np.mean(losses[:20])),
        "loss_last": float(np.mean(losses[-20:])),
        "gate_stall": gate / elapsed,
        "mb_flushed_per_step": flushed / args.steps / 1e6,
        "hit_ratio": hits / max(lookups, 1),
        "weights": weights,
    }


def _rank_main(rank: int, world: int, port: int, args: argparse.Namespace, out: "mp.Queue") -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
    results = {L: _train(rank, world, L, args) for L in (10, 0)}
    if rank == 0:
        diff = (results[10]["weights"] - results[0]["weights"]).abs().max().item()
        for r in results.values():
            del r["weights"]
        out.put((results, diff))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch", type=int, default=512, help="samples per rank per step")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    print(f"Frugal demo: {args.world} ranks, tables {TABLE_ROWS} x dim {DIM}, Zipf s=1.2, "
          f"batch {args.batch} per rank, {args.steps} steps per mode, row-wise Adagrad")
    procs = [ctx.Process(target=_rank_main, args=(r, args.world, port, args, out)) for r in range(args.world)]
    for pr in procs:
        pr.start()
    results, diff = out.get(timeout=1800)
    for pr in procs:
        pr.join()
        if pr.exitcode:
            raise SystemExit(f"a rank exited with code {pr.exitcode}")
    print(f"\n{'mode':<28}{'samples/s':>11}{'loss start->end':>18}{'gate stall':>12}{'MB flushed/step':>17}{'cache hits':>12}")
    for L, r in results.items():
        name = "proactive flush (L=10)" if L else "write-through (L=0)"
        print(f"{name:<28}{r['samples_per_s']:>11.0f}{r['loss_first']:>9.3f} ->{r['loss_last']:>6.3f}"
              f"{100 * r['gate_stall']:>11.1f}%{r['mb_flushed_per_step']:>17.3f}{100 * r['hit_ratio']:>11.1f}%")
    print(f"\nproactive / write-through throughput: {results[10]['samples_per_s'] / results[0]['samples_per_s']:.2f}x")
    print(f"max |difference| of the final tables between the two modes: {diff:.2e} (both are exact)")
    if diff > 1e-4:
        raise SystemExit("the two modes disagree: exactness is broken")


if __name__ == "__main__":
    main()
