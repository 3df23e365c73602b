"""examples/graph/train.py end to end: Frugal on 2 ranks against one process, same seeds and steps.

The sampler and the init do not depend on the number of ranks, and TorchRec divides embedding
gradients by the world size, so 2 ranks take the single process's steps: the trained tables agree
to float rounding and the MRRs match. The real-data test fetches the pykeen wheel (PyPI); with
FRUGAL_OFFLINE=1 it is skipped, never silently.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, List

import pytest
import torch

from examples.graph.evaluate import published_range
from examples.graph.models import KGEConfig, seeded_uniform_
from examples.demo import run_train, run_train_nodes
from runs import Runs

TRAIN_PY = Path(__file__).resolve().parents[2] / "examples" / "graph" / "train.py"
SYNTHETIC = [
    "--dataset", "synthetic", "--synthetic-entities", "3000", "--synthetic-relations", "12",
    "--synthetic-triples", "30000", "--model", "complex", "--dim", "32", "--batch-size", "256",
    "--chunk-size", "32", "--negatives", "16", "--steps", "200", "--log-every", "0", "--seed", "3",
]  # fmt: skip


def initial_tables() -> Dict[str, torch.Tensor]:
    """The seeded init every run of SYNTHETIC starts from (train.py's --seed 3, ComplEx dim 32)."""
    bound = KGEConfig(model="complex", dim=32).init_bound
    return {
        "entities": seeded_uniform_(torch.empty(3000, 32), bound, seed=3),
        "relations": seeded_uniform_(torch.empty(12, 32), bound, seed=4),
    }


def train(args: List[str], nproc: int, tmp: Path, name: str, nodes: int = 1) -> Dict:
    """One run on ``nproc`` ranks, or on ``nodes`` torchrun launches of ``nproc`` ranks each."""
    tables = tmp / f"{name}.pt"
    args = args + ["--save-entities", str(tables)]
    if nodes > 1:
        summary = run_train_nodes(TRAIN_PY, args, nodes=nodes, nproc=nproc, threads=1, timeout_s=600)
    else:
        summary = run_train(TRAIN_PY, args, nproc=nproc, threads=1, timeout_s=600)
    summary["tables"] = torch.load(tables)
    return summary


@pytest.fixture(scope="module")
def synthetic_runs(tmp_path_factory) -> Runs:
    tmp = tmp_path_factory.mktemp("graph")
    return Runs({
        "single": lambda: train(SYNTHETIC + ["--sharder", "torchrec"], 1, tmp, "single"),
        "frugal": lambda: train(SYNTHETIC + ["--sharder", "frugal", "--cache-ratio", "0.05", "--lookahead", "4"], 2, tmp, "frugal"),
        # the example's defaults: on a CPU device no owner cache, L = 10
        "frugal_defaults": lambda: train(SYNTHETIC + ["--sharder", "frugal"], 2, tmp, "frugal_defaults"),
        "table_wise": lambda: train(SYNTHETIC + ["--sharder", "torchrec", "--sharding", "table_wise"], 2, tmp, "table_wise"),
        "row_wise": lambda: train(SYNTHETIC + ["--sharder", "torchrec", "--sharding", "row_wise"], 2, tmp, "row_wise"),
        # two machines of one rank each, as two torchrun --nnodes launches
        "frugal_row_wise": lambda: train(SYNTHETIC + ["--sharding", "frugal_row_wise"], 1, tmp, "frugal_row_wise", nodes=2),
    })


@pytest.mark.slow
def test_two_nodes_with_frugal_row_wise_train_stock_row_wise_tables(synthetic_runs) -> None:
    """frugal_row_wise on 2 nodes of 1 rank against stock row_wise on 2 ranks, which splits the
    entity table the same way: the same tables, to float rounding."""
    f, r = synthetic_runs["frugal_row_wise"], synthetic_runs["row_wise"]
    assert f["world_size"] == r["world_size"] == 2 and f["sharding"] == "frugal_row_wise"
    for key in ("entities", "relations"):
        assert (r["tables"][key] - f["tables"][key]).abs().max() < 1e-3 < (r["tables"][key] - initial_tables()[key]).abs().max()
        torch.testing.assert_close(f["tables"][key], r["tables"][key], rtol=1e-4, atol=1e-5, msg=key)
    assert abs(f["mrr"] - r["mrr"]) < 1e-3 and abs(f["loss"] - r["loss"]) < 1e-3


@pytest.mark.parametrize("run", ["frugal", "frugal_defaults", "table_wise", "frugal_row_wise"])
def test_two_ranks_train_the_single_process_tables(synthetic_runs, run: str) -> None:
    one, two = synthetic_runs["single"], synthetic_runs[run]
    assert two["world_size"] == 2 and one["world_size"] == 1 and two["steps"] == one["steps"] == 200
    for key in ("entities", "relations"):
        a, b = two["tables"][key], one["tables"][key]
        # training moved the tables far more than the tolerance, so a wrong step would show
        assert (b - initial_tables()[key]).abs().max() > 0.05
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3, msg=f"{run} {key}")
    assert abs(two["mrr"] - one["mrr"]) < 1e-3
    assert abs(two["loss"] - one["loss"]) < 1e-3


def test_the_default_cache_ratio_is_the_devices(synthetic_runs) -> None:
    """No owner cache on a CPU device unless asked for, and then no lookahead; the cache and the
    lookahead asked for are the ones used."""
    assert (synthetic_runs["frugal_defaults"]["cache_ratio"], synthetic_runs["frugal_defaults"]["lookahead"]) == (0.0, 0)
    assert (synthetic_runs["frugal"]["cache_ratio"], synthetic_runs["frugal"]["lookahead"]) == (0.05, 4)
    from torchrec_frugal.config import CACHE_RATIO, LOOKAHEAD
    from examples.graph.train import default_cache_ratio, default_lookahead

    assert default_cache_ratio(torch.device("cuda", 0)) == CACHE_RATIO > 0
    # a cache, or an accelerator (whose owners hold back the uncached rows' writes too), keeps the window
    assert default_lookahead(torch.device("cpu"), 0.05) == default_lookahead(torch.device("cuda", 0), 0.0) == LOOKAHEAD > 0


def test_the_default_loader_workers_are_the_cores(synthetic_runs) -> None:
    """A loader worker only where a rank has a core to spare for it (the number asked for is used:
    test_loader_workers_train_the_training_threads_tables)."""
    from examples.graph.train import default_loader_workers

    assert (default_loader_workers(1), default_loader_workers(2), default_loader_workers(16)) == (0, 1, 1)
    s = synthetic_runs["frugal_defaults"]
    cores = s["cores_per_rank"] if s["cores_per_rank"] is not None else (os.cpu_count() or 1) // s["world_size"]
    assert s["loader_workers"] == default_loader_workers(cores)


def test_frugal_summary(synthetic_runs) -> None:
    s = synthetic_runs["frugal"]
    for k in ("sharder", "dataset", "model", "steps", "samples_per_second", "mrr", "hits_at_1", "hits_at_3", "hits_at_10"):
        assert k in s, k
    assert s["sharder"] == "frugal" and s["sharding"] == "frugal" and s["dataset"].startswith("synthetic")
    assert s["samples_per_second"] > 0 and 0.0 <= s["gate_stall_fraction"] < 1.0
    assert 0.0 <= s["hits_at_1"] <= s["hits_at_3"] <= s["hits_at_10"] <= 1.0
    # learned the degree skew at least: well above the MRR of random scores over 3000 entities (~0.003)
    assert s["mrr"] > 0.01, s["mrr"]


def test_loader_workers_train_the_training_threads_tables(tmp_path) -> None:
    """Batches made by a DataLoader worker (--loader-workers 1) train exactly what
    batches made on the training thread train: short Frugal runs on one rank, bit for bit."""
    short = SYNTHETIC + ["--steps", "40", "--no-eval", "--sharder", "frugal", "--lookahead", "4"]  # the last --steps wins
    inline = train(short + ["--loader-workers", "0"], 1, tmp_path, "inline")
    workers = train(short + ["--loader-workers", "1"], 1, tmp_path, "workers")
    assert (inline["loader_workers"], workers["loader_workers"]) == (0, 1)
    assert inline["loss"] == workers["loss"]
    for key in ("entities", "relations"):
        assert torch.equal(inline["tables"][key], workers["tables"][key]), key
        assert not torch.equal(inline["tables"][key], initial_tables()[key]), key


REAL = ["--model", "complex", "--dim", "400", "--regularization", "3e-3", "--lr", "0.2", "--steps", "1500", "--batch-size", "512",
        "--chunk-size", "64", "--negatives", "64", "--log-every", "0", "--seed", "0"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("dataset", ["umls", "kinships"])
def test_real_kg_frugal_matches_single_process_and_published_range(dataset: str, tmp_path) -> None:
    from examples.graph.data import DatasetUnavailableError, load_dataset

    try:
        load_dataset(dataset)  # fetches the pykeen wheel once, into the cache
    except DatasetUnavailableError as e:
        if os.environ.get("FRUGAL_OFFLINE") == "1":
            pytest.skip(f"FRUGAL_OFFLINE=1 and the pykeen wheel is not cached: {e}")
        raise
    one = run_train(TRAIN_PY, REAL + ["--dataset", dataset, "--sharder", "torchrec"], nproc=1, threads=1, timeout_s=900)
    two = run_train(TRAIN_PY, REAL + ["--dataset", dataset, "--sharder", "frugal"], nproc=2, threads=1, timeout_s=900)
    assert two["world_size"] == 2 and two["sharder"] == "frugal"
    assert abs(two["mrr"] - one["mrr"]) <= 0.01, (two["mrr"], one["mrr"])
    lo, hi = published_range(dataset)
    assert lo <= two["mrr"] <= hi, f"{dataset}: MRR {two['mrr']:.4f} outside the published range [{lo}, {hi}]"
