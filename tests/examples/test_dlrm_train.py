"""examples/dlrm/train.py end to end: 2 ranks under torchrun (gloo, CPU), summary JSON checked."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from examples.dlrm.train import parse_args  # noqa: E402
from runs import Runs  # noqa: E402

SUMMARY_FIELDS = ("sharder", "steps", "samples_per_second", "loss", "auc", "gate_stall_fraction")
TINY = ["--scale", "0.001", "--batch-size", "64", "--steps", "40", "--warmup", "5", "--log-every", "20", "--threads", "1"]


def torchrun(args, tmp_path, nproc: int = 2, timeout: float = 240.0) -> dict:
    summary = tmp_path / "summary.json"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
        os.path.join(ROOT, "examples", "dlrm", "train.py"), *args, "--summary", str(summary), "--no-progress",
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    assert "[dlrm] {" in proc.stdout
    return dict(json.loads(summary.read_text()), stdout=proc.stdout)


def check_summary(s: dict, sharder: str, steps: int = 40, world: int = 2) -> None:
    for k in SUMMARY_FIELDS:
        assert k in s, k
    assert s["sharder"] == sharder and s["steps"] == steps and s["world_size"] == world
    assert s["timed_steps"] == steps - s["warmup_steps"]
    assert s["samples_per_second"] > 0
    assert 0.0 < s["loss"] < 5.0
    assert 0.0 <= s["auc"] <= 1.0
    assert 0.0 <= s["gate_stall_fraction"] <= 1.0


# Identical command lines but for --sharder: the frugal-only knobs are given to both (stock ignores them).
SAME = TINY + ["--steps", "60", "--auc-window", "20", "--cache-ratio", "0.05", "--lookahead", "4"]
SHARDER = {"torchrec": ["--sharder", "torchrec", "--sharding", "table_wise"], "frugal": ["--sharder", "frugal"]}


@pytest.fixture(scope="module")
def side_by_side(tmp_path_factory) -> Runs:
    return Runs({sh: (lambda sh=sh: torchrun(SAME + SHARDER[sh], tmp_path_factory.mktemp(sh))) for sh in ("torchrec", "frugal")})


def test_train_torchrec_table_wise_dlrm_learns(side_by_side):
    s = side_by_side["torchrec"]
    check_summary(s, "torchrec", steps=60)
    assert s["sharding"] == "table_wise" and s["model"] == "dlrm" and s["backend"] == "gloo"
    assert s["gate_stall_fraction"] == 0.0 and s["frugal"] is None
    assert s["auc"] > 0.6  # the planted labels are being learned (0.5 is chance)


def test_train_frugal_dlrm_learns(side_by_side):
    s = side_by_side["frugal"]
    check_summary(s, "frugal", steps=60)
    assert s["sharding"] == "frugal" and s["lookahead"] == 4 and s["cache_ratio"] == 0.05
    f = s["frugal"]
    assert 0.0 < f["planned_cache_ratio"] <= 0.05
    assert 0.0 < f["cache_hit_ratio"] < 1.0 and f["rows_flushed"] > 0 and f["bytes_flushed"] > 0
    assert len(f["gate_wait_s_per_rank"]) == 2
    assert s["auc"] > 0.6


def test_frugal_and_torchrec_train_alike(side_by_side):
    # Same data, optimizers and initial tables (drawn from the seed whatever the sharding): the
    # per-step losses agree to float rounding. A one-ulp difference in a row's update can flip a
    # ReLU of the dense layers some 25 steps in, and the losses then differ by about 1e-3: with
    # seeds 0-2, one run of three did so for the row-wise Adagrad's rounding of FBGEMM's kernels
    # (seed 0, step 27, 5.6e-4) and one for that of addcdiv_ (seed 2, step 32, 1.0e-3), the last
    # window's loss then 1.2e-4 apart and its AUC 5e-4. So the first 20 steps are held to float
    # rounding, the whole run to what a flip moves; a wrong update departs within the first steps.
    t, f = side_by_side["torchrec"], side_by_side["frugal"]
    assert len(t["step_losses"]) == len(f["step_losses"]) == 60 and f["step_losses_from"] == 0
    diffs = [abs(a - b) for a, b in zip(t["step_losses"], f["step_losses"])]
    assert max(d / abs(b) for d, b in zip(diffs[:20], t["step_losses"])) < 1e-5, diffs[:20]
    assert max(diffs) < 5e-3, diffs
    assert abs(t["auc"] - f["auc"]) < 1e-3, (t["auc"], f["auc"])
    assert abs(t["loss"] - f["loss"]) < 1e-3, (t["loss"], f["loss"])


def test_train_torchrec_row_wise_dlrm_on_criteo_npy(tmp_path):
    from torchrec.datasets.test_utils.criteo_test_utils import CriteoTest

    rng = np.random.default_rng(0)
    sparse = rng.integers(0, 2**31 - 1, size=(64 * 2 * 10, 26), dtype=np.int32)
    with CriteoTest._create_dataset_npys(num_rows=sparse.shape[0], filename="day_0", sparse=sparse) as paths:
        s = torchrun(
            TINY + ["--sharder", "torchrec", "--sharding", "row_wise", "--model", "dlrm",
                    "--data", "criteo-npy", "--data-path", os.path.dirname(paths[0])],
            tmp_path,
        )  # fmt: skip
    check_summary(s, "torchrec")  # 40 steps over 10 batches per rank: the files are cycled
    assert s["sharding"] == "row_wise" and s["model"] == "dlrm" and s["data"] == "criteo-npy"


# The paper's benchmark: one table of 33,762,578 x 0.001 rows, 26 ids a sample, SGD, MSE on random labels.
PAPER = ["--model", "paper", "--config", "criteo-kaggle", "--scale", "0.001", "--batch-size", "64", "--steps", "30",
         "--warmup", "5", "--log-every", "10", "--threads", "1", "--cache-ratio", "0.05", "--lookahead", "4"]  # fmt: skip


@pytest.fixture(scope="module")
def paper_runs(tmp_path_factory) -> Runs:
    runs = {
        "row_wise": ["--sharder", "torchrec", "--sharding", "row_wise"],
        "table_wise": ["--sharder", "torchrec", "--sharding", "table_wise"],
        "data_parallel": ["--sharder", "torchrec", "--sharding", "data_parallel"],
        "frugal": ["--sharder", "frugal"],
        "frugal_lr0": ["--sharder", "frugal", "--embedding-lr", "0"],  # the control: a table that does not train
    }
    return Runs({k: (lambda a=a, k=k: torchrun(PAPER + a, tmp_path_factory.mktemp(k))) for k, a in runs.items()})


def test_the_paper_model_trains_frugal_as_stock_step_by_step(paper_runs):
    """Frugal sums each row's gradients on every rank, then over ranks, as stock data_parallel's
    all-reduce does: the losses are the same floats. table_wise and row_wise sum them in one pass
    over all ranks' ids (FBGEMM's backward after the all-to-all): another order, float rounding apart."""
    frugal = paper_runs["frugal"]
    check_summary(frugal, "frugal", steps=30)
    assert frugal["model"] == "paper" and frugal["mlp"] == [32, 512, 256, 1] and frugal["loss_fn"] == "mse"
    assert frugal["tables"] == {"t_ids": {"rows": 33_763, "dim": 32, "ids_per_sample": 26}}
    assert frugal["embedding_optimizer"] == "sgd" and frugal["run_config"]["dense_optimizer"] == "sgd"
    assert "model paper (MLP 32-512-256-1, MSE, sgd on the table)" in frugal["stdout"]
    assert frugal["frugal"]["rows_flushed"] > 0
    for stock in ("row_wise", "table_wise"):
        s = paper_runs[stock]
        assert s["sharding"] == stock and s["tables"] == frugal["tables"]
        rel = [abs(a - b) / abs(b) for a, b in zip(frugal["step_losses"], s["step_losses"])]
        assert len(rel) == 30 and max(rel) < 1e-4, (stock, rel)
    assert frugal["step_losses"] == paper_runs["data_parallel"]["step_losses"]
    # the losses see the table: without its updates they leave stock's within a few steps
    rel = [abs(a - b) / abs(b) for a, b in zip(paper_runs["frugal_lr0"]["step_losses"], frugal["step_losses"])]
    assert rel[0] < 1e-6 and max(rel) > 1e-2, rel


def test_the_paper_model_reads_the_authors_files(tmp_path):
    rng = np.random.default_rng(0)
    samples = 64 * 2 * 5
    prefix = tmp_path / "avazu_binary"
    np.save(f"{prefix}.npy", rng.integers(0, 9_449_206, size=samples * 21))
    np.save(f"{prefix}_offsets.npy", np.arange(0, samples * 21 + 1, 21))
    s = torchrun(PAPER + ["--config", "avazu", "--sharder", "frugal", "--data", "paper-npy", "--data-path", str(prefix)], tmp_path)
    check_summary(s, "frugal", steps=30)
    assert s["data"] == "paper-npy" and s["tables"]["t_ids"]["ids_per_sample"] == 21 and s["tables"]["t_ids"]["rows"] == 9_450


def test_parse_args_defaults_and_errors():
    a = parse_args([])
    assert (a.config, a.sharder, a.sharding, a.model, a.batch_size, a.lookahead, a.cache_ratio) == (
        "criteo-kaggle", "frugal", "table_wise", "dlrm", 1024, 10, 0.05,  # table_wise: what --sharder torchrec takes
    )  # fmt: skip
    assert parse_args(["--sharder", "torchrec"]).sharding == "table_wise"
    assert parse_args(["--sharding", "frugal_row_wise"]).sharder == "frugal"
    assert a.warmup == 20
    for bad in (["--data", "criteo-tsv"], ["--steps", "0"], ["--steps", "5", "--warmup", "5"], ["--sharder", "x"]):
        with pytest.raises(SystemExit):
            parse_args(bad)
    assert parse_args(["--model", "paper", "--mlp", "256,1"]).mlp == (256, 1)


@pytest.mark.parametrize("argv, message", [
    (["--model", "paper", "--data", "criteo-npy", "--data-path", "x"], "--data criteo-npy holds Criteo's fields"),
    (["--data", "paper-npy", "--data-path", "x"], "train it with --model paper"),
    (["--mlp", "512,256,1"], "--mlp 512,256,1 shapes the paper's model"),
    (["--model", "paper", "--mlp", "512,256,2"], "ending in 1"),
    (["--model", "paper", "--mlp", "a,1"], "ending in 1"),
    (["--model", "paper", "--data", "paper-npy"], "needs --data-path"),
    (["--model", "paper", "--data", "paper-npy", "--data-path", "no/such/prefix"], "no/such/prefix.npy"),
    (["--sharding", "data_parallel"], "--sharding data_parallel is a stock TorchRec sharding"),
    (["--sharder", "torchrec", "--sharding", "frugal_row_wise"], "drop --sharder torchrec"),
    (["--lookahead", "-1"], "lookahead must be >= 0, got -1"),
    (["--cache-ratio", "1.5"], "cache_ratio"),
    (["--batch-size", "0"], "batch_size must be >= 1"),
])  # fmt: skip
def test_parse_args_refuses_bad_and_contradictory_options_in_one_line(argv, message, capsys, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err, err
    assert ": error: " in err.splitlines()[0] and len(err.splitlines()) == 2, err  # no usage screen
    monkeypatch.setenv("RANK", "1")  # the other ranks exit alike, silently
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    assert e.value.code == 2 and capsys.readouterr().err == ""


def test_the_cost_model_plans_the_run_and_the_pipeline_follows_its_lookahead(tmp_path):
    """--hardware: FrugalShardingPlanner picks each table's sharding, the cache ratio and L by the
    cost model; the summary records that plan, and the train pipeline runs the chosen L."""
    from torchrec_frugal.estimate.cost_model import LOOKAHEAD_CHOICES, PLANNER_SHARDINGS, cache_ratio_choices
    from torchrec_frugal.estimate.profiles import load_profile

    for nproc in (2, 1):  # on one rank the cpu profile prefers stock tables: the pipeline reads nothing ahead
        s = torchrun(TINY + ["--sharder", "frugal", "--hardware", "cpu", "--lookahead", "7"], tmp_path, nproc=nproc)
        check_summary(s, "frugal", world=nproc)
        plan = s["plan"]
        assert plan["hardware"] == "cpu" and len(plan["shardings"]) == 26
        assert set(plan["shardings"].values()) <= set(PLANNER_SHARDINGS)
        assert plan["lookahead"] in LOOKAHEAD_CHOICES and s["lookahead"] == plan["lookahead"]  # not the 7 asked for
        line = next(x for x in s["stdout"].splitlines() if x.startswith("[dlrm] plan: "))
        if "frugal" in plan["shardings"].values():
            assert plan["cache_ratio"] in cache_ratio_choices(load_profile("cpu"))
            assert s["frugal"]["planned_cache_ratio"] == plan["cache_ratio"]
            assert line.endswith(f"(cache {plan['cache_ratio']:g}, L={plan['lookahead']})"), line
        else:
            assert plan["lookahead"] == 0 and plan["cache_ratio"] is None and s["frugal"] is None
            assert "L=" not in line and "cache" not in line, line


@pytest.mark.slow
def test_two_nodes_train_frugal_row_wise_like_stock_row_wise():
    """Two torchrun launches (--nnodes 2, 2 ranks each) train the DLRM example with
    --sharding frugal_row_wise and with stock row_wise; both learn alike (from equal initial
    tables: frugal_row_wise engines take the seeded values after sharding), and no node leaves
    shared memory behind."""
    from examples.demo import run_train_nodes

    train_py = os.path.join(ROOT, "examples", "dlrm", "train.py")
    same = TINY + ["--steps", "60", "--auc-window", "20", "--count-comm"]
    runs = {
        name: run_train_nodes(train_py, same + flags, nodes=2, nproc=2, timeout_s=300)
        for name, flags in {"frugal_row_wise": ["--sharding", "frugal_row_wise"],
                            "row_wise": ["--sharder", "torchrec", "--sharding", "row_wise"]}.items()
    }  # fmt: skip
    f, r = runs["frugal_row_wise"], runs["row_wise"]
    assert f["world_size"] == r["world_size"] == 4 and f["sharding"] == "frugal_row_wise"
    assert set(f["plan"]["shardings"].values()) == {"frugal_row_wise"} and f["lookahead"] == 10
    assert f["frugal"]["rows_flushed"] > 0 and 0.0 < f["frugal"]["cache_hit_ratio"] < 1.0
    assert abs(f["auc"] - r["auc"]) < 0.01 and abs(f["loss"] - r["loss"]) < 0.01, (f["auc"], r["auc"], f["loss"], r["loss"])
    diffs = [abs(a - b) for a, b in zip(f["step_losses"], r["step_losses"])]
    assert diffs[0] < 1e-6 and max(diffs) < 5e-3, diffs  # equal initial tables; rounding grows at lr 0.05
    assert f["auc"] > 0.6
    # what crosses nodes: frugal_row_wise sends ids and pooled sums to the other node only;
    # row_wise also to the other rank of the same node
    fc, rc = f["comm"], r["comm"]
    assert fc["bytes_within_node_per_step"] == 0 and rc["bytes_within_node_per_step"] > 0
    assert 0 < fc["bytes_between_nodes_per_step"] <= rc["bytes_between_nodes_per_step"]


def test_two_nodes_plan_by_the_cost_model(tmp_path):
    """--hardware on two torchrun launches: the planner prices the nodes. With all-to-alls inside
    a node made very slow in the profile (GPUs without peer-to-peer, exaggerated), it puts every
    table on frugal_row_wise, which sends nothing within a node, and the run trains with the
    chosen L. (With a slow network instead, table_wise and table_row_wise send fewer bytes
    between nodes than frugal_row_wise's partial sums: tests/estimate/test_cost_model_nodes.py.)"""
    from dataclasses import replace

    from examples.demo import run_train_nodes
    from torchrec_frugal.estimate.profiles import load_profile

    cpu = load_profile("cpu")
    slow = replace(cpu, name="slow_a2a", a2a_bw=cpu.a2a_bw / 1e3)
    slow.save(tmp_path / "slow_a2a.json")
    train_py = os.path.join(ROOT, "examples", "dlrm", "train.py")
    args = TINY + ["--steps", "30", "--count-comm", "--sharder", "frugal", "--hardware", str(tmp_path / "slow_a2a.json")]
    s = run_train_nodes(train_py, args, nodes=2, nproc=2, timeout_s=300)
    assert set(s["plan"]["shardings"].values()) == {"frugal_row_wise"}, s["plan"]
    # a CPU device is host memory: no cache is among the choices (cache_ratio_choices)
    assert s["plan"]["lookahead"] == s["lookahead"] and 0 <= s["plan"]["cache_ratio"] <= 0.5
    assert s["comm"]["bytes_within_node_per_step"] == 0 and s["comm"]["bytes_between_nodes_per_step"] > 0


def test_hardware_without_the_frugal_sharder_is_refused(capsys):
    """--hardware plans with FrugalShardingPlanner: beside TorchRec's sharder it is an error, not ignored."""
    with pytest.raises(SystemExit):
        parse_args(["--sharder", "torchrec", "--hardware", "cpu"])
    assert "--hardware cpu plans with FrugalShardingPlanner" in capsys.readouterr().err
    assert parse_args(["--hardware", "cpu"]).hardware == "cpu"  # frugal, the default sharder


def test_plans_needing_fbgemm_cuda_kernels_are_refused_with_the_cpu_build():
    """On CUDA with FBGEMM's CPU build (what the plugin needs for "frugal" tables), a plan with
    stock or frugal_row_wise tables stops with a message naming them, not a dispatcher error."""
    import fbgemm_gpu
    import torch

    from examples.common import require_cuda_fbgemm

    assert fbgemm_gpu.__variant__ == "cpu"  # the pinned stack on this machine
    with pytest.raises(SystemExit, match=r"this plan \(frugal_row_wise, table_wise tables\) on CUDA .*CPU build"):
        require_cuda_fbgemm(torch.device("cuda", 0), "this plan (frugal_row_wise, table_wise tables)")
    require_cuda_fbgemm(torch.device("cpu"), "this plan (table_wise tables)")  # CPU kernels are there
