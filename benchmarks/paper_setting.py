"""The paper's setting, predicted by the cost model: Frugal against TorchRec on 2, 4 and 8 RTX 3090s on the
paper's DLRM benchmark, how each assumed input of the profile moves the verdict, and the paper's
motivation figures (Figure 3) as the model sees them.

Every figure this script prints or writes is a PREDICTION of ``torchrec_frugal.estimate.cost_model`` on the
shipped hardware profiles (``torchrec_frugal/estimate/profiles/*.json``, sources in ``docs/cost_model.md``).
Nothing is trained or measured. No profile file is changed here: variants are built with
``dataclasses.replace``.

    python benchmarks/paper_setting.py --doc docs/paper_setting.md   # the page, benchmarks/results/paper_setting*
    python benchmarks/paper_setting.py --configs avazu --gpus 8 --batches 1024 --no-plot --no-grid --json one.json

What it predicts (docs/paper_setting.md):

a. Frugal against the best stock choice that fits (table_wise, row_wise, table_row_wise, and TorchRec's
   UVM offloading) on 2, 4 and 8 RTX 3090s (``rtx3090``: the paper's box, PCIe 3.0), on the paper's
   model (one table of the dataset's capacity: avazu, criteo-kaggle, criteo-tb; MLP 32-512-256-1; SGD),
   per-GPU batch 128 and 1024, cache ratios 0.01, 0.05 and 0.1, Frugal's lookahead the best of
   ``LOOKAHEAD_CHOICES``; with what bounds each side's step (``cost_model.bound``) and the terms whose
   difference explains the gap. The same for the MLPerf-style DLRM (``--model dlrm``) as a second table.
   Ids: the synthetic data's Zipf with the real data's tail (every row read once an epoch).
Sensitivity. Each assumed input (``ASSUMPTIONS``: framework time, host link, collectives, Frugal's
   host-thread rates, UVM cache work, the ids' tail) at each end of its stated range: table a's verdicts
   there; and a plot of frugal / best stock over framework time and table size.
b. Figure 3: (i) the effective all-to-all bandwidth of the model's ``Primitives`` on the 3090 box
   against the A30 box (paper: 54%); (ii) the throughput a HugeCTR-style system (TorchRec
   table_wise: table-wise model parallelism with all-to-alls) loses on 3090 against A30 at equal
   GPU counts over the paper's batch sweep 32-4096 (paper: up to 37%). Two variants of (ii):
   "TorchRec as profiled" (the shipped profiles unchanged) and "HugeCTR-style", which changes only
   what distinguishes HugeCTR's training from TorchRec's on these profiles: no Python training loop
   (the framework terms are zero, an assumption) and dense layers on the tensor cores (25% of each
   card's dense TF32 tensor-core peak instead of 25% of its FP32 peak).
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a script: `benchmarks`, `examples`, and `torchrec_frugal` where no installed one wins
    sys.path.append(str(ROOT))

from torchrec_frugal.estimate.cost_model import (  # noqa: E402
    LOOKAHEAD_CHOICES,
    MEMORY_HEADROOM,
    PATH_PARTS,
    TERMS,
    UVM_CHOICES,
    CostModel,
    Plan,
    Primitives,
    CostTable,
    StepCost,
    Workload,
    bound,
    predict_all,
    recommend_frugal,
)
from torchrec_frugal.datasets import BATCH_SIZES, CACHE_RATIOS, PAPER_CAPACITIES, SkewConfig  # noqa: E402
from torchrec_frugal.estimate.cli import PRESAMPLE_STEPS, dlrm_workload  # noqa: E402
from torchrec_frugal.estimate.profiles import UVM_MISS_S, HardwareProfile, load_profile  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
STOCK = ("table_wise", "row_wise", "table_row_wise") + UVM_CHOICES  # FUSED, then TorchRec's offloading
CONFIGS = ("avazu", "criteo-kaggle", "criteo-tb")
GPUS = (2, 4, 8)
SCALE = 1.0  # the paper's datasets: full cardinalities
MODEL = "paper"  # the authors' DLRM benchmark: one table, 21 or 26 ids a sample sum-pooled, MLP 32-512-256-1
HUGECTR = "table_wise"  # a HugeCTR-style system: table-wise model parallelism with all-to-alls
SWEEP_BATCHES = tuple(2**k for k in range(5, 13))  # the motivation's per-GPU batch sweep, 32 to 4096
LOSS_GPUS = (2, 4)  # equal GPU counts on both boxes: the A30 box has 4 GPUs (the A30 runs used 1-4)
A2A_PAIRS = ((2, 2), (4, 4), (8, 4))  # (3090 GPUs, A30 GPUs): equal counts, and each box full
HEADLINE_PAIR = (4, 4)  # the largest count both boxes have
PAPER_A2A_SHARE = 0.54  # Figure 3: all-to-all bandwidth on 3090 is 54% of the datacenter GPU's
PAPER_MAX_LOSS = 0.37  # Figure 3: a HugeCTR-style system loses up to 37% throughput on 3090 against A30
TOLERANCE = 0.25  # "within 25% of the paper's figure": |model / paper - 1| <= 0.25
REAL_DATA = True  # the datasets' real ids: their tail reads every row once an epoch (CostTable.tail_rate)
PAPER_LOOKAHEAD = 10  # the authors' L
HEADLINE = ("criteo-tb", 8, 1024, 0.05)  # (config, GPUs, batch per GPU, cache ratio) of the sensitivity table
GRID_CONFIG, GRID_CACHE_RATIO = "criteo-tb", 0.05  # the plot of where Frugal wins: criteo-tb's table, scaled
GRID_FRAMEWORK_MS = tuple(float(x) for x in range(0, 9))  # framework time per step, 0-8 ms
GRID_SCALES = tuple(float(x) for x in np.round(np.logspace(-2, 1, 10), 4))  # 0.01-10x criteo-tb's 73.4M rows
GRID_PANELS = ((2, 1024), (8, 128), (8, 1024))  # (GPUs, batch per GPU)
A2A_TERMS = ("input_all_to_all", "output_all_to_all")
REGENERATE = "python benchmarks/paper_setting.py --doc docs/paper_setting.md"  # the page, its JSON and figures
PROBE_BYTES = 64 * 2**20  # message size at which the all-to-all's bandwidth term is read off
MESSAGE_BYTES = 2**20  # bytes per rank of the latency-included share (table_wise's output all-to-all of
# criteo-kaggle sends 0.3 MiB per rank at batch 128 on 4 GPUs, 2.4 MiB at batch 1024)

# b(ii), HugeCTR-style variant (docs/paper_setting.md). HugeCTR trains from a C++ loop (the Python API
# only drives it) and runs its dense layers through cuBLAS with TF32 or mixed precision on Ampere (the
# solver's enable_tf32_compute / use_mixed_precision options; NVIDIA-Merlin/HugeCTR).
HUGECTR_STYLE = "HugeCTR-style"
AS_PROFILED = "TorchRec as profiled"
FRAMEWORK_FIELDS = ("framework_step_s", "framework_id_s", "framework_dist_step_s")  # zero: no Python loop (assumption)
TF32_TENSOR_PEAK = {  # dense TF32 tensor-core peak, FLOP/s, without 2:4 sparsity (with it: twice that)
    "rtx3090": 35.6e12,  # NVIDIA Ampere GA102 whitepaper, GeForce RTX 3090: 35.6 TFLOPS (71 with sparsity)
    "a30": 82e12,  # NVIDIA A30 datasheet: 82 TFLOPS (165 with sparsity)
}
FP32_PEAK = {"rtx3090": 35.58e12, "a30": 10.32e12}  # the FP32 (non-tensor) peaks the shipped profiles take 25% of
DENSE_EFFICIENCY = 0.25  # the share of peak the shipped profiles assume for small MLPs (docs/cost_model.md)
SENSITIVITY_EFFICIENCIES = (0.125, 0.25, 0.5, 1.0)  # diagnostic: the variant with another share of the TF32 peak


# ---------------------------------------------------------------------------- helpers
def term_vector(cost: StepCost) -> np.ndarray:
    """The step's terms in ``TERMS`` order (seconds)."""
    return np.array([cost.terms[t] for t in TERMS])


def largest_gaps(a: StepCost, b: StepCost, k: int = 3, floor_s: float = 5e-6) -> List[Tuple[str, float]]:
    """The ``k`` terms of largest |a - b| (ms, a - b), largest first; terms that differ by less than
    ``floor_s`` (0.005 ms: below the table's precision) are left out."""
    diff = term_vector(a) - term_vector(b)
    order = np.argsort(-np.abs(diff), kind="stable")[:k]
    return [(TERMS[i], 1e3 * float(diff[i])) for i in order if abs(diff[i]) >= floor_s]


def best_stock(costs: Dict[str, StepCost]) -> Optional[str]:
    """The fastest stock sharding that fits in device memory (first of ``STOCK`` on ties); None if none fits."""
    fitting = [s for s in STOCK if s in costs and costs[s].fits]
    if not fitting:
        return None
    top = max(costs[s].samples_per_second for s in fitting)
    # within 0.1% of the fastest: the first in STOCK order (FUSED before offloading, as _better decides)
    return next(s for s in fitting if costs[s].samples_per_second >= top * (1 - 1e-3))


def within(model: float, paper: float, tolerance: float = TOLERANCE) -> Tuple[float, bool]:
    """(model / paper - 1, whether it is within ``tolerance``)."""
    rel = model / paper - 1.0
    return rel, bool(abs(rel) <= tolerance)


def gib(nbytes: float) -> float:
    return nbytes / 2**30


def shown(path: Path) -> str:
    """``path`` relative to the checkout when it lies in it."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


# ---------------------------------------------------------------------------- a. the 3090 table
def workload(config: str, gpus: int, batch: int, model: str = MODEL, scale: float = SCALE,
             presample_steps: int = PRESAMPLE_STEPS, real_data: bool = REAL_DATA) -> Workload:
    """One point's workload: the DLRM example's (``dlrm_workload``) on the real data's ids by default."""
    return dlrm_workload(config, gpus, batch, scale, model, presample_steps=presample_steps, real_data=real_data)


def comparison(
    hw: HardwareProfile,
    configs: Sequence[str] = CONFIGS,
    gpus: Sequence[int] = GPUS,
    batches: Sequence[int] = BATCH_SIZES,
    cache_ratios: Sequence[float] = CACHE_RATIOS,
    lookaheads: Sequence[int] = LOOKAHEAD_CHOICES,
    model: str = MODEL,
    scale: float = SCALE,
    presample_steps: int = PRESAMPLE_STEPS,
    real_data: bool = REAL_DATA,
) -> List[Dict[str, Any]]:
    """One row per (config, GPUs, batch per GPU, cache ratio): Frugal with the best lookahead against
    the best stock choice that fits (predicted samples/s, their ratio, what bounds each step, the
    largest term gaps); also Frugal at the paper's L = 10."""
    cm = CostModel(hw)
    rows: List[Dict[str, Any]] = []
    for config, n, batch in itertools.product(configs, gpus, batches):
        w = workload(config, n, batch, model, scale, presample_steps, real_data)
        stock = predict_all(cm, w, shardings=STOCK if hw.device == "cuda" else STOCK[:3])  # independent of Frugal's
        best = best_stock(stock)
        for c in cache_ratios:
            plan, fr = recommend_frugal(cm, w, cache_ratios=(c,), lookaheads=lookaheads)
            at_l = fr if plan.lookahead == PAPER_LOOKAHEAD else cm.predict(w, Plan("frugal", c, PAPER_LOOKAHEAD))
            ref = stock[best] if best else None
            rows.append({
                "config": config, "gpus": n, "batch_per_gpu": batch, "cache_ratio": c, "lookahead": plan.lookahead,
                "rows": sum(t.rows for t in w.tables),
                "frugal_samples_per_second": fr.samples_per_second, "frugal_fits": fr.fits,
                "frugal_memory_gib_per_gpu": gib(fr.memory_bytes_per_device),
                "frugal_cache_hit_ratio": fr.details["cache_hit_ratio"],
                "stock": best, "stock_samples_per_second": ref.samples_per_second if ref else None,
                "ratio": fr.samples_per_second / ref.samples_per_second if ref else None,
                "ratio_at_paper_lookahead": at_l.samples_per_second / ref.samples_per_second if ref else None,
                "stock_step_s": ref.step_s if ref else None,
                "stock_uvm_load_factor": ref.details.get("uvm_load_factor") if ref else None,
                "frugal_bound": bound(fr).to_json(), "stock_bound": bound(ref).to_json() if ref else None,
                "frugal_variants_s": design_variants(fr),
                "gaps_ms": largest_gaps(fr, ref) if ref else [],
                "frugal_terms_ms": {t: 1e3 * v for t, v in fr.terms.items() if v},
                "stock_terms_ms": {t: 1e3 * v for t, v in ref.terms.items() if v} if ref else {},
                "stock_all": {s: {"samples_per_second": x.samples_per_second, "fits": x.fits,
                                  "memory_gib_per_gpu": gib(x.memory_bytes_per_device)} for s, x in stock.items()},
            })  # fmt: skip
    return rows


def verdict_summary(rows: Sequence[Dict[str, Any]], headline: Tuple[str, int, int, float] = HEADLINE) -> Dict[str, Any]:
    """The verdicts of a table a: the range of frugal / best stock, how many rows Frugal wins, and the
    headline row's ratio, best stock choice and both bounds."""
    ratios = np.array([r["ratio"] for r in rows if r["ratio"] is not None])
    keyed = [r for r in rows if r["ratio"] is not None]
    head = next((r for r in keyed if (r["config"], r["gpus"], r["batch_per_gpu"], r["cache_ratio"]) == tuple(headline)),
                keyed[-1] if keyed else None)  # the table's last compared row where it lacks the headline's  # fmt: skip
    return {
        "rows": len(rows), "compared": int(ratios.size), "frugal_only": sum(r["stock"] is None for r in rows),
        "ratio_min": float(ratios.min()) if ratios.size else None,
        "ratio_max": float(ratios.max()) if ratios.size else None,
        "wins": int((ratios > 1.0).sum()),
        "headline": None if head is None else {
            "config": head["config"], "gpus": head["gpus"], "batch_per_gpu": head["batch_per_gpu"],
            "cache_ratio": head["cache_ratio"], "ratio": head["ratio"], "stock": head["stock"], "lookahead": head["lookahead"],
            "frugal_bound": head["frugal_bound"], "stock_bound": head["stock_bound"]},
    }  # fmt: skip


# ---------------------------------------------------------------------------- the assumptions
class Assumption(NamedTuple):
    """One assumed input of the 3090 profile: the fields it sets, its value in the profile, the ends
    of its range (in ``unit``), and where each figure comes from. ``kind`` says how a value becomes a
    profile: ``set`` puts it in every field; ``scale`` multiplies every field by value / base (the
    host-read curve and write rate move with the link); ``multiply`` multiplies every field by the
    value; ``data`` is no profile field but the ids."""

    key: str
    label: str
    fields: Tuple[str, ...]
    unit: str
    per_unit: float  # profile units (seconds, bytes/s) per ``unit``
    low: float
    high: float
    kind: str
    source: str

    def base(self, hw: HardwareProfile) -> float:
        """The profile's value, in ``unit`` (the first field's; 1.0 for ``data``, the real ids, and for
        ``multiply``, the profile's rates)."""
        return 1.0 if self.kind in ("data", "multiply") else getattr(hw, self.fields[0]) / self.per_unit

    def apply(self, hw: HardwareProfile, value: float) -> HardwareProfile:
        """``hw`` with this input at ``value`` (in ``unit``), every other field as it is (``dataclasses.replace``)."""
        if self.kind == "data":
            return hw
        if self.kind == "set":
            return dataclasses.replace(hw, **{f: value * self.per_unit for f in self.fields})
        k = value / self.base(hw)
        changes: Dict[str, Any] = {}
        for f in self.fields:
            v = getattr(hw, f)
            changes[f] = [(r, bw * k) for r, bw in v] if f == "host_read_sorted" else v * k
        return dataclasses.replace(hw, **changes)


MS, US, NS, GBS = 1e-3, 1e-6, 1e-9, 1e9
LINK_FIELDS = ("h2d_bw", "d2h_bw", "host_read_random_bw", "host_read_sorted", "host_write_bw")
EXCHANGE_FIELDS = ("exchange_step_s", "exchange_row_s", "lookahead_row_s")
ASSUMPTIONS: Tuple[Assumption, ...] = (
    Assumption("framework_step_s", "framework time per step", ("framework_step_s",), "ms", MS, 1.0, 7.9, "set",
               "assumed 3 ms (rtx3090.json; never measured on a GPU). Low: a lean loop; high: the cpu profile's "
               "fit to the training loop on the development machine (7.9 ms, docs/cost_model.md)"),
    Assumption("framework_id_s", "framework time per id", ("framework_id_s",), "ns", NS, 0.0, 480.0, "set",
               "assumed 50 ns. Low: none; high: the development machine's stage-2 fit (0.48 us, docs/cost_model.md)"),
    Assumption("host_link", "host link (PCIe)", LINK_FIELDS, "GB/s", GBS, 6.0, 13.0, "scale",
               "12 GB/s: PCIe 3.0 x16 (15.75 GB/s theoretical) of the Xeon Gold 6130; host reads and writes "
               "move with it (the H200's measured rates x link / 55.3). Low: two GPUs behind one x16 switch "
               "uplink; high: the best pinned copies PCIe 3.0 x16 reaches"),
    Assumption("collective_bw", "all-to-all / all-reduce bandwidth without P2P", ("a2a_bw", "allreduce_bw"),
               "GB/s", GBS, 6.0, 12.0, "set",
               "assumed 12 GB/s. Low: PCIe 3.0 link / 2 (every byte crosses PCIe twice, staged through host); "
               "high: one link's worth (the two crossings use the two directions of full-duplex links)"),
    Assumption("collective_latency", "all-to-all / all-reduce latency per peer", ("a2a_latency_s", "allreduce_latency_s"),
               "us", US, 10.0, 100.0, "set",
               "assumed 20 us (NCCL per peer). High: NCCL's shared-memory path through a proxy thread "
               "without P2P; the h200 profile assumes 50 us for gloo"),
    Assumption("exchange_worker", "Frugal's exchange worker rates", EXCHANGE_FIELDS, "x", 1.0, 0.5, 2.4, "multiply",
               "measured on the development machine's CPU by benchmarks/refit_host_rates.py (the profile's "
               "extra.host_thread_rates), not on the Xeon Gold 6130 (2.1-3.7 GHz). High: 2.4x, the most the planner's CPU in the example exceeded its fit "
               "(docs/cost_model.md); low: a core twice as fast"),
    Assumption("planner_id_s", "Frugal's planner rate per id", ("planner_id_s",), "ns", NS, 19.5, 94.0, "set",
               "fitted on the development machine (39 ns, benchmarks/time_plan.py). Low: half; high: 2.4x "
               "(its CPU in the example, cold caches beside the step)"),
    Assumption("frugal_train_thread_s", "Frugal's work on the training thread", ("frugal_train_thread_s",), "ms", MS,
               0.25, 1.2, "set",
               "measured on the development machine (0.48-0.53 ms, benchmarks/time_dlrm_calls.py). Low: half; high: 2.4x"),
    Assumption("uvm_miss_s", "UVM cache work per miss", ("uvm_miss_s",), "ns", NS, 1.0, 20.0, "set",
               "assumed 5 ns (UVM_MISS_S: FBGEMM's sort by cache set and lru_cache_insert per miss). Low: the "
               "row's copy into the cache alone; high: a warp's serial insert per miss"),
    Assumption("data_tail", "the ids' tail", (), "", 1.0, 0.0, 1.0, "data",
               "the real data reads every row once an epoch (1); 0: the synthetic Zipf ids alone, whose tail "
               "leaves most of a large table unread"),
)
"""Every assumed input of the 3090 profile that can move a verdict, with its range and sources
(docs/paper_setting.md, "Sensitivity")."""


def assumed_profile(hw: HardwareProfile) -> HardwareProfile:
    """``hw`` with every optional field the assumptions vary set to the value the model uses."""
    return hw if hw.uvm_miss_s is not None else dataclasses.replace(hw, uvm_miss_s=UVM_MISS_S)


def sensitivity(
    hw: HardwareProfile,
    base_rows: Sequence[Dict[str, Any]],
    assumptions: Sequence[Assumption] = ASSUMPTIONS,
    configs: Sequence[str] = CONFIGS,
    gpus: Sequence[int] = GPUS,
    batches: Sequence[int] = BATCH_SIZES,
    cache_ratios: Sequence[float] = CACHE_RATIOS,
    model: str = MODEL,
    presample_steps: int = PRESAMPLE_STEPS,
) -> List[Dict[str, Any]]:
    """Table a recomputed with each assumption at each end of its range, the others as profiled: the
    verdicts there (:func:`verdict_summary`) beside the profile's."""
    hw = assumed_profile(hw)
    base = verdict_summary(base_rows)
    out = []
    for a in assumptions:
        ends = {}
        for end, value in (("low", a.low), ("high", a.high)):
            real = bool(value) if a.kind == "data" else REAL_DATA
            rows = comparison(a.apply(hw, value), configs, gpus, batches, cache_ratios, model=model,
                              presample_steps=presample_steps, real_data=real)  # fmt: skip
            ends[end] = {"value": value, **verdict_summary(rows)}
        out.append({"key": a.key, "label": a.label, "fields": list(a.fields), "unit": a.unit, "kind": a.kind,
                    "source": a.source, "profile": a.base(hw), "base": base, **ends})  # fmt: skip
    return out


def best_case(hw: HardwareProfile, sens: Sequence[Dict[str, Any]], assumptions: Sequence[Assumption] = ASSUMPTIONS,
              **kw: Any) -> Dict[str, Any]:
    """Every assumption at the end of its range where Frugal fares better (the larger headline ratio)
    at once, and at the other ends at once: the verdicts of the two corners."""
    by_key = {a.key: a for a in assumptions}
    corners: Dict[str, Any] = {}
    for name, pick in (("frugal_best", max), ("frugal_worst", min)):
        prof, real, values = assumed_profile(hw), REAL_DATA, {}
        for row in sens:
            a = by_key[row["key"]]
            end = pick(("low", "high"), key=lambda e: row[e]["headline"]["ratio"] or 0.0)
            values[a.key] = row[end]["value"]
            if a.kind == "data":
                real = bool(row[end]["value"])
            else:
                prof = a.apply(prof, row[end]["value"])
        rows = comparison(prof, real_data=real, **kw)
        corners[name] = {"values": values, **verdict_summary(rows)}
    return corners


def scaled_workload(config: str, gpus: int, batch: int, scale: float, model: str = MODEL,
                    presample_steps: int = PRESAMPLE_STEPS) -> Workload:
    """``workload`` with every table ``scale`` times its full size, above 1 too (a table larger than
    the dataset's: the plot's upper half), ids Zipf(s) by the new size as the synthetic data draws them."""
    w = workload(config, gpus, batch, model, 1.0, presample_steps)
    skew = SkewConfig()
    tables = tuple(CostTable.zipf(t.name, int(np.ceil(scale * t.rows)), t.dim, skew.s_for(int(np.ceil(scale * t.rows))),
                                  t.pooling, t.epoch_draws) for t in w.tables)  # fmt: skip
    return dataclasses.replace(w, tables=tables)


def framework_grid(
    hw: HardwareProfile,
    framework_ms: Sequence[float] = GRID_FRAMEWORK_MS,
    scales: Sequence[float] = GRID_SCALES,
    panels: Sequence[Tuple[int, int]] = GRID_PANELS,
    config: str = GRID_CONFIG,
    cache_ratio: float = GRID_CACHE_RATIO,
    model: str = MODEL,
    presample_steps: int = PRESAMPLE_STEPS,
) -> Dict[str, Any]:
    """frugal / best stock over framework time per step (x) and table size (y, a scale of ``config``'s
    capacity), one panel per (GPUs, batch per GPU); NaN where no stock choice fits (Frugal alone)."""
    hw = assumed_profile(hw)
    out = []
    for n, batch in panels:
        ratio = np.full((len(scales), len(framework_ms)), np.nan)
        stock_fits = np.zeros_like(ratio, dtype=bool)
        for i, s in enumerate(scales):
            w = scaled_workload(config, n, batch, s, model, presample_steps)
            for j, f in enumerate(framework_ms):
                cm = CostModel(dataclasses.replace(hw, framework_step_s=f * MS))
                fr = recommend_frugal(cm, w, cache_ratios=(cache_ratio,))[1]
                stock = predict_all(cm, w, shardings=STOCK)
                best = best_stock(stock)
                if best is not None:
                    stock_fits[i, j] = True
                    ratio[i, j] = fr.samples_per_second / stock[best].samples_per_second
        out.append({"gpus": n, "batch_per_gpu": batch, "stock_fits": stock_fits.tolist(),
                    "ratio": [[None if np.isnan(x) else float(x) for x in r] for r in ratio]})  # fmt: skip
    return {"config": config, "cache_ratio": cache_ratio, "framework_ms": list(framework_ms), "scales": list(scales),
            "rows": [int(np.ceil(s * PAPER_CAPACITIES[config])) for s in scales], "panels": out}  # fmt: skip


# ---------------------------------------------------------------------------- the design question
VARIANTS = ("prefetch host rows", "fp16 host rows", "exchange beside dense backward", "all three")


def design_variants(cost: StepCost) -> Dict[str, float]:
    """Predicted step (seconds) of Frugal variants that are priced, not built, from ``cost``'s terms:

    - "prefetch host rows": a step's host rows are read into the device one step ahead, once the
      plan and the last write of those rows are known: ``host_reads`` leaves the critical path and
      runs beside the rest of the step (only its excess over the rest waits);
    - "fp16 host rows": host rows stored in half precision: half the bytes read (``host_reads``),
      written on the training thread (``flush_inline``) and by the flushers (their excess, ``gate_stall``);
    - "exchange beside dense backward": the gradient exchange overlapped with the dense backward
      (2/3 of ``dense_compute``): the step saves the smaller of the two;
    - "all three" together. ``contention`` is kept as predicted (the work is the same or less).
    """
    t = dict(cost.terms)
    step = sum(t.values())

    def prefetch(t: Dict[str, float]) -> Dict[str, float]:
        rest = sum(t.values()) - t["host_reads"]
        return {**t, "host_reads": max(0.0, t["host_reads"] - rest)}

    def fp16(t: Dict[str, float]) -> Dict[str, float]:
        return {**t, "host_reads": t["host_reads"] / 2, "flush_inline": t["flush_inline"] / 2,
                "gate_stall": t["gate_stall"] / 2}  # fmt: skip

    def overlap(t: Dict[str, float]) -> Dict[str, float]:
        saved = min(t["gradient_exchange"], 2.0 / 3.0 * t["dense_compute"])
        return {**t, "gradient_exchange": t["gradient_exchange"] - saved}

    out = {"as built": step}
    out[VARIANTS[0]] = sum(prefetch(t).values())
    out[VARIANTS[1]] = sum(fp16(t).values())
    out[VARIANTS[2]] = sum(overlap(t).values())
    out[VARIANTS[3]] = sum(prefetch(overlap(fp16(t))).values())
    return out


def design_table(rows: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """For each row of ``comparison`` where Frugal loses to the best stock choice: every variant's
    predicted samples/s over the best stock choice's."""
    out = []
    for r in rows:
        if r["ratio"] is None or r["ratio"] >= 1.0:
            continue
        steps = r["frugal_variants_s"]
        stock_step = r["stock_step_s"]
        out.append({**{k: r[k] for k in ("config", "gpus", "batch_per_gpu", "cache_ratio", "stock")},
                    "ratio": {k: stock_step / v for k, v in steps.items()}})  # fmt: skip
    return out


def design_markdown(rows: Sequence[Dict[str, Any]]) -> str:
    """Per variant: in how many of the rows where Frugal loses it would then win, and its median gain
    (each row's figures are in the JSON, ``design_question``)."""
    if not rows:
        return "Frugal is predicted faster than the best stock choice in every configuration."
    wins = {k: sum(r["ratio"][k] >= 1.0 for r in rows) for k in VARIANTS}
    med = {k: float(np.median([r["ratio"][k] / r["ratio"]["as built"] for r in rows])) for k in VARIANTS}
    best = {k: max(r["ratio"][k] for r in rows) for k in VARIANTS}
    lines = [md_row(["variant", "configurations where Frugal then wins", "median gain over Frugal as built",
                     "largest frugal / best stock"]), "|---|---:|---:|---:|"]  # fmt: skip
    for k in VARIANTS:
        lines.append(md_row([k, f"{wins[k]} of {len(rows)}", f"{med[k]:.3f}x", f"{best[k]:.2f}"]))
    return "\n".join(lines)


# ---------------------------------------------------------------------------- b(i). all-to-all bandwidth
def effective_a2a_bw(hw: HardwareProfile, world: int, probe_bytes: float = PROBE_BYTES) -> float:
    """Bytes/s of the bandwidth term of ``Primitives.all_to_all`` with ``world`` ranks: the slope of
    its time against the bytes a rank sends (the per-peer latencies cancel)."""
    p = Primitives(hw, world)
    return probe_bytes / (p.all_to_all(2 * probe_bytes) - p.all_to_all(probe_bytes))


def a2a_binding(hw: HardwareProfile, world: int) -> str:
    """Which profile constant sets the effective all-to-all bandwidth (docs/cost_model.md, Primitives)."""
    if not hw.p2p and hw.host_mem_bw / (2.0 * world) < hw.a2a_bw:
        return f"host_mem_bw = {hw.host_mem_bw / 1e9:g} GB/s shared by {world} ranks, x2 (no p2p)"
    return f"a2a_bw = {hw.a2a_bw / 1e9:g} GB/s" + ("" if hw.p2p else " (no p2p)")


def a2a_check(
    rtx: HardwareProfile,
    a30: HardwareProfile,
    pairs: Sequence[Tuple[int, int]] = A2A_PAIRS,
    message_bytes: float = MESSAGE_BYTES,
) -> List[Dict[str, Any]]:
    """Figure 3 (i): the 3090's effective all-to-all bandwidth as a share of the A30's, per GPU-count
    pair, against the paper's 54%; also the share of bytes / time of a whole all-to-all of
    ``message_bytes`` per rank, latencies included."""
    out = []
    for n_rtx, n_a30 in pairs:
        bw_rtx, bw_a30 = effective_a2a_bw(rtx, n_rtx), effective_a2a_bw(a30, n_a30)
        share = bw_rtx / bw_a30
        rel, ok = within(share, PAPER_A2A_SHARE)
        with_lat = Primitives(a30, n_a30).all_to_all(message_bytes) / Primitives(rtx, n_rtx).all_to_all(message_bytes)
        out.append({
            "rtx3090_gpus": n_rtx, "a30_gpus": n_a30, "rtx3090_gb_per_s": bw_rtx / 1e9, "a30_gb_per_s": bw_a30 / 1e9,
            "share": share, "paper": PAPER_A2A_SHARE, "relative_difference": rel, "within_25pct": ok,
            "rtx3090_binding": a2a_binding(rtx, n_rtx), "a30_binding": a2a_binding(a30, n_a30),
            "share_with_latency": with_lat, "latency_message_bytes": message_bytes,
        })  # fmt: skip
    return out


# ---------------------------------------------------------------------------- b(ii). HugeCTR-style loss
def share_loss(rtx_s: np.ndarray, a30_s: np.ndarray) -> np.ndarray:
    """Throughput lost on the 3090 against the A30 when the step times are these: 1 - t_A30 / t_3090."""
    return 1.0 - a30_s / rtx_s


def hugectr_points(
    rtx: HardwareProfile,
    a30: HardwareProfile,
    configs: Sequence[str] = CONFIGS,
    gpus: Sequence[int] = LOSS_GPUS,
    batches: Sequence[int] = SWEEP_BATCHES,
    model: str = MODEL,
) -> List[Dict[str, Any]]:
    """Figure 3 (ii), every point: table_wise on n 3090s and on n A30s, the share of throughput the
    3090 loses (negative: it is faster), and the same share over parts of the step (framework terms
    left out; the all-to-all terms alone)."""
    m_rtx, m_a30 = CostModel(rtx), CostModel(a30)
    fw = np.array([t == "framework" for t in TERMS])
    a2a = np.array([t in A2A_TERMS for t in TERMS])
    out = []
    for config, n, batch in itertools.product(configs, gpus, batches):
        w = workload(config, n, batch, model, presample_steps=0)
        r, a = m_rtx.predict(w, Plan(HUGECTR)), m_a30.predict(w, Plan(HUGECTR))
        tr, ta = term_vector(r), term_vector(a)
        out.append({
            "config": config, "gpus": n, "batch_per_gpu": batch,
            "rtx3090_samples_per_second": r.samples_per_second, "a30_samples_per_second": a.samples_per_second,
            "loss": 1.0 - r.samples_per_second / a.samples_per_second,
            "loss_without_framework": float(share_loss(tr[~fw].sum(), ta[~fw].sum())),
            "loss_all_to_all_only": float(share_loss(tr[a2a].sum(), ta[a2a].sum())),
            "fits": bool(r.fits and a.fits), "memory_gib_per_gpu": gib(r.memory_bytes_per_device),
            "rtx3090_terms_ms": {t: 1e3 * v for t, v in r.terms.items() if v},
            "a30_terms_ms": {t: 1e3 * v for t, v in a.terms.items() if v},
            "gaps_ms": largest_gaps(r, a),
        })  # fmt: skip
    return out


def hugectr_summary(points: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Per (config, GPUs): the largest loss over the batch sweep; overall: the largest over the
    points that fit in device memory, against the paper's 37%."""
    groups: Dict[Tuple[str, int], List[Dict[str, Any]]] = {}
    for p in points:
        groups.setdefault((p["config"], p["gpus"]), []).append(p)
    rows = []
    for (config, n), ps in groups.items():
        loss = np.array([p["loss"] for p in ps])
        top = ps[int(np.argmax(loss))]
        rows.append({"config": config, "gpus": n, "fits": all(p["fits"] for p in ps), "max_loss": top["loss"],
                     "at_batch": top["batch_per_gpu"], "point": top,
                     "loss_by_batch": {p["batch_per_gpu"]: p["loss"] for p in ps},
                     "memory_gib_per_gpu": max(p["memory_gib_per_gpu"] for p in ps)})  # fmt: skip
    fitting = [p for p in points if p["fits"]]
    top = max(fitting, key=lambda p: p["loss"]) if fitting else None
    overall: Dict[str, Any] = {"paper": PAPER_MAX_LOSS, "model": top["loss"] if top else None, "point": top}
    if top:
        overall["relative_difference"], overall["within_25pct"] = within(top["loss"], PAPER_MAX_LOSS)
    return {"by_config": rows, "overall": overall}


# ---------------------------------------------------------------------------- b(ii), HugeCTR-style variant
def has_tf32_peak(hw: HardwareProfile) -> bool:
    return hw.name in TF32_TENSOR_PEAK


def hugectr_style(
    hw: HardwareProfile, c_loop: bool = True, tensor_cores: bool = True, efficiency: float = DENSE_EFFICIENCY
) -> HardwareProfile:
    """``hw`` as a HugeCTR-style system sees it: with ``c_loop`` the framework terms are zero (a C++
    training loop: no Python step, per-id or distributed-loop overhead; an assumption); with
    ``tensor_cores`` the dense layers run at ``efficiency`` of the card's dense TF32 tensor-core peak
    (``TF32_TENSOR_PEAK``) instead of the profile's share of its FP32 peak. Nothing else changes."""
    changes: Dict[str, float] = {}
    if c_loop:
        changes.update({f: 0.0 for f in FRAMEWORK_FIELDS})
    if tensor_cores:
        changes["dense_flops_per_s"] = efficiency * TF32_TENSOR_PEAK[hw.name]
    return dataclasses.replace(hw, **changes)


def changed_fields(before: HardwareProfile, after: HardwareProfile) -> Dict[str, List[float]]:
    """{field: [before, after]} of the fields ``hugectr_style`` may change."""
    names = (*FRAMEWORK_FIELDS, "dense_flops_per_s")
    return {f: [getattr(before, f), getattr(after, f)] for f in names}


def overall_row(name: str, summary: Dict[str, Any]) -> Dict[str, Any]:
    """The headline of one variant: the largest loss that fits, where, against the paper's 37%."""
    o = summary["overall"]
    p = o["point"]
    return {"variant": name, "model": o["model"], "relative_difference": o.get("relative_difference"),
            "within_25pct": o.get("within_25pct"),
            "config": p["config"] if p else None, "gpus": p["gpus"] if p else None,
            "batch_per_gpu": p["batch_per_gpu"] if p else None}  # fmt: skip


def gap_breakdown(p: Dict[str, Any]) -> Dict[str, Any]:
    """At one point: the two step times, each term's share of the 3090's extra time, and the loss over
    the step without ``dense_compute``."""
    r, a = p["rtx3090_terms_ms"], p["a30_terms_ms"]
    step_r, step_a = sum(r.values()), sum(a.values())
    gap = step_r - step_a
    by_term = {t: r.get(t, 0.0) - a.get(t, 0.0) for t in TERMS if r.get(t, 0.0) or a.get(t, 0.0)}
    rest = [sum(v for t, v in x.items() if t != "dense_compute") for x in (r, a)]
    return {"rtx3090_step_ms": step_r, "a30_step_ms": step_a, "gap_ms": gap, "gap_by_term_ms": by_term,
            "all_to_all_gap_ms": sum(by_term.get(t, 0.0) for t in A2A_TERMS),
            "loss_without_dense_compute": float(share_loss(rest[0], rest[1]))}  # fmt: skip


def hugectr_style_check(
    rtx: HardwareProfile,
    a30: HardwareProfile,
    configs: Sequence[str] = CONFIGS,
    model: str = MODEL,
    as_profiled: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """Figure 3 (ii) with the HugeCTR-style profiles: every point and the largest loss as in
    ``hugectr_points`` / ``hugectr_summary``; the two changes one at a time (``ablation``); and the
    largest loss with other shares of the TF32 peak (``sensitivity``, a diagnostic, not the figure).
    ``as_profiled``: the summary of the unchanged profiles, if already computed."""
    v_rtx, v_a30 = hugectr_style(rtx), hugectr_style(a30)
    points = hugectr_points(v_rtx, v_a30, configs, model=model)
    summary = hugectr_summary(points)

    def largest(c_loop: bool, tensor_cores: bool, efficiency: float = DENSE_EFFICIENCY) -> Dict[str, Any]:
        pr = hugectr_style(rtx, c_loop, tensor_cores, efficiency)
        pa = hugectr_style(a30, c_loop, tensor_cores, efficiency)
        return hugectr_summary(hugectr_points(pr, pa, configs, model=model))

    ablation = [
        {**overall_row(AS_PROFILED, as_profiled or largest(False, False)), "c_loop": False, "tensor_cores": False},
        {**overall_row("framework terms zero only", largest(True, False)), "c_loop": True, "tensor_cores": False},
        {**overall_row("TF32 tensor-core dense only", largest(False, True)), "c_loop": False, "tensor_cores": True},
        {**overall_row(HUGECTR_STYLE, summary), "c_loop": True, "tensor_cores": True},
    ]
    sensitivity = []
    for eff in SENSITIVITY_EFFICIENCIES:
        s = summary if eff == DENSE_EFFICIENCY else largest(True, True, eff)
        sensitivity.append({**overall_row(HUGECTR_STYLE, s), "efficiency": eff,
                            "rtx3090_dense_flops_per_s": eff * TF32_TENSOR_PEAK[rtx.name],
                            "a30_dense_flops_per_s": eff * TF32_TENSOR_PEAK[a30.name]})  # fmt: skip
    top = summary["overall"]["point"]
    return {
        "variant": HUGECTR_STYLE, "system": HUGECTR, "batches": list(SWEEP_BATCHES),
        "dense_efficiency": DENSE_EFFICIENCY,
        "tf32_tensor_peak_flops_per_s": {rtx.name: TF32_TENSOR_PEAK[rtx.name], a30.name: TF32_TENSOR_PEAK[a30.name]},
        "changes": {rtx.name: changed_fields(rtx, v_rtx), a30.name: changed_fields(a30, v_a30)},
        "assumptions": [
            "framework_step_s = framework_id_s = framework_dist_step_s = 0: HugeCTR trains from a C++ loop "
            "(no Python per-step, per-id or distributed-loop work); an assumption, not a measurement",
            f"dense_flops_per_s = {DENSE_EFFICIENCY:g} x the dense TF32 tensor-core peak (the profiles' share "
            "of peak, applied to the tensor-core peak HugeCTR's TF32 / mixed-precision GEMMs use)",
        ],
        "sources": {
            "rtx3090": "NVIDIA Ampere GA102 GPU architecture whitepaper, GeForce RTX 3090: peak TF32 tensor "
                       "35.6 TFLOPS dense (71 with sparsity)",
            "a30": "NVIDIA A30 Tensor Core GPU datasheet: TF32 tensor core 82 TFLOPS dense (165 with sparsity)",
        },
        "points": points, **summary,
        "breakdown": gap_breakdown(top) if top else None,
        "ablation": ablation, "sensitivity": sensitivity,
    }  # fmt: skip


# ---------------------------------------------------------------------------- report
def md_row(cells: Sequence[object]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def num(x: Optional[float], fmt: str = ",.0f") -> str:
    return "-" if x is None else format(x, fmt)


def gaps_text(gaps: Sequence[Tuple[str, float]]) -> str:
    return ", ".join(f"{t} {d:+.2f}" for t, d in gaps) or "-"


def yes(ok: bool) -> str:
    return "yes" if ok else "no"


def bound_cell(b: Optional[Dict[str, Any]]) -> str:
    """A bound (``Bound.to_json``) in a table cell: the bound and its time, and its margin over the next lane."""
    if b is None:
        return "-"
    if b["name"] not in PATH_PARTS:
        return f"{b['name']} {b['ms']:.2f} ms: {b['margin_ms']:.2f} over the {b['runner_up']}"
    head = f"{b['name']} {b['ms']:.2f} of {b['path_ms']:.2f} ms path"
    return head if b["runner_up"] == "none" else head + f": {b['margin_ms']:.2f} over the {b['runner_up']}"


def comparison_markdown(rows: Sequence[Dict[str, Any]], hw: HardwareProfile) -> str:
    limit = gib(MEMORY_HEADROOM * hw.device_memory_bytes)
    lines = [
        md_row(["config", "GPUs", "batch/GPU", "cache ratio", "L", "frugal samples/s", "best stock", "stock samples/s",
                "frugal / stock", f"at L = {PAPER_LOOKAHEAD}", "frugal's bound (ms)", "stock's bound (ms)",
                "largest term gaps, frugal - stock (ms)"]),
        "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---|---|---|",
    ]  # fmt: skip
    for r in rows:
        frugal = num(r["frugal_samples_per_second"]) + ("" if r["frugal_fits"] else " (cache does not fit)")
        if r["stock"] is None:
            need = min(v["memory_gib_per_gpu"] for v in r["stock_all"].values())
            stock = f"none fits (least: {need:.1f} GiB/GPU > {limit:.1f})"
        else:
            stock = r["stock"]
        lines.append(md_row([r["config"], r["gpus"], r["batch_per_gpu"], f"{r['cache_ratio']:g}", r["lookahead"],
                             frugal, stock, num(r["stock_samples_per_second"]), num(r["ratio"], ".2f"),
                             num(r["ratio_at_paper_lookahead"], ".2f"), bound_cell(r["frugal_bound"]),
                             bound_cell(r["stock_bound"]), gaps_text(r["gaps_ms"])]))  # fmt: skip
    return "\n".join(lines)


def end_cell(e: Dict[str, Any]) -> str:
    """One end of an assumption's range: the range of frugal / best stock over table a, the wins, and
    the headline row's ratio with Frugal's bound."""
    h = e["headline"]
    return (f"{e['ratio_min']:.2f}-{e['ratio_max']:.2f}x, ahead in {e['wins']} of {e['compared']}; "
            f"headline {h['ratio']:.2f}x ({h['frugal_bound']['name']})")  # fmt: skip


def sensitivity_markdown(sens: Sequence[Dict[str, Any]], corners: Dict[str, Any]) -> str:
    """The sensitivity table: each assumption's profile value, its range, the verdicts at each end, and
    its source; then every assumption at Frugal's better and worse ends at once."""
    base = sens[0]["base"]
    lines = [
        md_row(["assumed input", "profile fields", "profile", "low", "high", "verdict at low", "verdict at high",
                "source of the value and the range"]),
        "|---|---|---:|---:|---:|---|---|---|",
        md_row(["(as profiled)", "-", "-", "-", "-", end_cell(base), end_cell(base), "-"]),
    ]  # fmt: skip
    for r in sens:
        fields = ", ".join(f"`{f}`" for f in r["fields"]) or "(the workload's ids)"
        lines.append(md_row([r["label"], fields, unit_text(float(f"{r['profile']:.3g}"), r["unit"]),
                             unit_text(r["low"]["value"], r["unit"]), unit_text(r["high"]["value"], r["unit"]),
                             end_cell(r["low"]), end_cell(r["high"]), r["source"]]))  # fmt: skip
    lines += ["", md_row(["every input at once", "values", "verdict"]), "|---|---|---|"]
    by_key = {r["key"]: r for r in sens}
    for name, label in (("frugal_best", "at the end better for Frugal"), ("frugal_worst", "at the end worse for Frugal")):
        c = corners[name]
        values = ", ".join(f"{by_key[k]['label']} {unit_text(v, by_key[k]['unit'])}" for k, v in c["values"].items())
        lines.append(md_row([label, values, end_cell(c)]))
    return "\n".join(lines)


def a2a_markdown(rows: Sequence[Dict[str, Any]]) -> str:
    lines = [
        md_row(["3090 GPUs", "A30 GPUs", "3090 GB/s", "A30 GB/s", "model: 3090 / A30", "paper", "model / paper - 1",
                "within 25%", "with latencies*", "3090 bound by", "A30 bound by"]),
        "|---:|---:|---:|---:|---:|---:|---:|---|---:|---|---|",
    ]  # fmt: skip
    for r in rows:
        lines.append(md_row([r["rtx3090_gpus"], r["a30_gpus"], f"{r['rtx3090_gb_per_s']:.2f}",
                             f"{r['a30_gb_per_s']:.2f}", f"{100 * r['share']:.1f}%", f"{100 * r['paper']:.0f}%",
                             f"{100 * r['relative_difference']:+.1f}%", yes(r["within_25pct"]),
                             f"{100 * r['share_with_latency']:.1f}%", r["rtx3090_binding"],
                             r["a30_binding"]]))  # fmt: skip
    mib = rows[0]["latency_message_bytes"] / 2**20
    lines += ["", f"*with latencies: the A30's time over the 3090's for one all-to-all of {mib:g} MiB per rank, "
              "per-peer latencies included."]  # fmt: skip
    return "\n".join(lines)


def loss_table(summary: Dict[str, Any]) -> List[str]:
    """The per-(config, GPUs) loss over the batch sweep, as markdown lines."""
    batches = sorted({b for r in summary["by_config"] for b in r["loss_by_batch"]})
    lines = [
        md_row(["config", "GPUs (each box)", *(f"loss @{b}" for b in batches), "largest loss (batch)",
                "terms at the largest, 3090 - A30 (ms)"]),
        "|---|---:|" + "---:|" * len(batches) + "---:|---|",
    ]  # fmt: skip
    for r in summary["by_config"]:
        if not r["fits"]:
            lines.append(md_row([r["config"], r["gpus"], *("-" for _ in batches),
                                 f"{HUGECTR} does not fit ({r['memory_gib_per_gpu']:.1f} GiB/GPU)", "-"]))  # fmt: skip
            continue
        cells = [f"{100 * r['loss_by_batch'][b]:+.1f}%" for b in batches]
        lines.append(md_row([r["config"], r["gpus"], *cells, f"{100 * r['max_loss']:+.1f}% ({r['at_batch']})",
                             gaps_text(r["point"]["gaps_ms"])]))  # fmt: skip
    return lines


def where_text(p: Dict[str, Any]) -> str:
    return f"{p['config']}, {p['gpus']} GPUs, batch {p['batch_per_gpu']}"


def hugectr_markdown(summary: Dict[str, Any], rtx: HardwareProfile, a30: HardwareProfile) -> str:
    lines = loss_table(summary)
    o = summary["overall"]
    p = o["point"]
    if p is None:
        return "\n".join(lines) + "\n\nNo point fits in device memory."
    fw_share = p["rtx3090_terms_ms"].get("framework", 0.0) / sum(p["rtx3090_terms_ms"].values())
    where = where_text(p)
    lines += [
        "",
        "| figure | model | paper | model / paper - 1 | within 25% |",
        "|---|---:|---:|---:|---|",
        md_row([f"largest throughput loss, 3090 against A30 ({where})", f"{100 * o['model']:.1f}%",
                f"{100 * o['paper']:.0f}%", f"{100 * o['relative_difference']:+.1f}%", yes(o["within_25pct"])]),
        "",
        f"At that point: loss over the step without the framework term {100 * p['loss_without_framework']:.1f}%, "
        f"over the all-to-all terms alone {100 * p['loss_all_to_all_only']:.1f}%; the framework term is "
        f"{100 * fw_share:.0f}% of the 3090's step (framework_step_s = {1e3 * rtx.framework_step_s:g} ms and "
        f"framework_id_s = {1e9 * rtx.framework_id_s:g} ns on the 3090, {1e3 * a30.framework_step_s:g} ms and "
        f"{1e9 * a30.framework_id_s:g} ns on the A30).",
        f"dense_flops_per_s: 3090 {rtx.dense_flops_per_s / 1e12:.2f} TFLOP/s, "
        f"A30 {a30.dense_flops_per_s / 1e12:.2f} TFLOP/s.",
    ]  # fmt: skip
    return "\n".join(lines)


def tflops(x: float) -> str:
    return f"{x / 1e12:.2f}"


def hugectr_style_markdown(check: Dict[str, Any], as_profiled: Dict[str, Any], rtx: HardwareProfile,
                           a30: HardwareProfile) -> str:
    """The HugeCTR-style variant of (ii): what changes, its loss table, and both variants side by side."""
    ch = check["changes"]
    eff = check["dense_efficiency"]
    peak = check["tf32_tensor_peak_flops_per_s"]
    lines = [
        md_row(["field", "3090: as profiled", "3090: HugeCTR-style", "A30: as profiled", "A30: HugeCTR-style",
                "why"]),
        "|---|---:|---:|---:|---:|---|",
    ]  # fmt: skip
    for f in FRAMEWORK_FIELDS:
        unit, k = ("ms", 1e3) if f.endswith("step_s") else ("ns", 1e9)
        lines.append(md_row([f"`{f}`", *(f"{k * v:g} {unit}" for v in (*ch[rtx.name][f], *ch[a30.name][f])),
                             "C++ training loop (assumption)"]))  # fmt: skip
    d_r, d_a = ch[rtx.name]["dense_flops_per_s"], ch[a30.name]["dense_flops_per_s"]
    lines.append(md_row(["`dense_flops_per_s` (TFLOP/s)", tflops(d_r[0]), tflops(d_r[1]), tflops(d_a[0]),
                         tflops(d_a[1]),
                         f"{eff:.0%} of the dense TF32 tensor-core peak ({peak[rtx.name] / 1e12:g} and "
                         f"{peak[a30.name] / 1e12:g} TFLOPS) instead of {eff:.0%} of the FP32 peak"]))  # fmt: skip
    lines += ["", *loss_table(check)]
    rows = [overall_row(AS_PROFILED, as_profiled), overall_row(HUGECTR_STYLE, check)]
    lines += [
        "",
        "| variant | figure | model | paper | model / paper - 1 | within 25% |",
        "|---|---|---:|---:|---:|---|",
    ]
    for r in rows:
        if r["model"] is None:
            lines.append(md_row([r["variant"], "no point fits", "-", "37%", "-", "-"]))
            continue
        lines.append(md_row([r["variant"], f"largest throughput loss, 3090 against A30 ({where_text(r)})",
                             f"{100 * r['model']:.1f}%", f"{100 * PAPER_MAX_LOSS:.0f}%",
                             f"{100 * r['relative_difference']:+.1f}%", yes(r["within_25pct"])]))  # fmt: skip
    b, p = check["breakdown"], check["overall"]["point"]
    if b is not None:
        top = sorted(b["gap_by_term_ms"].items(), key=lambda kv: -abs(kv[1]))
        parts = ", ".join(f"{t} {d:+.2f} ms ({100 * d / b['gap_ms']:.0f}%)" for t, d in top if abs(d) >= 0.005)
        lines += [
            "",
            f"At the HugeCTR-style largest ({where_text(p)}): the 3090's step {b['rtx3090_step_ms']:.2f} ms, the "
            f"A30's {b['a30_step_ms']:.2f} ms; of the {b['gap_ms']:.2f} ms difference: {parts}. Loss over the "
            f"step without dense_compute {100 * b['loss_without_dense_compute']:.1f}%, over the all-to-all terms "
            f"alone {100 * p['loss_all_to_all_only']:.1f}%.",
        ]  # fmt: skip
    lines += [
        "",
        "One change at a time (largest loss over the same sweep):",
        "",
        "| framework terms | dense rate | largest loss | at | model / paper - 1 | within 25% |",
        "|---|---|---:|---|---:|---|",
    ]
    for r in check["ablation"]:
        fw = "zero (C++ loop)" if r["c_loop"] else "as profiled"
        dense = f"{eff:.0%} of TF32 tensor peak" if r["tensor_cores"] else f"{eff:.0%} of FP32 peak (as profiled)"
        if r["model"] is None:
            lines.append(md_row([fw, dense, "-", "no point fits", "-", "-"]))
            continue
        lines.append(md_row([fw, dense, f"{100 * r['model']:.1f}%", where_text(r),
                             f"{100 * r['relative_difference']:+.1f}%", yes(r["within_25pct"])]))  # fmt: skip
    lines += [
        "",
        "Diagnostic, not the model's figure: the HugeCTR-style largest loss with another share of the TF32 "
        "tensor-core peak on both cards:",
        "",
        "| share of TF32 peak | 3090 / A30 TFLOP/s | largest loss | at | model / paper - 1 | within 25% |",
        "|---:|---|---:|---|---:|---|",
    ]
    for r in check["sensitivity"]:
        rate = f"{tflops(r['rtx3090_dense_flops_per_s'])} / {tflops(r['a30_dense_flops_per_s'])}"
        if r["model"] is None:
            lines.append(md_row([f"{r['efficiency']:.1%}", rate, "-", "no point fits", "-", "-"]))
            continue
        lines.append(md_row([f"{r['efficiency']:.1%}", rate, f"{100 * r['model']:.1f}%", where_text(r),
                             f"{100 * r['relative_difference']:+.1f}%", yes(r["within_25pct"])]))  # fmt: skip
    return "\n".join(lines)


def largest_a2a_loss(points: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """The fitting point whose all-to-all terms alone lose the most on the 3090."""
    return max((p for p in points if p["fits"]), key=lambda p: p["loss_all_to_all_only"])


def plot(path: Path, rows: Sequence[Dict[str, Any]], points: Sequence[Dict[str, Any]],
         variant_points: Optional[Sequence[Dict[str, Any]]] = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = list(dict.fromkeys(r["config"] for r in rows))
    ncols = 2 if len(configs) > 1 else len(configs) + 1
    nrows = -(-(len(configs) + 1) // ncols)
    fig, grid = plt.subplots(nrows, ncols, figsize=(5 * ncols, 3.6 * nrows), squeeze=False)
    axes = list(grid.flat)
    for ax in axes[len(configs) + 1:]:
        ax.set_visible(False)
    colours = dict(zip(sorted({r["cache_ratio"] for r in rows}), ("tab:blue", "tab:orange", "tab:green", "tab:red")))
    gpus = sorted({r["gpus"] for r in rows})
    for ax, config in zip(axes, configs):
        for batch, c in sorted({(r["batch_per_gpu"], r["cache_ratio"]) for r in rows}):
            key = (config, batch, c)
            sel = [r for r in rows if (r["config"], r["batch_per_gpu"], r["cache_ratio"]) == key and r["ratio"]]
            if sel:
                ax.plot([r["gpus"] for r in sel], [r["ratio"] for r in sel], marker="o", color=colours[c],
                        linestyle="-" if batch == max(BATCH_SIZES) else "--",
                        label=f"batch {batch}, cache {c:g}")  # fmt: skip
        none = sorted({r["gpus"] for r in rows if r["config"] == config and r["stock"] is None})
        if none:
            text = f"no stock sharding fits on {', '.join(map(str, none))} GPUs"
            ax.text(0.03, 0.5, text, transform=ax.transAxes, fontsize=7)
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(gpus, [str(g) for g in gpus])
        ax.set_xlim(min(gpus) / 1.15, max(gpus) * 1.15)
        ax.set_xlabel("RTX 3090s")
        ax.set_ylabel("predicted frugal / best stock")
        ax.set_title(f"{config} (scale 1)", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=6)
    ax = axes[len(configs)]
    for i, (config, n) in enumerate(dict.fromkeys((p["config"], p["gpus"]) for p in points if p["fits"])):
        sel = [p for p in points if p["config"] == config and p["gpus"] == n]
        ax.plot([p["batch_per_gpu"] for p in sel], [100 * p["loss"] for p in sel], marker=".", color=f"C{i}",
                label=f"{config}, {n} GPUs")  # fmt: skip
        var = [p for p in variant_points or () if p["config"] == config and p["gpus"] == n and p["fits"]]
        if var:
            ax.plot([p["batch_per_gpu"] for p in var], [100 * p["loss"] for p in var], marker=".", color=f"C{i}",
                    linestyle="--")  # fmt: skip
    ax.axhline(100 * PAPER_MAX_LOSS, color="black", linestyle=":", label="paper: up to 37%")
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(SWEEP_BATCHES), [str(b) for b in SWEEP_BATCHES])
    ax.set_xlabel("batch per GPU")
    ax.set_ylabel("predicted throughput loss, 3090 vs A30 (%)")
    title = f"Figure 3: {HUGECTR} on 3090 against A30"
    if variant_points:
        title += f"\nsolid: {AS_PROFILED}; dashed: {HUGECTR_STYLE}"
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, loc="lower left" if variant_points else "best")
    fig.suptitle("PREDICTED by the cost model (not measured)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_grid(path: Path, grid: Dict[str, Any], profile_ms: float) -> None:
    """Where Frugal wins: frugal / best stock over framework time (x) and table size (y), one panel per
    (GPUs, batch); the line at 1.0 where it crosses, hatching where no stock choice fits."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import TwoSlopeNorm

    x, rows = np.array(grid["framework_ms"]), np.array(grid["rows"], dtype=float)
    ratios = [np.array([[np.nan if v is None else v for v in r] for r in p["ratio"]]) for p in grid["panels"]]
    finite = np.concatenate([r[np.isfinite(r)] for r in ratios])
    lo, hi = min(float(finite.min()), 0.99), max(float(finite.max()), 1.01)
    norm = TwoSlopeNorm(vmin=lo, vcenter=1.0, vmax=hi)
    fig, axes = plt.subplots(1, len(ratios), figsize=(4.6 * len(ratios), 4.0), squeeze=False)
    for ax, panel, r in zip(axes[0], grid["panels"], ratios):
        mesh = ax.pcolormesh(x, rows, r, shading="nearest", cmap="RdBu", norm=norm)
        if np.nanmin(r) < 1.0 < np.nanmax(r):
            cs = ax.contour(x, rows, r, levels=[1.0], colors="black", linewidths=1.2)
            ax.clabel(cs, fmt="1.0", fontsize=7)
        if np.isnan(r).any():
            ax.contourf(x, rows, np.isnan(r).astype(float), levels=[0.5, 1.5], colors="none", hatches=["//"])
        ax.axvline(profile_ms, color="black", linestyle=":", linewidth=1)
        for name, cap in PAPER_CAPACITIES.items():
            ax.axhline(cap, color="grey", linewidth=0.6)
            ax.text(x[0], cap, f" {name}", fontsize=6, va="bottom", ha="left")
        ax.set_yscale("log")
        ax.set_xlabel("framework time per step (ms; dotted: the profile's)")
        ax.set_ylabel("rows of the one table")
        ax.set_title(f"{panel['gpus']} GPUs, batch {panel['batch_per_gpu']}", fontsize=9)
        fig.colorbar(mesh, ax=ax, label="predicted frugal / best stock")
    fig.suptitle(f"PREDICTED: the paper's model, a {grid['config']}-like table scaled, cache {grid['cache_ratio']:g}, "
                 "rtx3090 (hatched: no stock choice fits)", fontsize=9)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def where_row(r: Dict[str, Any]) -> str:
    return f"{r['config']}, {r['gpus']} GPUs, batch {r['batch_per_gpu']}"


def unit_text(value: float, unit: str) -> str:
    return f"{value:g} {unit}" if unit and unit != "x" else (f"{value:g}x" if unit == "x" else f"{value:g}")


def flips(sens: Sequence[Dict[str, Any]]) -> List[Tuple[str, str, float]]:
    """(label, value at that end, largest frugal / best stock there) of every end of a range where
    Frugal is predicted ahead somewhere in table a."""
    return [(r["label"], unit_text(r[e]["value"], r["unit"]), r[e]["ratio_max"])
            for r in sens for e in ("low", "high") if r[e]["wins"] > 0]  # fmt: skip


def summary_prose(rows: Sequence[Dict[str, Any]], sens: Optional[Sequence[Dict[str, Any]]]) -> str:
    """One sentence from the results: where Frugal is predicted to win, where it loses, what bounds it."""
    compared = [r for r in rows if r["ratio"] is not None]
    wins = [r for r in compared if r["ratio"] > 1.0]
    lo, hi = min(compared, key=lambda r: r["ratio"]), max(compared, key=lambda r: r["ratio"])
    stocks = sorted({r["stock"] for r in compared})
    bounds = [r["frugal_bound"]["name"] for r in compared] + [r["stock_bound"]["name"] for r in compared]
    top = max(set(bounds), key=bounds.count)
    gpus = sorted({r["gpus"] for r in rows})
    where = (f"ahead in {len(wins)} of {len(compared)} configurations" if wins else
             f"behind the best stock choice ({', '.join(stocks)}) in all {len(compared)} configurations")  # fmt: skip
    text = (f"On the paper's model on {gpus[0]}-{gpus[-1]} RTX 3090s the cost model predicts Frugal {where} "
            f"({lo['ratio']:.2f}x at {where_row(lo)} to {hi['ratio']:.2f}x at {where_row(hi)}); the {top} bounds "
            f"{100 * bounds.count(top) / len(bounds):.0f}% of both sides' steps")  # fmt: skip
    if sens is None:
        return text + "."
    f = flips(sens)
    if not f:
        return text + ", and no assumed input at either end of its range puts Frugal ahead."
    parts = ", ".join(f"{label} at {value} (up to {ratio:.2f}x)" for label, value, ratio in f)
    return text + f", and Frugal is predicted ahead only with {parts}."


def readme_text(doc: Dict[str, Any]) -> Dict[str, Any]:
    """README's two GPU-predicted rows of the Results table and the sentence under it, from this
    script's results (a test holds README to them)."""
    rows, s = doc["comparison"], doc["summary"]
    gpus = sorted({r["gpus"] for r in rows})
    batches = " and ".join(str(b) for b in sorted({r["batch_per_gpu"] for r in rows}))
    caches = sorted({r["cache_ratio"] for r in rows})
    sizes = sorted({r["rows"] for r in rows})
    out = [
        f"| {gpus[0]}-{gpus[-1]}x RTX 3090 (PCIe 3.0), the paper's DLRM benchmark (one table of {sizes[0] / 1e6:.1f}M-"
        f"{sizes[-1] / 1e6:.1f}M rows, MLP 32-512-256-1), batch {batches}, cache {caches[0]:g}-{caches[-1]:g}: "
        f"frugal / best stock choice | {s['ratio_min']:.2f}-{s['ratio_max']:.2f}x (ahead in {s['wins']} of "
        f"{s['compared']}) | GPU-predicted | [paper setting](docs/paper_setting.md) |",
    ]  # fmt: skip
    sens = doc.get("sensitivity")
    if sens:
        ends = [r[e] for r in sens for e in ("low", "high")]
        ahead = sum(e["wins"] > 0 for e in ends)
        out.append(
            f"| same, each of {len(sens)} assumed inputs (framework time, host link, collectives, Frugal's host "
            f"threads, UVM cache work, the ids' tail) at either end of its range | "
            f"{min(e['ratio_min'] for e in ends):.2f}-{max(e['ratio_max'] for e in ends):.2f}x (ahead somewhere at "
            f"{ahead} of {len(ends)} ends) | GPU-predicted | [paper setting](docs/paper_setting.md#sensitivity) |")  # fmt: skip
    return {"rows": out, "sentence": summary_prose(rows, sens)}


def report(args: argparse.Namespace) -> Tuple[Dict[str, Any], str]:
    """Everything the script predicts, as a JSON document and as the markdown page (docs/paper_setting.md)."""
    rtx, a30 = load_profile(args.hardware), load_profile(args.datacenter)
    kw = dict(configs=args.configs, gpus=args.gpus, batches=args.batches, cache_ratios=args.cache_ratios,
              presample_steps=args.presample_steps)  # fmt: skip
    rows = comparison(rtx, model=args.model, **kw)
    dlrm = comparison(rtx, model="dlrm", **kw) if args.dlrm else []
    others = {name: comparison(load_profile(name), model=args.model, **kw) for name in args.also}
    sens = sensitivity(rtx, rows, model=args.model, **kw) if args.sensitivity else None
    corners = best_case(rtx, sens, model=args.model, **kw) if sens else None
    grid = (framework_grid(rtx, args.grid_framework_ms, args.grid_scales, model=args.model,
                           presample_steps=args.presample_steps) if args.grid else None)  # fmt: skip
    design = design_table(rows)
    a2a = a2a_check(rtx, a30)
    points = hugectr_points(rtx, a30, args.configs, model=args.model)
    summary = hugectr_summary(points)
    variant = (hugectr_style_check(rtx, a30, args.configs, args.model, as_profiled=summary)
               if has_tf32_peak(rtx) and has_tf32_peak(a30) else None)  # fmt: skip
    head = next(r for r in a2a if (r["rtx3090_gpus"], r["a30_gpus"]) == HEADLINE_PAIR)
    doc: Dict[str, Any] = {
        "prediction": True,
        "note": "every figure is a prediction of torchrec_frugal.estimate.cost_model on the shipped profiles; none is measured",
        "hardware": rtx.name, "datacenter": a30.name, "model": args.model, "scale": SCALE, "real_data": REAL_DATA,
        "presample_steps": args.presample_steps, "lookaheads": list(LOOKAHEAD_CHOICES),
        "stock_shardings": list(STOCK), "headline": list(HEADLINE),
        "comparison": rows, "summary": verdict_summary(rows),
        "comparison_dlrm": dlrm, "summary_dlrm": verdict_summary(dlrm) if dlrm else None,
        "comparison_other_profiles": others,
        "sensitivity": sens, "sensitivity_corners": corners, "framework_grid": grid,
        "design_question": design,
        "a2a_bandwidth": {"headline_pair": list(HEADLINE_PAIR), "rows": a2a},
        "hugectr_loss": {"system": HUGECTR, "batches": list(SWEEP_BATCHES), "points": points, **summary},
        "hugectr_style_loss": variant,
    }  # fmt: skip
    doc["readme"] = readme_text(doc)
    a2a_top = largest_a2a_loss(points) if any(p["fits"] for p in points) else None
    gpus = ", ".join(map(str, args.gpus))
    caps = ", ".join(f"{n} {c:,}" for n, c in PAPER_CAPACITIES.items())
    md = [
        "# The paper's setting, predicted",
        "",
        f"Every figure on this page is a **prediction** of `torchrec_frugal.estimate.cost_model` on the shipped "
        f"profiles (`{rtx.name}`: the paper's box, 8x RTX 3090 on PCIe 3.0 without peer-to-peer; `{a30.name}`; "
        "sources in [cost_model.md](cost_model.md)); nothing here is measured. The page, its JSON and its "
        "figures are regenerated by",
        "",
        "```bash",
        f"{REGENERATE}   # writes benchmarks/results/paper_setting*.{{json,png}} too",
        "```",
        "",
        doc["readme"]["sentence"],
        "",
        f"## a. The paper's DLRM benchmark on {gpus} RTX 3090s",
        "",
        f"The authors' benchmark (`--model paper` in `examples/dlrm` and `estimate`): one table over one ID space "
        f"of the dataset's capacity ({caps} rows, dim 32), 21 (avazu) or 26 ids a sample sum-pooled into one "
        "vector, MLP 32-512-256-1, SGD on table and MLP. Ids: Zipf by table size with the real data's tail (every "
        "row read once an epoch: `CostTable.tail_rate`). Frugal's L is the best of "
        f"{', '.join(map(str, LOOKAHEAD_CHOICES))} (and the ratio at the paper's L = {PAPER_LOOKAHEAD} beside it); "
        "the best stock choice is the fastest that fits of "
        f"{', '.join(f'`{x}`' for x in STOCK)} (UVM caching at the best `cache_load_factor`).",
        "",
        "Each step's bound (`cost_model.bound`, [cost_model.md](cost_model.md#what-bounds-a-step)): the critical "
        "path's largest part (device, training thread, host link, collectives) and by how much the path outlasts the "
        "slowest thread beside it (planner, exchange worker, flushers, cache prefetch), or the thread beside it that "
        "outlasts the path, and by how much.",
        "",
        comparison_markdown(rows, rtx),
        "",
        f"![predicted frugal / best stock, and Figure 3](../{shown(args.plot)})",
        "",
        f"Figure: `{REGENERATE}`.",
        "",
    ]  # fmt: skip
    for name, rs in others.items():
        md += [f"The same on `{name}`:", "", comparison_markdown(rs, load_profile(name)), ""]
    if sens is not None and corners is not None:
        h = HEADLINE
        md += [
            "## Sensitivity",
            "",
            "Each assumed input of the profile at each end of its range, the others as profiled (built with "
            "`dataclasses.replace`; the profile file is not changed): the range of frugal / best stock over table a, "
            f"how many of its rows Frugal wins, and the headline row ({h[0]}, {h[1]} GPUs, batch {h[2]}, cache "
            f"{h[3]:g}) with the bound of Frugal's step. The inputs, ranges and sources are `ASSUMPTIONS` in "
            "`benchmarks/paper_setting.py`.",
            "",
            sensitivity_markdown(sens, corners),
            "",
        ]  # fmt: skip
    if grid is not None:
        r = [v for p in grid["panels"] for row in p["ratio"] for v in row if v is not None]
        won = sum(v > 1.0 for v in r)
        md += [
            "### Where Frugal wins: framework time and table size",
            "",
            f"frugal / best stock as the framework time per step ({grid['framework_ms'][0]:g}-"
            f"{grid['framework_ms'][-1]:g} ms) and the table ({grid['rows'][0]:,}-{grid['rows'][-1]:,} rows: "
            f"{grid['scales'][0]:g}-{grid['scales'][-1]:g}x criteo-tb's capacity, ids as the paper's criteo-tb) vary, "
            f"cache {grid['cache_ratio']:g}: {min(r):.2f}-{max(r):.2f}x, Frugal ahead at {won} of {len(r)} points.",
            "",
            f"![where Frugal wins](../{shown(args.grid_plot)})",
            "",
            f"Figure: `{REGENERATE}` (`--grid-framework-ms`, `--grid-scales` change its axes).",
            "",
        ]  # fmt: skip
    if dlrm:
        sd = doc["summary_dlrm"]
        md += [
            "## MLPerf-style DLRM (a second workload)",
            "",
            "TorchRec's DLRM over one table per field (26, dim 32; criteo-tb uncapped at 882,774,559 rows), 13 "
            "dense features, pairwise interaction, row-wise Adagrad: what `--model dlrm` trains. Not the paper's "
            f"benchmark. frugal / best stock {sd['ratio_min']:.2f}-{sd['ratio_max']:.2f}x, ahead in {sd['wins']} of "
            f"{sd['compared']}.",
            "",
            comparison_markdown(dlrm, rtx),
            "",
        ]  # fmt: skip
    md += [
        f"## The design question: Frugal variants, priced but not built, where Frugal loses (on `{rtx.name}`)",
        "",
        "Frugal variants over the rows of table a where Frugal loses; `design_variants` in the script says what "
        "each changes.",
        "",
        design_markdown(design),
        "",
        "## b(i). Figure 3: all-to-all bandwidth, 3090 against A30 (the bandwidth term of the model's all-to-all)",
        "",
        a2a_markdown(a2a),
        "",
        f"Headline ({HEADLINE_PAIR[0]} GPUs each): model {100 * head['share']:.1f}% against the paper's "
        f"{100 * PAPER_A2A_SHARE:.0f}% ({100 * head['relative_difference']:+.1f}%, "
        f"{'within' if head['within_25pct'] else 'not within'} 25%).",
        "",
        f"## b(ii). Figure 3: throughput a HugeCTR-style system ({HUGECTR}) loses on 3090 against A30, "
        "equal GPU counts",
        "",
        "Loss = 1 - (3090 samples/s) / (A30 samples/s); negative: the 3090 is predicted faster.",
        "",
        hugectr_markdown(summary, rtx, a30),
    ]  # fmt: skip
    if a2a_top is not None:
        rel, ok = within(a2a_top["loss_all_to_all_only"], PAPER_MAX_LOSS)
        md += ["", f"Diagnostic, not the model's figure: the largest loss over the all-to-all terms alone is "
               f"{100 * a2a_top['loss_all_to_all_only']:.1f}% ({a2a_top['config']}, {a2a_top['gpus']} GPUs, batch "
               f"{a2a_top['batch_per_gpu']}; {100 * rel:+.1f}% against the paper's 37%, "
               f"{'within' if ok else 'not within'} 25%); over the whole step there the 3090 is predicted "
               f"{'faster' if a2a_top['loss'] < 0 else 'slower'} ({100 * a2a_top['loss']:+.1f}% loss)."]  # fmt: skip
    md += ["", f"## b(ii), second variant: {HUGECTR_STYLE} (a C++ loop, dense layers on the tensor cores)", ""]
    if variant is None:
        md.append(f"Not computed: no dense TF32 tensor-core peak is known here for `{rtx.name}` or `{a30.name}` "
                  f"(known: {', '.join(sorted(TF32_TENSOR_PEAK))}).")  # fmt: skip
    else:
        md += ["Only the fields below differ from the shipped profiles (built with `dataclasses.replace`); "
               "every other constant is as profiled.", "", hugectr_style_markdown(variant, summary, rtx, a30)]
    return doc, "\n".join(md) + "\n"


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    ap.add_argument("--gpus", nargs="+", type=int, default=list(GPUS), help="RTX 3090s for table a")
    ap.add_argument("--batches", nargs="+", type=int, default=list(BATCH_SIZES), help="per-GPU batches for table a")
    ap.add_argument("--cache-ratios", nargs="+", type=float, default=list(CACHE_RATIOS))
    ap.add_argument("--model", choices=("paper", "dlrm"), default=MODEL, help="dense model (default: the paper's MLP)")
    ap.add_argument("--presample-steps", type=int, default=PRESAMPLE_STEPS,
                    help="batches per rank counted to pick Frugal's hot rows (0: the true hottest)")  # fmt: skip
    ap.add_argument("--hardware", default="rtx3090", help="the commodity box's profile")
    ap.add_argument("--datacenter", default="a30", help="the datacenter box's profile (Figure 3)")
    ap.add_argument("--also", nargs="*", default=[], help="other commodity profiles for table a (e.g. rtx4090)")
    ap.add_argument("--no-dlrm", dest="dlrm", action="store_false", help="leave out the MLPerf-style DLRM table")
    ap.add_argument("--no-sensitivity", dest="sensitivity", action="store_false", help="leave out the sensitivity table")
    ap.add_argument("--no-grid", dest="grid", action="store_false", help="leave out the framework time x table size plot")
    ap.add_argument("--grid-framework-ms", nargs="+", type=float, default=list(GRID_FRAMEWORK_MS))
    ap.add_argument("--grid-scales", nargs="+", type=float, default=list(GRID_SCALES),
                    help="table sizes of the plot, as scales of criteo-tb's capacity")
    ap.add_argument("--json", type=Path, default=RESULTS / "paper_setting.json")
    ap.add_argument("--plot", type=Path, default=RESULTS / "paper_setting.png")
    ap.add_argument("--grid-plot", type=Path, default=RESULTS / "paper_setting_sensitivity.png")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--doc", type=Path, default=None, help="write the markdown page here (docs/paper_setting.md)")
    args = ap.parse_args(argv)
    if min(args.gpus) < 1 or min(args.batches) < 1:
        ap.error("--gpus and --batches must be >= 1")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    doc, md = report(args)
    print(md)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"\nwrote {shown(args.json)}")
    if args.doc:
        args.doc.write_text(md)
        print(f"wrote {shown(args.doc)}")
    if not args.no_plot:
        variant = doc["hugectr_style_loss"]
        plot(args.plot, doc["comparison"], doc["hugectr_loss"]["points"], variant["points"] if variant else None)
        print(f"wrote {shown(args.plot)}")
        if doc["framework_grid"] is not None:
            plot_grid(args.grid_plot, doc["framework_grid"], 1e3 * load_profile(args.hardware).framework_step_s)
            print(f"wrote {shown(args.grid_plot)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
