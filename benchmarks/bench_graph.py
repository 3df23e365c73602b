"""Frugal against stock TorchRec sharding on the knowledge-graph example: one command, same data.

Every run is ``torchrun --nproc_per_node=N examples/graph/train.py ... --summary S.json`` in fresh
processes. Two suites:

``--suite speed`` (default): a synthetic Freebase-shaped graph (power-law entity degrees), the
entity table sharded by each variant; triples/s is what train.py measures after its warm-up (all
ranks together). Variants alternate within each repetition (round robin, start rotated by one per
repetition) and the table reports medians over ``--repeats`` and ratios against the best stock
sharding and against perfect scaling (W x one rank alone on its share of the batch):

* ``frugal``      ``--sharder frugal`` (the example's defaults: on a CPU device no owner cache and
  L = 0, on a GPU a cache ratio of 0.05 and L = 10)
* ``frugal_cached``  ``--sharder frugal --cache-ratio 0.05`` (``--variants ... frugal_cached``): the
  GPU's cache on a CPU device too, where it is host memory like the table; this prices what the
  cache costs there, a comparison the example leaves out
* ``table_wise``  ``--sharder torchrec --sharding table_wise``
* ``row_wise``    ``--sharder torchrec --sharding row_wise``
* ``column_wise`` ``--sharder torchrec --sharding column_wise`` (each rank holds half of every
  row's columns; its row-wise Adagrad takes each half's own mean square, so it trains other
  values than the single process does)
* ``alone``       one process, ``--batch-size B/W`` (no communication): the upper bound
* ``pbg``         PyTorch-BigGraph 1.0.0 on the same training triples (``--variants ... pbg``)

Every example variant makes its batches on the training thread (``--loader-workers``, default 0).

PBG runs from a virtual environment of its own (``--pbg-venv``, default ``.venv-pbg/``, made on
first use: torch as pinned in requirements-cpu.txt, ``torchbiggraph==1.0.0`` and
``setuptools<81``, which PBG's ``pkg_resources`` import needs). The example's training triples
(same generator and seed) are exported once as TSV and converted by PBG's own importer
(``torchbiggraph_import_from_tsv``'s functions, dynamic relations; its edge pass vectorized, see
``PBG_IMPORT``) into ``<pbg-venv>/data/``; the entity count
is padded to every entity, as the example's table holds them all. ``torchbiggraph_train`` then runs
with the example's settings mapped one to one where PBG has them (:func:`pbg_config`): dim,
TransE (``translation`` operator, ``l2`` comparator), logistic loss, learning rates, row-wise
Adagrad on entities, ``--nproc`` Hogwild workers of ``B / W`` edges a batch, uniform negatives
only. PBG corrupts both sides of every edge where the example corrupts one side a step, so
``--pbg-negatives`` (default ``--negatives / 2``) uniform negatives a side give the example's
negative scores per positive. PBG's figure is its own compute-only rate, parsed from its log:
edges processed over the compute time of its second edge chunk of ``--pbg-chunk-edges`` edges (the
first is its warm-up: worker processes starting, importing and first touching the table); the run
is stopped there, before PBG writes its next checkpoint. The remaining differences are listed
in docs/performance.md ("Knowledge-graph embeddings").

``--suite accuracy``: the real KGs (UMLS and Kinships from the pykeen wheel) and each ``--models``;
per pair, Frugal on W ranks, stock TorchRec table_wise on W ranks and one process, all with the
same seed, steps and global batch; the table gives filtered MRR and Hits@k, and Frugal's MRR
difference from the single process (acceptance: within 0.01). Exits 1 when a difference is larger.

    python benchmarks/bench_graph.py --json benchmarks/results/graph_speed/run_N.json --plot benchmarks/results/graph
    python benchmarks/bench_graph.py --variants frugal table_wise row_wise pbg --json benchmarks/results/graph_pbg.json
    python benchmarks/bench_graph.py --suite accuracy --json benchmarks/results/graph_accuracy.json --plot benchmarks/results/graph

``--pool A.json B.json ...`` runs nothing: it reads earlier speed results and prints each one's
paired ratios and those of all their repetitions together (one invocation's median moves with the
machine; the repetitions of several invocations show the spread).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a script: `benchmarks`, `examples`, and `torchrec_frugal` where no installed one wins
    sys.path.append(str(ROOT))

from examples.demo import TrainRunError, run_train  # noqa: E402
from benchmarks.measure import median_or_nan  # noqa: E402

TRAIN_PY = ROOT / "examples" / "graph" / "train.py"
SPEED_VARIANTS = ("frugal", "frugal_cached", "table_wise", "row_wise", "column_wise", "alone", "pbg")
DEFAULT_SPEED_VARIANTS = ("frugal", "table_wise", "row_wise", "alone")
PBG_VERSION = "1.0.0"
# PBG's log line at the end of an edge chunk: edges trained and the compute time of the chunk.
PBG_PROCESSED = re.compile(r"Processed (\d+) edges in ([0-9.]+) s")
# PBG's TSV importer (torchbiggraph.converters.import_from_tsv) with its edge pass vectorized: its
# own functions find the relation types and entities and write their dictionaries; the edges are
# mapped through those dictionaries and written by its edge storage in one append, the same file
# its edge pass writes one edge at a time (which takes most of an hour for 8M edges).
PBG_IMPORT = """
import sys
from pathlib import Path
from torchbiggraph.config import ConfigFileLoader
from torchbiggraph.converters.import_from_tsv import (
    collect_entities_by_type, collect_relation_types, generate_entity_path_files, parse_config_partial)
from torchbiggraph.edgelist import EdgeList
from torchbiggraph.entitylist import EntityList
from torchbiggraph.graph_storages import EDGE_STORAGES, ENTITY_STORAGES, RELATION_TYPE_STORAGES
import numpy as np
import torch

config, tsv = sys.argv[1], Path(sys.argv[2])
entity_configs, relation_configs, entity_path, edge_paths, dynamic = parse_config_partial(
    ConfigFileLoader().load_raw_config(config))
relation_types = collect_relation_types(relation_configs, [tsv], dynamic, 1, 1)
entities = collect_entities_by_type(relation_types, entity_configs, relation_configs, [tsv], dynamic, 0, 2, 1, 1)
generate_entity_path_files(ENTITY_STORAGES.make_instance(entity_path), entities,
                           RELATION_TYPE_STORAGES.make_instance(entity_path), relation_types, dynamic)
triples = torch.from_numpy(np.fromfile(tsv, dtype=np.int64, sep=" ").reshape(-1, 3))

def lookup(names):
    words = torch.tensor([int(w) for w in names])
    out = torch.full((int(words.max()) + 1,), -1, dtype=torch.long)
    out[words] = torch.arange(len(names))
    return out

(entity_dict,) = entities.values()
entity_ix, relation_ix = lookup(entity_dict.get_list()), lookup(relation_types.get_list())
lhs, rel, rhs = entity_ix[triples[:, 0]], relation_ix[triples[:, 1]], entity_ix[triples[:, 2]]
storage = EDGE_STORAGES.make_instance(edge_paths[0])
storage.prepare()
with storage.save_edges_by_appending(0, 0) as appender:
    appender.append_edges(EdgeList(EntityList.from_tensor(lhs), EntityList.from_tensor(rhs), rel))
print(f"- Processed {len(rel)} edges in total")
"""
ACCURACY_DATASETS = ("umls", "kinships")
# Settings per model for the small real KGs (global batch, 2 ranks divide it evenly).
ACCURACY_ARGS: Dict[str, List[str]] = {
    "complex": ["--dim", "400", "--regularization", "3e-3", "--lr", "0.2"],
    "distmult": ["--dim", "400", "--regularization", "3e-3"],
    "transe_l1": ["--dim", "400", "--gamma", "12", "--adversarial-temperature", "1"],
}


def speed_variants(args: argparse.Namespace) -> List[Tuple[str, int, List[str]]]:
    """(name, ranks, train.py arguments) of each speed variant."""
    common = [
        "--dataset", "synthetic", "--synthetic-entities", str(args.entities), "--synthetic-triples", str(args.triples),
        "--synthetic-relations", str(args.relations), "--synthetic-skew", str(args.skew), "--model", args.model,
        "--dim", str(args.dim), "--lr", str(args.lr),
        "--chunk-size", str(args.chunk_size), "--negatives", str(args.negatives), "--steps", str(args.steps),
        "--seed", str(args.seed), "--log-every", "0", "--no-eval", "--loader-workers", str(args.loader_workers),
    ]  # fmt: skip
    w, b = args.nproc, args.batch_size
    table = {
        "frugal": (w, ["--sharder", "frugal", "--batch-size", str(b)]),
        "frugal_cached": (w, ["--sharder", "frugal", "--cache-ratio", "0.05", "--batch-size", str(b)]),
        "table_wise": (w, ["--sharder", "torchrec", "--sharding", "table_wise", "--batch-size", str(b)]),
        "row_wise": (w, ["--sharder", "torchrec", "--sharding", "row_wise", "--batch-size", str(b)]),
        "column_wise": (w, ["--sharder", "torchrec", "--sharding", "column_wise", "--batch-size", str(b)]),
        "alone": (1, ["--sharder", "torchrec", "--sharding", "table_wise", "--batch-size", str(b // w)]),
        "pbg": (w, []),  # run_pbg reads args itself
    }
    return [(name, table[name][0], table[name][1] + common) for name in args.variants]


def accuracy_variants(args: argparse.Namespace) -> List[Tuple[str, int, List[str]]]:
    out = []
    for ds in args.datasets:
        for model in args.models:
            common = ["--dataset", ds, "--model", model, "--steps", str(args.accuracy_steps), "--batch-size", "512",
                      "--chunk-size", "64", "--negatives", "64", "--seed", str(args.seed), "--log-every", "0",
                      *ACCURACY_ARGS[model]]  # fmt: skip
            out += [
                (f"{ds}/{model}/frugal", args.nproc, ["--sharder", "frugal", *common]),
                (f"{ds}/{model}/table_wise", args.nproc, ["--sharder", "torchrec", "--sharding", "table_wise", *common]),
                (f"{ds}/{model}/single", 1, ["--sharder", "torchrec", "--sharding", "table_wise", *common]),
            ]
    return out


# ---------------------------------------------------------------------------- PyTorch-BigGraph
def pinned_torch() -> str:
    """The torch requirement of requirements-cpu.txt (the pinned CPU stack)."""
    for line in (ROOT / "requirements-cpu.txt").read_text().splitlines():
        if line.strip().startswith("torch=="):
            return line.strip()
    raise RuntimeError("requirements-cpu.txt pins no torch")


def pbg_venv(venv: Path) -> Path:
    """The PBG virtual environment's bin folder, made when missing."""
    bin_dir = venv / "bin"
    if not (bin_dir / "torchbiggraph_train").exists():
        print(f"[bench_graph] making {venv}: {pinned_torch()}, torchbiggraph=={PBG_VERSION}", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "-q", pinned_torch(),
                        f"torchbiggraph=={PBG_VERSION}", "setuptools<81"], check=True)  # fmt: skip
    return bin_dir


def pbg_data(args: argparse.Namespace) -> Tuple[Path, int]:
    """PBG's entity and edge files of the example's synthetic training triples, and their count:
    exported (TSV) and imported by PBG's importer once per graph, then reused."""
    from examples.graph.data import load_dataset

    name = f"synthetic-{args.entities}e-{args.relations}r-{args.triples}t-s{args.skew:g}-seed{args.seed}"
    root = args.pbg_venv / "data" / name
    done = root / "imported.json"
    if done.is_file():
        return root, json.loads(done.read_text())["edges"]
    root.mkdir(parents=True, exist_ok=True)
    data = load_dataset("synthetic", synthetic=dict(num_entities=args.entities, num_relations=args.relations,
                                                    num_triples=args.triples, skew=args.skew, seed=args.seed))  # fmt: skip
    tsv = root / "train.tsv"
    print(f"[bench_graph] exporting {data.train.shape[0]:,} training triples of {data.name} to {tsv}", flush=True)
    with open(tsv, "w") as f:
        f.write("\n".join(map("\t".join, data.train.numpy().astype(str).tolist())) + "\n")
    config = pbg_config(args, root, root / "checkpoint", 1)
    bin_dir = pbg_venv(args.pbg_venv)
    subprocess.run([str(bin_dir / "python"), "-c", PBG_IMPORT, str(config), str(tsv)], check=True, cwd=root)
    # every entity has a row, as in the example's table (the importer counts those seen in edges)
    (root / "entities" / "entity_count_entity_0.txt").write_text(f"{args.entities}\n")
    tsv.unlink()
    done.write_text(json.dumps({"edges": int(data.train.shape[0]), "entities": args.entities}) + "\n")
    return root, int(data.train.shape[0])


def pbg_config(args: argparse.Namespace, root: Path, checkpoint: Path, edge_chunks: int) -> Path:
    """A PBG config file with the example's settings mapped one to one (where PBG has them)."""
    from examples.graph.models import KGEConfig

    bound = KGEConfig(model=args.model, dim=args.dim).init_bound
    config = dict(
        entity_path=str(root / "entities"),
        edge_paths=[str(root / "edges")],
        checkpoint_path=str(checkpoint),
        entities={"entity": {"num_partitions": 1}},
        relations=[{"name": "all", "lhs": "entity", "rhs": "entity", "operator": "translation"}],
        dynamic_relations=True,
        dimension=args.dim,
        init_scale=bound / math.sqrt(3.0),  # PBG draws N(0, scale^2): the std of the example's U(-bound, bound)
        global_emb=False,
        comparator="l2",
        loss_fn="logistic",
        lr=args.lr,
        relation_lr=args.lr,
        num_epochs=1,
        num_edge_chunks=edge_chunks,
        batch_size=args.batch_size // args.nproc,
        workers=args.nproc,
        num_batch_negs=0,
        num_uniform_negs=args.pbg_negatives,
        eval_fraction=0.0,
        hogwild_delay=0.0,
        background_io=False,
    )
    path = checkpoint.parent / f"config_{checkpoint.name}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"def get_torchbiggraph_config():\n    return {config!r}\n")
    return path


def _posix_semaphores() -> Set[str]:
    """Names of the multiprocessing semaphores in /dev/shm (Linux; empty elsewhere)."""
    shm = Path("/dev/shm")
    return {p.name for p in shm.glob("sem.mp-*")} if shm.is_dir() else set()


def run_pbg(args: argparse.Namespace, threads: int, timeout: float) -> Dict[str, Any]:
    """One PBG training run, stopped after its second edge chunk: PBG's compute-only rate of that chunk
    (the first is its warm-up: its workers start, import and touch the table while it is timed)."""
    root, edges = pbg_data(args)
    bin_dir = pbg_venv(args.pbg_venv)
    chunks = max(2, round(edges / args.pbg_chunk_edges))
    with tempfile.TemporaryDirectory(prefix="pbg_run_") as tmp:
        config = pbg_config(args, root, Path(tmp) / "checkpoint", chunks)
        cmd = [str(bin_dir / "torchbiggraph_train"), str(config)]
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONWARNINGS="ignore")
        semaphores = _posix_semaphores()
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                start_new_session=True)  # fmt: skip
        timer = threading.Timer(timeout, lambda: os.killpg(proc.pid, signal.SIGKILL))
        timer.start()
        log: List[str] = []
        chunks_seen: List["re.Match[str]"] = []
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.append(line)
                m = PBG_PROCESSED.search(line)
                if m:
                    chunks_seen.append(m)
                    if len(chunks_seen) == 2:
                        break
        finally:
            timer.cancel()
            os.killpg(proc.pid, signal.SIGKILL)  # PBG and its Hogwild workers, before the checkpoint
            proc.wait()
            # killed, PBG's processes leave their multiprocessing semaphores behind: unlink the ones
            # that appeared during the run (nothing else of the benchmark runs meanwhile)
            for name in _posix_semaphores() - semaphores:
                Path("/dev/shm", name).unlink(missing_ok=True)
        if len(chunks_seen) < 2:
            raise TrainRunError(f"PBG printed no second edge chunk: {' '.join(cmd)}\n...{''.join(log)[-4000:]}")
    n, s = int(chunks_seen[1].group(1)), float(chunks_seen[1].group(2))
    return {
        "samples_per_second": n / s, "pbg_edges": n, "pbg_compute_s": s, "pbg_edge_chunks": chunks,
        "pbg_first_chunk_per_second": int(chunks_seen[0].group(1)) / float(chunks_seen[0].group(2)),
        "wall_s": time.perf_counter() - t0, "loss": None, "mrr": None, "hits_at_1": None, "hits_at_3": None,
        "hits_at_10": None, "gate_stall_fraction": 0.0, "command": f"torchbiggraph_train {config.name}",
        "pbg_config": config.name, "pbg_log_tail": "".join(log[-5:]).replace(f"{ROOT}/", ""),
    }  # fmt: skip


def run_all(args: argparse.Namespace, variants: List[Tuple[str, int, List[str]]]) -> List[Dict[str, Any]]:
    from tqdm import tqdm

    repeats, threads, timeout = args.repeats, args.threads, args.timeout
    if any(name == "pbg" for name, _, _ in variants):
        pbg_data(args)  # made before the first timed run

    order = [(r, (r + k) % len(variants)) for r in range(repeats) for k in range(len(variants))]
    runs: List[Dict[str, Any]] = []
    bar = tqdm(order, unit="run", dynamic_ncols=True, desc="bench_graph")
    for rep, vi in bar:
        name, nproc, targs = variants[vi]
        bar.set_postfix_str(f"r{rep} {name}")
        rec: Dict[str, Any] = {"variant": name, "repeat": rep}
        try:
            if name == "pbg":
                s = run_pbg(args, threads, timeout)
            else:
                s = run_train(TRAIN_PY, targs, nproc=nproc, threads=threads, timeout_s=timeout)
            rec["summary"] = s
            mrr = "" if s["mrr"] is None else f" | MRR {s['mrr']:.4f}"
            loss = "" if s["loss"] is None else f" | loss {s['loss']:.4f}"
            bar.write(f"r{rep} {name:<28} {s['samples_per_second']:>9,.0f} triples/s{loss}{mrr} | "
                      f"gate stall {100 * s['gate_stall_fraction']:.1f}% | {s['wall_s']:.0f} s wall")  # fmt: skip
        except TrainRunError as e:
            rec["error"] = str(e)
            bar.write(f"r{rep} {name}: FAILED {str(e)[:2000]}")
        runs.append(rec)
    bar.close()
    return runs


def medians(variants: List[Tuple[str, int, List[str]]], runs: List[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    out: Dict[str, Dict[str, Any]] = {}
    for name, nproc, _ in variants:
        rs = [r["summary"] for r in runs if r["variant"] == name and r.get("summary")]
        keys = ("samples_per_second", "mrr", "hits_at_1", "hits_at_3", "hits_at_10", "loss", "gate_stall_fraction")
        out[name] = {"runs": len(rs), "nproc": nproc, **{k: median_or_nan([s[k] for s in rs]) for k in keys}}
        out[name]["samples_per_second_min"] = min((s["samples_per_second"] for s in rs), default=float("nan"))
        out[name]["samples_per_second_max"] = max((s["samples_per_second"] for s in rs), default=float("nan"))
        out[name]["command"] = rs[0]["command"] if rs else None
    return out


STOCK_VARIANTS = ("table_wise", "row_wise", "column_wise")


def paired_ratios(runs: List[Dict[str, Any]], variant: str, against: Sequence[str]) -> List[float]:
    """``variant``'s triples/s over the fastest of ``against`` within each repetition that ran
    both, in repetition order: the same moment of the machine on both sides of each ratio."""
    by_rep: Dict[int, Dict[str, float]] = {}
    for r in runs:
        if r.get("summary"):
            by_rep.setdefault(r["repeat"], {})[r["variant"]] = r["summary"]["samples_per_second"]
    return [d[variant] / max(d[v] for v in against if v in d) for _, d in sorted(by_rep.items())
            if variant in d and any(v in d for v in against)]  # fmt: skip


def speed_table(med: Dict[str, Dict[str, Any]], nproc: int, runs: List[Dict[str, Any]]) -> Tuple[str, Dict[str, Any]]:
    stock = [v for v in STOCK_VARIANTS if med.get(v, {}).get("runs")]
    best = max(stock, key=lambda v: med[v]["samples_per_second"]) if stock else None
    perfect = nproc * med["alone"]["samples_per_second"] if med.get("alone", {}).get("runs") else None
    # paired ratios: frugal / best stock (and / PBG) within each repetition, then the median
    paired, paired_pbg = paired_ratios(runs, "frugal", stock), paired_ratios(runs, "frugal", ["pbg"])
    cached, cached_pbg = paired_ratios(runs, "frugal_cached", stock), paired_ratios(runs, "frugal_cached", ["pbg"])
    lines = ["| variant | ranks | triples/s (median) | min-max | vs best stock | vs perfect scaling | gate stall |",
             "|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for name, o in med.items():
        vs_best = o["samples_per_second"] / med[best]["samples_per_second"] if best else None
        vs_perfect = o["samples_per_second"] / perfect if perfect and name != "alone" else None
        lines.append(
            f"| {name} | {o['nproc']} | {o['samples_per_second']:,.0f} | {o['samples_per_second_min']:,.0f}-"
            f"{o['samples_per_second_max']:,.0f} | {'-' if vs_best is None else f'{vs_best:.2f}x'} | "
            f"{'-' if vs_perfect is None else f'{vs_perfect:.2f}'} | {100 * o['gate_stall_fraction']:.1f}% |"
        )
    facts = {
        "best_stock": best,
        "perfect_scaling": perfect,
        "frugal_vs_best_stock_paired": median_or_nan(paired) if paired else None,
        "frugal_vs_pbg_paired": median_or_nan(paired_pbg) if paired_pbg else None,
        "frugal_cached_vs_best_stock_paired": median_or_nan(cached) if cached else None,
        "frugal_cached_vs_pbg_paired": median_or_nan(cached_pbg) if cached_pbg else None,
    }
    if paired:
        lines.append(f"\nFrugal / best stock ({best}), median of per-repetition ratios: {median_or_nan(paired):.2f}x")
    if paired_pbg:
        lines.append(f"Frugal / PBG (compute-only), median of per-repetition ratios: {median_or_nan(paired_pbg):.2f}x")
    if cached:
        lines.append(f"Frugal cached (0.05) / best stock ({best}), median of per-repetition ratios: {median_or_nan(cached):.2f}x")
    if cached_pbg:
        lines.append(f"Frugal cached (0.05) / PBG (compute-only), median of per-repetition ratios: {median_or_nan(cached_pbg):.2f}x")
    return "\n".join(lines), facts


def pooled_table(results: Sequence[Tuple[str, Dict[str, Any]]]) -> Tuple[str, Dict[str, Any]]:
    """Frugal's paired ratios to the best stock sharding and to PBG in each speed result (``name``,
    its JSON), and over all their repetitions together."""
    lines = ["| result | repetitions | frugal / best stock, paired (by repetition) | frugal / PBG, paired |",
             "|---|---:|---|---:|"]  # fmt: skip
    every_stock: List[float] = []
    every_pbg: List[float] = []
    for name, result in results:
        runs = result["runs"]
        stock = paired_ratios(runs, "frugal", STOCK_VARIANTS)
        pbg = paired_ratios(runs, "frugal", ["pbg"])
        every_stock += stock
        every_pbg += pbg
        by_rep = ", ".join(f"{x:.2f}" for x in stock)
        lines.append(f"| {name} | {len(stock)} | {median_or_nan(stock):.3f}x ({by_rep}) | {median_or_nan(pbg):.2f}x |")
    facts = {
        "repetitions": len(every_stock),
        "frugal_vs_best_stock_paired": median_or_nan(every_stock),
        "frugal_vs_pbg_paired": median_or_nan(every_pbg),
        "frugal_vs_best_stock_sorted": sorted(every_stock),
    }
    lines.append(
        f"\nAll {len(every_stock)} repetitions: frugal / best stock {facts['frugal_vs_best_stock_paired']:.3f}x, "
        f"frugal / PBG {facts['frugal_vs_pbg_paired']:.2f}x (paired medians)"
    )
    lines.append("Frugal / best stock, sorted: " + ", ".join(f"{x:.2f}" for x in facts["frugal_vs_best_stock_sorted"]))
    return "\n".join(lines), facts


def accuracy_table(med: Dict[str, Dict[str, Any]], tolerance: float) -> Tuple[str, bool]:
    lines = ["| dataset | model | run | ranks | MRR | Hits@1 | Hits@3 | Hits@10 | MRR - single |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    ok = True
    for name, o in med.items():
        ds, model, run = name.split("/")
        single = med.get(f"{ds}/{model}/single", {}).get("mrr")
        diff = o["mrr"] - single if single is not None and run != "single" else None
        if run == "frugal" and (diff is None or abs(diff) > tolerance):
            ok = False
        lines.append(f"| {ds} | {model} | {run} | {o['nproc']} | {o['mrr']:.4f} | {o['hits_at_1']:.4f} | "
                     f"{o['hits_at_3']:.4f} | {o['hits_at_10']:.4f} | {'-' if diff is None else f'{diff:+.4f}'} |")  # fmt: skip
    lines.append(f"\nFrugal within {tolerance} MRR of the single process on every pair: {'PASS' if ok else 'FAIL'}")
    return "\n".join(lines), ok


def plot(result: Dict[str, Any], prefix: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    med = result["medians"]
    names = list(med)
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(names) + 2), 4))
    if result["suite"] == "speed":
        vals = [med[n]["samples_per_second"] for n in names]
        err = [[v - med[n]["samples_per_second_min"] for n, v in zip(names, vals)],
               [med[n]["samples_per_second_max"] - v for n, v in zip(names, vals)]]  # fmt: skip
        colors = ["tab:green" if n.startswith("frugal") else "tab:gray" if n == "alone" else "tab:blue" for n in names]
        ax.bar(names, vals, yerr=err, color=colors, capsize=4)
        perfect = result["facts"].get("perfect_scaling")
        if perfect:
            ax.axhline(perfect, color="k", ls="--", lw=1, label=f"perfect scaling ({result['config']['nproc']} x alone)")
            ax.legend()
        ax.set_ylabel("triples/s (median)")
        out = prefix.with_name(prefix.name + "_throughput.png")
    else:
        vals = [med[n]["mrr"] for n in names]
        colors = ["tab:green" if n.endswith("frugal") else "tab:gray" if n.endswith("single") else "tab:blue" for n in names]
        ax.bar(range(len(names)), vals, color=colors)
        ax.set_xticks(range(len(names)), [n.replace("/", "\n") for n in names], fontsize=7)
        ax.set_ylabel("filtered MRR (test)")
        ax.set_ylim(0, 1)
        out = prefix.with_name(prefix.name + "_accuracy.png")
    lines = [line for part in result["headline"].split("; ") for line in textwrap.wrap(part, 64)]
    ax.set_title("\n".join(lines), fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", choices=("speed", "accuracy"), default="speed")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None, help="torch threads per rank (default: cores // nproc)")
    ap.add_argument("--repeats", type=int, default=None, help="default: 3 (speed), 1 (accuracy)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=1200.0, help="seconds per run")
    ap.add_argument("--variants", nargs="+", choices=SPEED_VARIANTS, default=list(DEFAULT_SPEED_VARIANTS))
    ap.add_argument("--entities", type=int, default=2_000_000)
    ap.add_argument("--relations", type=int, default=1_000)
    ap.add_argument("--triples", type=int, default=8_000_000)
    ap.add_argument("--skew", type=float, default=1.1, help="Zipf exponent of entity degrees")
    ap.add_argument("--lr", type=float, default=0.1, help="speed suite: entity and relation learning rate")
    ap.add_argument("--model", default="transe_l2", help="speed suite model")
    ap.add_argument("--dim", type=int, default=400, help="speed suite (the paper's TransE dim)")
    ap.add_argument("--batch-size", type=int, default=1024, help="speed suite, global")
    ap.add_argument("--chunk-size", type=int, default=128)
    ap.add_argument("--negatives", type=int, default=128)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--loader-workers", type=int, default=0,
                    help="speed suite, train.py's: 0 makes each batch on the training thread (about 0.9 ms, less than "
                         "receiving it from a worker), with no worker process beside the ranks on the cores")  # fmt: skip
    ap.add_argument("--pbg-venv", type=Path, default=ROOT / ".venv-pbg", help="PBG's environment (made when missing) and data")
    ap.add_argument("--pbg-negatives", type=int, default=None,
                    help="PBG's uniform negatives per side (default: --negatives / 2, the example's scores per positive)")
    ap.add_argument("--pbg-chunk-edges", type=int, default=150_000,
                    help="PBG: edges of an edge chunk (the second is timed; about the example's timed triples)")
    ap.add_argument("--datasets", nargs="+", choices=ACCURACY_DATASETS, default=list(ACCURACY_DATASETS))
    ap.add_argument("--models", nargs="+", choices=sorted(ACCURACY_ARGS), default=sorted(ACCURACY_ARGS))
    ap.add_argument("--accuracy-steps", type=int, default=1500)
    ap.add_argument("--tolerance", type=float, default=0.01)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--plot", type=Path, default=None, help="PNG prefix")
    ap.add_argument("--pool", type=Path, nargs="+", default=None, metavar="JSON",
                    help="run nothing: the paired ratios of these speed results, each and pooled")
    args = ap.parse_args(argv)
    if args.repeats is None:
        args.repeats = 3 if args.suite == "speed" else 1
    if args.threads is None:
        args.threads = max(1, (os.cpu_count() or 1) // args.nproc)
    if args.pbg_negatives is None:
        args.pbg_negatives = max(1, args.negatives // 2)
    return args


def relative_to_root(path: Path) -> str:
    """``path`` as recorded in results: relative to the checkout where it lies in it, so that the
    recorded JSON does not carry this machine's directories."""
    resolved = path.resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else str(path)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.pool:
        table, _ = pooled_table([(relative_to_root(p), json.loads(p.read_text())) for p in args.pool])
        print(table)
        return 0
    variants = speed_variants(args) if args.suite == "speed" else accuracy_variants(args)
    t0 = time.perf_counter()
    runs = run_all(args, variants)
    med = medians(variants, runs)
    status = 0
    facts: Dict[str, Any] = {}
    if args.suite == "speed":
        table, facts = speed_table(med, args.nproc, runs)
        headline = (f"synthetic KG {args.entities:,} entities, {args.triples:,} triples, {args.model} dim {args.dim}, "
                    f"batch {args.batch_size}; {args.nproc} ranks x {args.threads} thread(s), {args.repeats} repetition(s)")  # fmt: skip
    else:
        table, ok = accuracy_table(med, args.tolerance)
        status = 0 if ok else 1
        headline = f"{', '.join(args.datasets)}: {args.accuracy_steps} steps, {args.nproc} ranks vs one process, seed {args.seed}"
    failed = [r for r in runs if r.get("error")]
    if failed:
        table += f"\n\n{len(failed)} run(s) failed (errors in the JSON)"
        status = 2
    print(f"\n{headline}; {os.cpu_count()} CPUs; {time.perf_counter() - t0:.0f} s\n\n{table}")
    result = {
        "suite": args.suite,
        "headline": headline,
        "total_wall_s": time.perf_counter() - t0,
        "config": {k: (relative_to_root(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "runs": runs,
        "medians": med,
        "facts": facts,
        "table_markdown": table,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
        print(f"[bench_graph] wrote {args.json}")
    if args.plot:
        print(f"[bench_graph] wrote {plot(result, args.plot)}")
    return status


if __name__ == "__main__":
    sys.exit(main())
