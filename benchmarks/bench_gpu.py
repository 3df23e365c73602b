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
* reads: the host reads of a training step from a table of about 4 GiB (dim 32): 16k, 64k, 256k
  and 1M Zipf(1.2) ids per step over permuted rows, duplicates included, as batches have them;
  per path, in the old order (every id read where it stands) and the engine's order (each
  distinct row once, in row order, then expanded on the device: ``plan_lookup(sorted_reads)``,
  host-side planning included in the time). Reported as GB/s of distinct rows, with the
  calibration ``host_path="auto"`` made on this machine.
* gate: 2 and 4 ranks sharing the GPU (gloo) train a DLRM-like step (lookup, an MLP forward and
  backward on the device, row gradients, apply_gradients) on Zipf(1.2) ids; per step the engine's
  own metrics give the gate wait, the gradient-exchange wait, the step time and the training
  thread's engine time by phase (``StepMetrics.phase_s``; dense = step minus engine minus waits),
  for L=10 on both host paths and for write-through (L=0).

* dlrm: the DLRM example (``examples/dlrm/train.py --sharder frugal``, TorchRec on the GPU,
  synthetic criteo-kaggle at ``--dlrm-scale``, dim 32, batches made by ``--loader-workers 2``) with
  1, 2 and 4 ranks sharing the GPU, per ``--dlrm-runs`` entry ``RANKSxBATCHxL``: samples/s, gate
  stall, exchange wait, the engine's per-phase time per step and the rate per 50 steps (its
  swings). Needs TorchRec importable.

``--suites`` picks among ``paths`` (the gather and flush figures above), ``reads``, ``gate`` and
``dlrm``.

Wall times are read after ``torch.cuda.synchronize()``; ``--render`` only formats a JSON this
script wrote, with the test results that scripts/device_check.sh recorded.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, Iterable, List, Sequence

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a script: `benchmarks`, `examples`, and `torchrec_frugal` where no installed one wins
    sys.path.append(str(ROOT))

from torchrec_frugal.host import shm  # noqa: E402
from torchrec_frugal.config import FrugalConfig, OptimizerSpec, TableSpec  # noqa: E402
from torchrec_frugal.engine.host_tables import HostTables  # noqa: E402
from torchrec_frugal.engine.lookup_plan import plan_lookup  # noqa: E402
from torchrec_frugal.engine.streams import Streams  # noqa: E402
from torchrec_frugal.engine.frugal_engine import FrugalEngine  # noqa: E402
from torchrec_frugal.metrics import PHASES  # noqa: E402
from torchrec_frugal.host.launch import run_ranks  # noqa: E402
from torchrec_frugal.estimate.timing import median_s  # noqa: E402
from torchrec_frugal.synthetic_ids import ZipfWorkload  # noqa: E402


# ---------------------------------------------------------------------------------------------- host table
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
            "zero_copy": median_s(lambda: zc.read("weights", rows, rows_dev), reps, sync=torch.cuda.synchronize),
            "pinned": median_s(lambda: pinned.read("weights", rows), reps, sync=torch.cuda.synchronize),
            "device": median_s(lambda: on_device.index_select(0, rows_dev), reps, sync=torch.cuda.synchronize),
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

            t = median_s(one_flush, reps, sync=torch.cuda.synchronize)
            flush.append({"dim": dim, "rows": n_rows, "path": path, "ms": t * 1e3, "rows_s": n_rows / t, "gb_s": nbytes / t / 1e9})
        assert torch.equal(seg["weights"][uniq[:100]], src[:100].cpu()), "flush did not land in host memory"
        zc.close()
        pinned.close()
        gather.append({"dim": dim, "rows": rows_total, "path": "register", "ms": register_s * 1e3, "gb_s": rows_total * dim * 4 / register_s / 1e9})
        del on_device
        torch.cuda.empty_cache()
    return {"table_bytes": table_bytes, "gather": gather, "flush": flush}


# ---------------------------------------------------------------------------------------------- step reads
def bench_reads(table_bytes: int, dim: int, counts: List[int], reps: int) -> Dict[str, Any]:
    """Host reads of a step's ids, per path, as they stand and as the engine orders them."""
    dev = torch.device("cuda", torch.cuda.current_device())
    rows_total = table_bytes // (dim * 4)
    seg = _host_table(rows_total, dim)
    tables = {"weights": seg["weights"]}
    paths = {"zero_copy": HostTables(tables, seg.base, dev, "zero_copy", seg),
             "pinned": HostTables(tables, seg.base, dev, "pinned", seg)}
    no_cache = np.full(rows_total, -1, dtype=np.int64)
    perm = np.random.default_rng(0).permutation(rows_total)
    out: List[Dict[str, Any]] = []
    for n in counts:
        ids = perm[(np.random.default_rng(n).zipf(1.2, n) - 1) % rows_total]
        distinct = int(np.unique(ids).shape[0])
        rows = torch.from_numpy(ids)
        rows_dev = rows.to(dev)
        want = seg["weights"][rows[:1000]]
        for path, ht in paths.items():

            def as_is(ht: HostTables = ht) -> torch.Tensor:
                return ht.read("weights", rows, rows_dev)

            def ordered(ht: HostTables = ht) -> torch.Tensor:
                plan = plan_lookup(no_cache, 0, ids, sorted_reads=True)
                _, _, _, host_rows, expand = plan.parts(plan.packed.to(dev, non_blocking=True))
                got = ht.read("weights", plan.parts()[3], host_rows)
                return got.index_select(0, expand) if plan.n_expand else got

            for order, fn in (("as_is", as_is), ("distinct_sorted", ordered)):
                assert torch.equal(fn()[:1000].cpu(), want), f"{path} {order} read wrong rows"
                t = median_s(fn, reps, sync=torch.cuda.synchronize)
                out.append({"ids": n, "distinct": distinct, "path": path, "order": order, "ms": t * 1e3,
                            "gb_s_distinct": distinct * dim * 4 / t / 1e9})
    zc = paths["zero_copy"]
    zc.calibrate()  # what host_path="auto" measures at start-up (one registration per range)
    for ht in paths.values():
        ht.close()
    return {"table_bytes": rows_total * dim * 4, "dim": dim, "reads": out, "calibration": zc.calibration,
            "path_by_size": zc.path_by_size}


# ---------------------------------------------------------------------------------------------- gate stall
TABLE_ROWS = [1_000_000, 500_000, 200_000, 100_000]
DIM = 32


def _gate_rank(rank: int, world: int, mode: Dict[str, Any], steps: int, batch: int, warmup: int) -> Dict[str, float]:
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    wl = ZipfWorkload(TABLE_ROWS, batch, s=1.2, seed=0)
    tables = [TableSpec(f"t{i}", n, DIM) for i, n in enumerate(TABLE_ROWS)]
    cfg = FrugalConfig(lookahead=mode["lookahead"], cache_ratio=0.05, host_path=mode["host_path"], timeout_s=120,
                       flush_workers=mode.get("flush_workers"))  # fmt: skip
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
    phases = {k: 0.0 for k in PHASES}
    wall0 = time.perf_counter()
    for s in range(total):
        if s == warmup:
            wall0 = time.perf_counter()
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
        for m in eng.take_metrics():  # the steps whose update finished (the exchange worker may lag one)
            if m.step >= warmup:
                per_step.append((m.gate_wait_s, m.exchange_wait_s, m.step_time_s, m.rows_flushed, m.cache_hit_ratio))
                for k in PHASES:
                    phases[k] += m.phase_s[k]
    eng.drain()
    for m in eng.take_metrics():
        per_step.append((m.gate_wait_s, m.exchange_wait_s, m.step_time_s, m.rows_flushed, m.cache_hit_ratio))
        for k in PHASES:
            phases[k] += m.phase_s[k]
    torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - wall0) / steps * 1e3
    eng.flush()
    eng.close()
    a = np.array(per_step)
    engine_ms = {f"{k}_ms": v / len(per_step) * 1e3 for k, v in phases.items()}
    waits_ms = (a[:, 0].mean() + a[:, 1].mean()) * 1e3
    return {
        **engine_ms,
        "wall_ms_per_step": float(wall_ms),
        "dense_ms": float(wall_ms - waits_ms - sum(engine_ms.values())),
        "gate_wait_ms_mean": float(a[:, 0].mean() * 1e3),
        "gate_wait_ms_p90": float(np.percentile(a[:, 0], 90) * 1e3),
        "exchange_wait_ms_mean": float(a[:, 1].mean() * 1e3),
        "step_ms_mean": float(a[:, 2].mean() * 1e3),
        "gate_stall_fraction": float(a[:, 0].sum() / a[:, 2].sum()),
        "rows_flushed_per_step": float(a[:, 3].mean()),
        "cache_hit_ratio": float(a[:, 4].mean()),
    }


def _gate_modes(rank: int, world: int, modes: List[Dict[str, Any]], steps: int, batch: int, warmup: int) -> List[Dict[str, float]]:
    """This rank's figures of every mode, in one process group."""
    return [_gate_rank(rank, world, m, steps, batch, warmup) for m in modes]


def bench_gate(world: int, modes: List[Dict[str, Any]], steps: int, batch: int, warmup: int) -> List[Dict[str, Any]]:
    by_rank = run_ranks(world, _gate_modes, modes, steps, batch, warmup, timeout=600, pg_timeout_s=300)
    rows = []
    for i, m in enumerate(modes):
        per_rank = [by_rank[r][i] for r in range(world)]
        avg = {k: float(np.mean([pr[k] for pr in per_rank])) for k in per_rank[0]}
        rows.append({"world": world, "batch": batch, "steps": steps, **m, **avg})
    return rows


# ---------------------------------------------------------------------------------------------- DLRM example
DLRM_RUNS = "1x4096x10,2x4096x10,2x4096x0,4x4096x10,4x4096x0,1x1024x10,2x1024x10,2x1024x0,4x1024x10,4x1024x0"


def bench_dlrm(runs: str, scale: float, steps: int) -> List[Dict[str, Any]]:
    """The DLRM example on this GPU, one run per ``RANKSxBATCHxL`` entry, in the order given."""
    from examples.demo import find_train_script, run_train

    train_py = find_train_script(str(ROOT / "examples" / "dlrm" / "train.py"))
    out = []
    for spec in runs.split(","):
        nproc, batch, lookahead = (int(x) for x in spec.split("x"))
        args = ["--sharder", "frugal", "--scale", str(scale), "--batch-size", str(batch), "--lookahead", str(lookahead),
                "--steps", str(steps), "--warmup", "20", "--log-every", "50", "--loader-workers", "2"]
        print(f"== dlrm {spec}", flush=True)
        s = run_train(train_py, args, nproc=nproc, threads=max(1, (os.cpu_count() or 2) // (2 * nproc)),
                      echo=lambda line: print("   ", line, flush=True), timeout_s=600)
        rates = [i["samples_per_second"] for i in s["intervals"]]
        out.append({
            "ranks": nproc, "batch": batch, "lookahead": lookahead, "rows": s["rows"], "steps": s["steps"],
            "samples_per_second": s["samples_per_second"], "gate_stall_fraction": s["gate_stall_fraction"],
            "exchange_wait_fraction": s["frugal"]["exchange_wait_fraction"],
            "engine_ms_per_step": s["frugal"]["engine_ms_per_step"], "step_ms": 1e3 * nproc * batch / s["samples_per_second"],
            "rate_min": min(rates), "rate_max": max(rates), "intervals": s["intervals"],
            "cache_hit_ratio": s["frugal"]["cache_hit_ratio"], "loss": s["loss"], "setup_s": s["setup_s"],
        })
    return out


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
    for path in tests_tsv.split(","):  # one table of suites per device call
        for line in Path(path).read_text().splitlines():
            name, summary = line.split("\t", 1)
            lines.append(f"| {name} | {summary} |")
    if "reads" in results:
        lines += _render_reads(results["reads"])
    if "paths" in results:
        lines += _render_paths(results["paths"])
    if "gate" in results:
        lines += _render_gate(results["gate"])
    if "dlrm" in results:
        lines += _render_dlrm(results["dlrm"])
    return "\n".join(lines) + "\n"


def _md_table(intro: Sequence[str], columns: Sequence[str], rows: Iterable[Sequence[str]]) -> List[str]:
    """A section of the report: a blank line, the ``intro`` lines, a blank line, then a markdown table."""
    return ["", *intro, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns),
            *("| " + " | ".join(r) + " |" for r in rows)]  # fmt: skip


def _render_dlrm(runs: List[Dict[str, Any]]) -> List[str]:
    return _md_table(
        [f"## The DLRM example on this GPU: synthetic criteo-kaggle ({runs[0]['rows']:,} rows, dim 32), ranks sharing the GPU",
         "",
         "samples/s of all ranks after 20 warm-up steps; step = batch x ranks / rate; engine = the training thread's time",
         "in the engine per step, by phase (the rest of a step: the model, TorchRec's pipeline and the waits);",
         "rate min-max over 50-step intervals (the swings)."],
        ["ranks", "batch/rank", "L", "samples/s", "step ms", *PHASES, "gate stall", "exchange wait", "rate min-max", "hit ratio"],
        ([str(r["ranks"]), str(r["batch"]), str(r["lookahead"]), f"{r['samples_per_second']:,.0f}", f"{r['step_ms']:.2f}",
          *(f"{r['engine_ms_per_step'].get(k, 0.0):.2f}" for k in PHASES), f"{100 * r['gate_stall_fraction']:.1f}%",
          f"{100 * r['exchange_wait_fraction']:.0f}%", f"{r['rate_min']:,.0f}-{r['rate_max']:,.0f}", f"{r['cache_hit_ratio']:.2f}"]
         for r in runs),
    )  # fmt: skip


def _render_reads(r: Dict[str, Any]) -> List[str]:
    reads = _md_table(
        [f"## Host reads of a step: Zipf(1.2) ids from a {r['table_bytes'] / 2**30:.1f} GiB table, dim {r['dim']}",
         "",
         "`as_is`: every id read where it stands (duplicates and all). `distinct_sorted`: each distinct row once, in",
         "row order, then expanded on the device (the engine's order; host-side planning included). GB/s of distinct",
         "rows."],
        ["ids", "distinct", "path", "order", "ms", "GB/s (distinct)"],
        ([str(x["ids"]), str(x["distinct"]), x["path"], x["order"], f"{x['ms']:.3f}", f"{x['gb_s_distinct']:.1f}"]
         for x in r["reads"]),
    )  # fmt: skip
    calibration = _md_table(
        ["Calibration of `host_path=\"auto\"` on this machine (ms per call; the faster path is used at that size):"],
        ["rows", "read zero_copy", "read pinned", "write zero_copy", "write pinned"],
        ([str(int(c["rows"])), *(f"{c[k] * 1e3:.3f}" for k in ("read_zero_copy_s", "read_pinned_s", "write_zero_copy_s", "write_pinned_s"))]
         for c in r["calibration"]),
    )  # fmt: skip
    return reads + calibration


def _render_paths(p: Dict[str, Any]) -> List[str]:
    gather = _md_table(
        [f"## Host reads: gather of random rows from a {p['table_bytes'] / 2**30:.1f} GiB table",
         "",
         "`zero_copy`: one index_select kernel on the mapped host table (reads over PCIe). `pinned`: host gather into",
         "page-locked memory, then one asynchronous copy. `device`: the same table in device memory (ceiling).",
         "`register`: cudaHostRegister of the whole table (once per engine)."],
        ["dim", "rows", "path", "ms", "GB/s"],
        ([str(g["dim"]), str(g["rows"]), g["path"], f"{g['ms']:.3f}", f"{g['gb_s']:.1f}"] for g in p["gather"]),
    )  # fmt: skip
    flush = _md_table(
        ["## Flushes: distinct rows from device memory to the host table, on the flush stream"],
        ["dim", "rows", "path", "ms", "Mrows/s", "GB/s"],
        ([str(x["dim"]), str(x["rows"]), x["path"], f"{x['ms']:.3f}", f"{x['rows_s'] / 1e6:.2f}", f"{x['gb_s']:.1f}"]
         for x in p["flush"]),
    )  # fmt: skip
    return gather + flush


def _flushers(row: Dict[str, Any]) -> str:
    """A gate row's flusher threads: the engine's default on CUDA (1) unless the mode set them."""
    n = row.get("flush_workers")
    return "1 (default)" if n is None else str(n)


def _render_gate(gate: List[Dict[str, Any]]) -> List[str]:
    stall = _md_table(
        [f"## Gate stall per step: ranks sharing one GPU, DLRM-like step, tables {TABLE_ROWS} x dim {DIM}, Zipf 1.2, cache 5%",
         "",
         "Means over timed steps, averaged over ranks. Exchange wait: apply_gradients waiting for every rank's gradients."],
        ["ranks", "batch/rank", "L", "host path", "flusher threads", "step ms", "gate wait ms (mean / p90)", "stall",
         "exchange wait ms", "rows flushed/step", "hit ratio"],
        ([str(r["world"]), str(r["batch"]), str(r["lookahead"]), r["host_path"], _flushers(r), f"{r['step_ms_mean']:.2f}",
          f"{r['gate_wait_ms_mean']:.3f} / {r['gate_wait_ms_p90']:.3f}", f"{100 * r['gate_stall_fraction']:.1f}%",
          f"{r['exchange_wait_ms_mean']:.2f}", f"{r['rows_flushed_per_step']:.0f}", f"{r['cache_hit_ratio']:.2f}"]
         for r in gate),
    )  # fmt: skip
    split = _md_table(
        ["Where a step's time goes (ms per step, training thread): the engine's phases from `StepMetrics.phase_s`,",
         "the two waits, and dense = wall time per step minus all of those (the model's forward and backward)."],
        ["ranks", "L", "host path", "flusher threads", "wall ms", *PHASES, "gate wait", "exchange wait", "dense"],
        ([str(r["world"]), str(r["lookahead"]), r["host_path"], _flushers(r), f"{r['wall_ms_per_step']:.2f}",
          *(f"{r[k + '_ms']:.2f}" for k in PHASES), f"{r['gate_wait_ms_mean']:.2f}", f"{r['exchange_wait_ms_mean']:.2f}",
          f"{r['dense_ms']:.2f}"]
         for r in gate),
    )  # fmt: skip
    return stall + split


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write measurements here")
    ap.add_argument("--quick", action="store_true", help="smaller tables and fewer steps (a smoke run)")
    ap.add_argument("--gather-rows", type=int, default=1 << 20)
    ap.add_argument("--suites", default="reads,paths,gate", help="comma-separated: reads, paths, gate, dlrm")
    ap.add_argument("--gate-flush-workers", type=int, action="append", default=[],
                    help="gate suite: also run L=10 zero_copy with this many flusher threads (repeatable; default: the engine's, 1)")
    ap.add_argument("--dlrm-runs", default=DLRM_RUNS, help="dlrm suite: comma-separated RANKSxBATCHxL")
    ap.add_argument("--dlrm-scale", type=float, default=1.0, help="dlrm suite: criteo-kaggle row scale")
    ap.add_argument("--dlrm-steps", type=int, default=150, help="dlrm suite: steps per rank")
    ap.add_argument("--render", help="JSONs this script wrote (comma-separated, e.g. of two device calls): format as markdown")
    ap.add_argument("--tests", help="with --render: files of tab-separated suite and result lines (comma-separated)")
    ap.add_argument("--md", help="with --render: write the markdown here")
    args = ap.parse_args()
    if args.render:
        merged: Dict[str, Any] = {}
        for path in args.render.split(","):
            merged = {**json.loads(Path(path).read_text()), **merged}  # the first call's facts and suites win
        text = render(merged, args.tests)
        Path(args.md).write_text(text)
        print(text)
        return
    if not torch.cuda.is_available():
        sys.exit("bench_gpu.py needs CUDA")
    quick = args.quick
    suites = set(args.suites.split(","))
    results: Dict[str, Any] = {"facts": _gpu_facts()}
    if "reads" in suites:
        results["reads"] = bench_reads(
            table_bytes=(1 << 28) if quick else (1 << 32),
            dim=32,
            counts=[1 << 14, 1 << 16] if quick else [1 << 14, 1 << 16, 1 << 18, 1 << 20],
            reps=5 if quick else 10,
        )
        print(json.dumps(results["reads"], indent=1), flush=True)
    if "paths" in suites:
        results["paths"] = bench_paths(
            table_bytes=(1 << 28) if quick else (1 << 30),
            n_rows=(1 << 16) if quick else args.gather_rows,
            dims=[32, 128],
            reps=5 if quick else 20,
        )
        print(json.dumps(results["paths"], indent=1), flush=True)
    if "dlrm" in suites:
        results["dlrm"] = bench_dlrm(args.dlrm_runs, args.dlrm_scale, 60 if quick else args.dlrm_steps)
        print(json.dumps([{k: v for k, v in r.items() if k != "intervals"} for r in results["dlrm"]], indent=1), flush=True)
    if "gate" not in suites:
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))
        return
    modes = [
        {"lookahead": 10, "host_path": "zero_copy"},
        {"lookahead": 10, "host_path": "pinned"},
        {"lookahead": 0, "host_path": "zero_copy"},
    ] + [{"lookahead": 10, "host_path": "zero_copy", "flush_workers": n} for n in args.gate_flush_workers]
    steps, warmup = (30, 5) if quick else (200, 20)
    results["gate"] = []
    for world in (2, 4):
        results["gate"] += bench_gate(world, modes, steps=steps, batch=4096, warmup=warmup)
        print(json.dumps(results["gate"][-len(modes):], indent=1), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
