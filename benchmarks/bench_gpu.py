"""CUDA measurements of the engine's host paths, and the report docs/gpu.md is written from.

    python benchmarks/bench_gpu.py --json gpu.json [--quick]
    python benchmarks/bench_gpu.py --render gpu.json --tests tests.tsv --md docs/gpu.md

Measured (on the current CUDA device, tables in a shared-memory segment as the engine keeps them):

* gather: GB/s of reading ``--gather-rows`` random rows of a host table of about 1 GiB into
  device memory, by the three paths: ``zero_copy`` (one index_select kernel on the table mapped
  with cudaHostRegister, reading host memory over PCIe), ``pinned`` (the host gathers into a
  page-locked buffer, then one asynchronous copy) and ``device`` (the same table held in device
  memory: the ceiling a full device cache would give). Each path through ``HostTables`` exactly
  as the engine calls it; indices already on the device. Median of timed repetitions.
* flush: rows/s and GB/s of writing random rows from device memory back into the host table on
  the flush side stream (zero_copy: one scatter kernel into mapped memory; pinned: an
  asynchronous device-to-host copy, then the host scatters), until the flush's event is reached.
* gate: 2 and 4 ranks sharing the GPU (gloo) train a DLRM-like step (lookup, an MLP forward and
  backward on the device, row gradients, apply_gradients) on Zipf(1.2) ids; per step the engine's
  own metrics give the gate wait, the gradient-exchange wait and the step time, for L=10 on both
  host paths and for write-through (L=0).

Wall times are read after ``torch.cuda.synchronize()``; ``--render`` only formats a JSON this
script wrote, with the test results that scripts/device_check.sh recorded.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import sys
import time
import traceback
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Dict, List

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torchrec_frugal import shm  # noqa: E402
from torchrec_frugal.config import FrugalConfig, OptimizerSpec, TableSpec  # noqa: E402
from torchrec_frugal.device import HostTables, Streams  # noqa: E402
from torchrec_frugal.engine import FrugalEngine  # noqa: E402
from torchrec_frugal.workload import ZipfWorkload  # noqa: E402


# ---------------------------------------------------------------------------------------------- timing
def _median_s(fn: Callable[[], object], reps: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _host_table(rows: int, dim: int) -> shm.SharedSegment:
    layout = shm.Layout([shm.Field("weights", torch.float32, (rows, dim))])
    seg = shm.SharedSegment.create(f"{shm.PREFIX}{shm.new_run_id()}_bench", layout)
    seg.unlink()
    seg["weights"].uniform_(-1, 1)
    return seg


# ---------------------------------------------------------------------------------------------- gather, flush
def bench_paths(table_bytes: int, n_rows: int, dims: List[int], reps: int) -> Dict[str, Any]:
    dev = torch.device("cuda", torch.cuda.current_device())
    gather: List[Dict[str, Any]] = []
    flush: List[Dict[str, Any]] = []
    for dim in dims:
        rows_total = table_bytes // (dim * 4)
        seg = _host_table(rows_total, dim)
        tables = {"weights": seg["weights"]}
        t0 = time.perf_counter()
        zc = HostTables(tables, seg.base, dev, "zero_copy", seg)
        register_s = time.perf_counter() - t0
        pinned = HostTables(tables, seg.base, dev, "pinned", seg)
        on_device = seg["weights"].to(dev)
        g = torch.Generator().manual_seed(dim)
        rows = torch.randint(0, rows_total, (n_rows,), generator=g)
        rows_dev = rows.to(dev)
        nbytes = n_rows * dim * 4
        times = {
            "zero_copy": _median_s(lambda: zc.read("weights", rows, rows_dev), reps),
            "pinned": _median_s(lambda: pinned.read("weights", rows), reps),
            "device": _median_s(lambda: on_device.index_select(0, rows_dev), reps),
        }
        for path, t in times.items():
            gather.append({"dim": dim, "rows": n_rows, "path": path, "ms": t * 1e3, "gb_s": nbytes / t / 1e9})

        # Flushes write unique rows (a chunk of distinct rows is what the queue hands out).
        uniq = torch.randperm(rows_total, generator=g)[:n_rows]
        uniq_dev = uniq.to(dev)
        src = torch.randn(n_rows, dim, device=dev)
        streams = Streams(dev)
        for path, ht in (("zero_copy", zc), ("pinned", pinned)):

            def one_flush(ht: HostTables = ht) -> None:
                with streams.side(streams.mark()):
                    ht.write("weights", uniq, src, uniq_dev)
                    done = streams.mark()
                done.synchronize()

            t = _median_s(one_flush, reps)
            flush.append({"dim": dim, "rows": n_rows, "path": path, "ms": t * 1e3, "rows_s": n_rows / t, "gb_s": nbytes / t / 1e9})
        assert torch.equal(seg["weights"][uniq[:100]], src[:100].cpu()), "flush did not land in host memory"
        zc.close()
        pinned.close()
        gather.append({"dim": dim, "rows": rows_total, "path": "register", "ms": register_s * 1e3, "gb_s": rows_total * dim * 4 / register_s / 1e9})
        del on_device
        torch.cuda.empty_cache()
    return {"table_bytes": table_bytes, "gather": gather, "flush": flush}


# ---------------------------------------------------------------------------------------------- gate stall
TABLE_ROWS = [1_000_000, 500_000, 200_000, 100_000]
DIM = 32


def _gate_rank(rank: int, world: int, mode: Dict[str, Any], steps: int, batch: int, warmup: int) -> Dict[str, float]:
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    wl = ZipfWorkload(TABLE_ROWS, batch, s=1.2, seed=0)
    tables = [TableSpec(f"t{i}", n, DIM) for i, n in enumerate(TABLE_ROWS)]
    cfg = FrugalConfig(lookahead=mode["lookahead"], cache_ratio=0.05, host_path=mode["host_path"], timeout_s=120)
    eng = FrugalEngine(tables, OptimizerSpec("rowwise_adagrad", lr=0.05), cfg, device=dev, presample_counts=wl.counts(rank, 50))
    offs = eng.table_offsets
    total = steps + warmup
    batches = [torch.cat([ids + offs[t] for t, ids in enumerate(wl.batch(rank, s))]) for s in range(total)]
    uniq = [torch.unique(b, return_inverse=True) for b in batches]
    mlp = torch.nn.Sequential(torch.nn.Linear(len(TABLE_ROWS) * DIM, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256),
                              torch.nn.ReLU(), torch.nn.Linear(256, 1)).to(dev)
    labels = torch.randint(0, 2, (batch, 1), device=dev).float()
    opt = torch.optim.SGD(mlp.parameters(), lr=0.01)
    for s in range(min(eng.lookahead, total)):
        eng.push_lookahead(uniq[s][0])
    per_step = []
    for s in range(total):
        if eng.lookahead and s + eng.lookahead < total:
            eng.push_lookahead(uniq[s + eng.lookahead][0])
        u, inv = uniq[s]
        eng.begin_step(u)
        vals = eng.lookup(u).requires_grad_()
        x = vals.index_select(0, inv.to(dev, non_blocking=True)).view(len(TABLE_ROWS), batch, DIM).transpose(0, 1).reshape(batch, -1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(mlp(x), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        eng.apply_gradients(u, vals.grad)
        m = eng.last_metrics
        if s >= warmup:
            per_step.append((m.gate_wait_s, m.exchange_wait_s, m.step_time_s, m.rows_flushed, m.cache_hit_ratio))
    eng.flush()
    eng.close()
    a = np.array(per_step)
    return {
        "gate_wait_ms_mean": float(a[:, 0].mean() * 1e3),
        "gate_wait_ms_p90": float(np.percentile(a[:, 0], 90) * 1e3),
        "exchange_wait_ms_mean": float(a[:, 1].mean() * 1e3),
        "step_ms_mean": float(a[:, 2].mean() * 1e3),
        "gate_stall_fraction": float(a[:, 0].sum() / a[:, 2].sum()),
        "rows_flushed_per_step": float(a[:, 3].mean()),
        "cache_hit_ratio": float(a[:, 4].mean()),
    }


def _worker(rank: int, world: int, port: int, modes: List[Dict[str, Any]], args: tuple, out: "mp.Queue") -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=300))
        res = [_gate_rank(rank, world, m, *args) for m in modes]
        out.put((rank, "ok", res))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        out.put((rank, "error", traceback.format_exc()))
        raise


def bench_gate(world: int, modes: List[Dict[str, Any]], steps: int, batch: int, warmup: int) -> List[Dict[str, Any]]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [ctx.Process(target=_worker, args=(r, world, port, modes, (steps, batch, warmup), out)) for r in range(world)]
    for p in procs:
        p.start()
    by_rank: Dict[int, Any] = {}
    try:
        for _ in range(world):
            rank, status, payload = out.get(timeout=600)
            if status != "ok":
                raise RuntimeError(f"rank {rank} failed:\n{payload}")
            by_rank[rank] = payload
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    rows = []
    for i, m in enumerate(modes):
        per_rank = [by_rank[r][i] for r in range(world)]
        avg = {k: float(np.mean([pr[k] for pr in per_rank])) for k in per_rank[0]}
        rows.append({"world": world, "batch": batch, "steps": steps, **m, **avg})
    return rows


# ---------------------------------------------------------------------------------------------- report
def _gpu_facts() -> Dict[str, str]:
    facts = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda_runtime": str(torch.version.cuda),
        "python": sys.version.split()[0],
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "driver": "unknown",
    }
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        facts["driver"] = q.stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        pass
    return facts


def render(results: Dict[str, Any], tests_tsv: str) -> str:
    f = results["facts"]
    lines = [
        "# The CUDA path, measured",
        "",
        f"Written by `scripts/device_check.sh` on {f['date']}: {f['gpu']}, driver {f['driver']}, CUDA runtime "
        f"{f['cuda_runtime']}, torch {f['torch']}, Python {f['python']}. Host tables live in POSIX shared memory "
        "(`/dev/shm`) as in training; every figure below is a measurement of this run.",
        "",
        "## Tests",
        "",
        "| suite | result |",
        "|---|---|",
    ]
    for line in Path(tests_tsv).read_text().splitlines():
        name, summary = line.split("\t", 1)
        lines.append(f"| {name} | {summary} |")
    p = results["paths"]
    lines += [
        "",
        f"## Host reads: gather of random rows from a {p['table_bytes'] / 2**30:.1f} GiB table",
        "",
        "`zero_copy`: one index_select kernel on the mapped host table (reads over PCIe). `pinned`: host gather into",
        "page-locked memory, then one asynchronous copy. `device`: the same table in device memory (ceiling).",
        "`register`: cudaHostRegister of the whole table (once per engine).",
        "",
        "| dim | rows | path | ms | GB/s |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {g['dim']} | {g['rows']} | {g['path']} | {g['ms']:.3f} | {g['gb_s']:.1f} |" for g in p["gather"]]
    lines += [
        "",
        "## Flushes: distinct rows from device memory to the host table, on the flush stream",
        "",
        "| dim | rows | path | ms | Mrows/s | GB/s |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {x['dim']} | {x['rows']} | {x['path']} | {x['ms']:.3f} | {x['rows_s'] / 1e6:.2f} | {x['gb_s']:.1f} |"
        for x in p["flush"]
    ]
    lines += [
        "",
        f"## Gate stall per step: ranks sharing one GPU, DLRM-like step, tables {TABLE_ROWS} x dim {DIM}, Zipf 1.2, cache 5%",
        "",
        "Means over timed steps, averaged over ranks. Exchange wait: apply_gradients waiting for every rank's gradients.",
        "",
        "| ranks | batch/rank | L | host path | step ms | gate wait ms (mean / p90) | stall | exchange wait ms | rows flushed/step | hit ratio |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['world']} | {r['batch']} | {r['lookahead']} | {r['host_path']} | {r['step_ms_mean']:.2f} | "
        f"{r['gate_wait_ms_mean']:.3f} / {r['gate_wait_ms_p90']:.3f} | {100 * r['gate_stall_fraction']:.1f}% | "
        f"{r['exchange_wait_ms_mean']:.2f} | {r['rows_flushed_per_step']:.0f} | {r['cache_hit_ratio']:.2f} |"
        for r in results["gate"]
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write measurements here")
    ap.add_argument("--quick", action="store_true", help="smaller tables and fewer steps (a smoke run)")
    ap.add_argument("--gather-rows", type=int, default=1 << 20)
    ap.add_argument("--render", help="a JSON this script wrote: format it as markdown")
    ap.add_argument("--tests", help="with --render: tab-separated suite and result lines")
    ap.add_argument("--md", help="with --render: write the markdown here")
    args = ap.parse_args()
    if args.render:
        text = render(json.loads(Path(args.render).read_text()), args.tests)
        Path(args.md).write_text(text)
        print(text)
        return
    if not torch.cuda.is_available():
        sys.exit("bench_gpu.py needs CUDA")
    quick = args.quick
    results: Dict[str, Any] = {"facts": _gpu_facts()}
    results["paths"] = bench_paths(
        table_bytes=(1 << 28) if quick else (1 << 30),
        n_rows=(1 << 16) if quick else args.gather_rows,
        dims=[32, 128],
        reps=5 if quick else 20,
    )
    print(json.dumps(results["paths"], indent=1), flush=True)
    modes = [
        {"lookahead": 10, "host_path": "zero_copy"},
        {"lookahead": 10, "host_path": "pinned"},
        {"lookahead": 0, "host_path": "zero_copy"},
    ]
    steps, warmup = (30, 5) if quick else (200, 20)
    results["gate"] = []
    for world in (2, 4):
        results["gate"] += bench_gate(world, modes, steps=steps, batch=4096, warmup=warmup)
        print(json.dumps(results["gate"][-len(modes):], indent=1), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
