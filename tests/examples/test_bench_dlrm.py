"""benchmarks/bench_dlrm.py, plot_dlrm.py and the demo's train.py runner, without training anything."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from benchmarks import bench_dlrm as bench

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "examples" / "dlrm" / "train.py"


def test_schedule_round_robin_rotated():
    order = bench.schedule(3, 3)
    assert order == [(0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (1, 0), (2, 2), (2, 0), (2, 1)]


def test_default_steps():
    assert bench.default_steps(1024) == 200 and bench.default_steps(128) == 800
    assert bench.default_steps(1024, convergence=True) == 500


def test_plan_defaults_and_ablations(tmp_path):
    args = bench.parse_args([])
    vs, skipped = bench.build_plan(args, TRAIN)
    assert [v["id"] for v in vs] == ["frugal", "table_wise", "row_wise", "alone"]
    alone = vs[-1]
    assert alone["nproc"] == 1 and alone["kind"] == "alone"
    for v in vs:  # same configuration and data for every variant
        a = v["train_args"]
        assert a[a.index("--steps") + 1] == "200" and a[a.index("--batch-size") + 1] == "1024"
        assert a[a.index("--seed") + 1] == "0" and a[a.index("--config") + 1] == "criteo-kaggle"
    args = bench.parse_args(["--ablation", "all", "--steps", "7"])
    vs, skipped = bench.build_plan(args, TRAIN)
    ids = [v["id"] for v in vs]
    assert len(ids) == len(set(ids))
    by = {v["id"]: v for v in vs}
    assert set(by["frugal"]["ablations"]) >= {"lookahead", "cache", "batch"}  # L=10, cache 0.05 reused, not rerun
    assert "write_through" in by["frugal_L0"]["ablations"] and "lookahead" in by["frugal_L0"]["ablations"]
    assert {"frugal@b128", "table_wise@b128", "row_wise@b128", "alone@b128"} <= set(ids)
    assert all(v["steps"] == 7 for v in vs)
    if bench.train_has_flag(TRAIN, "--queue"):
        assert "frugal_heap" in ids and not skipped
    else:
        assert "frugal_heap" not in ids and "heap" in skipped[0]


def _fake_summary(sps, sharder="torchrec", frugal=False, steps=10):
    s = {"samples_per_second": sps, "gate_stall_fraction": 0.01 if frugal else 0.0, "loss": 0.5, "auc": 0.7,
         "auc_first_window": 0.6, "steps": steps, "wall_s": 20.0, "foreign_cpu_share": 0.1, "run_cpu_s": 30.0,
         "command": "torchrun ...", "sharder": sharder, "scale": 0.1,
         "frugal": {"cache_hit_ratio": 0.2, "rows_flushed": 1000} if frugal else None}  # fmt: skip
    return s


def _fake_result(tmp_path):
    args = bench.parse_args(["--ablation", "lookahead", "write_through", "--repeats", "2"])
    vs, skipped = bench.build_plan(args, TRAIN)
    speeds = {"frugal": [30e3, 34e3], "table_wise": [20e3, 22e3], "row_wise": [18e3, 19e3], "alone": [20e3, 20e3]}
    runs = []
    for rep, vi in bench.schedule(len(vs), 2):
        v = vs[vi]
        sps = speeds.get(v["id"], [25e3, 26e3])[rep]
        runs.append({"variant": v["id"], "repeat": rep, "summary": _fake_summary(sps, frugal=v["kind"] == "frugal")})
    med = bench.summarize(vs, runs, 2)
    return args, vs, runs, med, skipped


def test_summarize_ratios(tmp_path):
    args, vs, runs, med, _ = _fake_result(tmp_path)
    f = med["frugal"]
    assert f["samples_per_second"] == 32e3 and f["best_stock"] == "table_wise"
    assert f["vs_best_stock"] == pytest.approx(32e3 / 21e3)
    assert f["vs_best_stock_paired"] == pytest.approx((30 / 20 + 34 / 22) / 2)
    assert f["perfect_scaling_samples_per_second"] == 40e3 and f["vs_perfect"] == pytest.approx(0.8)
    assert med["frugal_L2"]["vs_frugal_paired"] == pytest.approx((25 / 30 + 26 / 34) / 2)
    md = bench.markdown_tables(vs, med, 2)
    assert "| frugal (cache 0.05, L=10) | 2 | 32,000 |" in md and "perfect scaling (2 x alone) | 2 | 40,000" in md
    assert "ablation `lookahead`" in md and "ablation `write_through`" in md
    assert any("0.80x" in g for g in bench.goal_lines(vs, med))


def test_step_loss_difference_against_stock_of_the_same_repetition():
    args = bench.parse_args(["--variants", "frugal", "table_wise", "row_wise", "--repeats", "2", "--model", "paper"])
    vs, _ = bench.build_plan(args, TRAIN)
    assert all(v["train_args"][v["train_args"].index("--model") + 1] == "paper" for v in vs)
    losses = {"frugal": [1.0, 0.5, 0.25], "table_wise": [1.0, 0.5, 0.25], "row_wise": [1.0, 0.5000001, 0.25]}
    runs = []
    for rep, vi in bench.schedule(len(vs), 2):
        v = vs[vi]
        s = _fake_summary(30e3, frugal=v["kind"] == "frugal")
        s["step_losses"] = list(losses[v["id"]])
        if rep == 1 and v["id"] == "frugal":
            s["step_losses"][2] = 0.26  # one step of one repetition departs
        runs.append({"variant": v["id"], "repeat": rep, "summary": s})
    med = bench.summarize(vs, runs, 2)
    assert med["frugal"]["step_loss_rel_vs_stock"] == pytest.approx(0.04)
    assert med["table_wise"]["step_loss_rel_vs_stock"] == pytest.approx(2e-7)  # against row_wise only
    assert bench.step_loss_difference({"step_losses": [1.0]}, {"step_losses": []}) != bench.step_loss_difference({}, {})
    assert "| 4.0e-02 |" in bench.markdown_tables(vs, med, 2)


def test_results_table_rows_from_recorded_results(tmp_path):
    args, vs, runs, med, skipped = _fake_result(tmp_path)
    data = {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "machine_load": {"foreign_cpu_share": 0.03}, "train_commit": "abcdef0123", "variants": vs, "medians": med}  # fmt: skip
    js = tmp_path / "r.json"
    js.write_text(json.dumps(data))
    table = bench.results_table([js, js]).splitlines()
    assert len(table) == 4 and table[0].startswith("| config | model | batch/rank |")
    paired = (30 / 20 + 34 / 22) / 2
    assert table[2] == (f"| criteo-kaggle | dlrm | 1024 | 200 | 32,000 | 21,000 | 18,500 | {paired:.2f}x | - | - "
                        "| 3.0% | abcdef0 |")  # fmt: skip


def test_plot_from_json(tmp_path):
    pytest.importorskip("matplotlib")
    args, vs, runs, med, skipped = _fake_result(tmp_path)
    data = {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "machine": {"cpus": 2}, "machine_load": {"foreign_cpu_share": 0.3}, "train_commit": "abc",
            "variants": vs, "runs": runs, "medians": med, "skipped": skipped}  # fmt: skip
    js = tmp_path / "r.json"
    js.write_text(json.dumps(data))
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "plot_dlrm.py"), str(js), str(tmp_path / "p")],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "p_throughput.png").stat().st_size > 0 and (tmp_path / "p_ablations.png").stat().st_size > 0


def test_find_train_script_messages(tmp_path, monkeypatch):
    from examples import demo

    assert demo.find_train_script() == TRAIN.resolve()  # the one beside the launcher
    with pytest.raises(SystemExit, match="examples/dlrm/train.py not found"):
        demo.find_train_script(str(tmp_path / "nope.py"))


FAKE_TRAIN = textwrap.dedent(
    """
    import argparse, json, os, sys
    p = argparse.ArgumentParser()
    p.add_argument("--summary"); p.add_argument("--no-progress", action="store_true")
    p.add_argument("--threads"); p.add_argument("--fail", action="store_true")
    p.add_argument("--sleep", type=float, default=0.0)
    a = p.parse_args()
    import time; time.sleep(a.sleep)
    print("[dlrm] hello from rank", os.environ["RANK"], flush=True)
    if a.fail:
        sys.exit(3)
    if os.environ["RANK"] == "0":
        json.dump({"samples_per_second": 1.0, "world": int(os.environ["WORLD_SIZE"]),
                   "omp": os.environ.get("OMP_NUM_THREADS")}, open(a.summary, "w"))
    """
)


def test_run_train_reads_summary_and_reports_failures(tmp_path):
    from examples.demo import TrainRunError, run_train

    train = tmp_path / "examples" / "dlrm" / "train.py"
    train.parent.mkdir(parents=True)
    train.write_text(FAKE_TRAIN)
    lines = []
    s = run_train(train, [], nproc=2, threads=1, echo=lines.append, timeout_s=120)
    assert s["samples_per_second"] == 1.0 and s["world"] == 2 and s["omp"] == "1"
    assert s["wall_s"] > 0 and s["command"].startswith("OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=2")
    assert any("hello from rank" in x for x in lines)
    with pytest.raises(TrainRunError, match="exit code"):
        run_train(train, ["--fail"], nproc=1, log_path=tmp_path / "fail.log", timeout_s=120)
    assert "hello from rank 0" in (tmp_path / "fail.log").read_text()
    with pytest.raises(TrainRunError, match="timed out after 5 s"):
        run_train(train, ["--sleep", "120"], nproc=1, timeout_s=5)


def test_time_dlrm_calls_reports_the_calls_of_a_step(tmp_path):
    """The call timer runs the DLRM example and prints rank 0's milliseconds per step for each call."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
           str(ROOT / "benchmarks" / "time_dlrm_calls.py"), "--sharder", "frugal", "--lookahead", "4", "--scale", "0.001",
           "--batch-size", "64", "--steps", "12", "--warmup", "2", "--threads", "1", "--no-progress",
           "--skip-steps", "3"]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-4000:]
    rows = {m.group(1): (float(m.group(2)), float(m.group(3)), float(m.group(4)))
            for m in re.finditer(r"^  (\S+)\s+([\d.]+)  \(([\d.]+); cpu ([\d.]+)\)$", out.stdout, re.M)}  # fmt: skip
    assert "rank 0, 9 steps after the first 3" in out.stdout
    assert rows["progress"][1] == 1.0 and rows["engine.apply_gradients"][1] == 1.0
    # every batch planned (on the planner thread) and announced ahead; the first 3 steps may have done up to L + 1 = 5
    # of the 9 counted steps' batches
    assert 4 / 9 - 0.01 <= rows["lookup.plan"][1] <= 1.0
    assert 4 / 9 - 0.01 <= rows["announce"][1] <= 1.0
    assert "lookahead_rows" not in rows  # the planner's rows are what the engines are told
    assert rows["progress"][0] > rows["backward"][0] > rows["engine.apply_gradients"][0] > 0.0
    assert 0.0 < rows["progress"][2] <= rows["progress"][0] * 1.05  # the thread's own CPU time: not more than its wall time
    host = re.search(r"frugal host work .* ([\d.]+) \(its own CPU time ([\d.]+)\) ms per batch$", out.stdout, re.M)
    assert host and 0.0 < float(host.group(1)) < rows["progress"][0]


def test_time_engine_calls_times_each_call_of_a_planned_step():
    """The engine's call timer prints, per call of a planned step, wall and CPU microseconds."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "time_engine_calls.py"), "--rows", "5000", "--batch", "500",
           "--steps", "40", "--lookahead", "3", "--busy", "1"]  # fmt: skip
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "40 steps less 20 of warm-up, 1 busy processes" in out.stdout
    rows = {m.group(1): [float(x) for x in m.groups()[1:]]
            for m in re.finditer(r"^(\w+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", out.stdout, re.M)}  # fmt: skip
    assert set(rows) == {"push_lookahead", "begin_step", "lookup", "apply_gradients"}
    for name, (median, least, cpu) in rows.items():
        assert 0.0 < least <= median and cpu > 0.0, name


@pytest.mark.parametrize("example", ["dlrm", "graph"])
def test_time_loader_times_both_ways_of_receiving_a_batch(example):
    """The loader timer runs the packed and the five-tensor loader side by side and prints each."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "time_loader.py"), "--example", example, "--batch-size", "128",
           "--batches", "25", "--step-ms", "1", "--repeats", "2"]  # fmt: skip
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-4000:]
    per_run = re.findall(r"^repetition (\d): (packed|tensors)\s+next\(\)\s+([\d.]+) µs", out.stdout, re.M)
    assert sorted((r, v) for r, v, _ in per_run) == [("0", "packed"), ("0", "tensors"), ("1", "packed"), ("1", "tensors")]
    medians = dict(re.findall(r"^(packed|tensors)\s+next\(\) median over 2 repetitions:\s+([\d.]+) µs", out.stdout, re.M))
    assert set(medians) == {"packed", "tensors"} and all(float(v) > 0 for v in medians.values())


def test_profile_dlrm_ops_lists_the_training_threads_ops_per_step():
    """The op profiler runs the DLRM example and prints the training thread's self CPU time by op."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "profile_dlrm_ops.py"), "--profile-steps", "4", "8", "--top", "500",
           "--sharder", "frugal", "--lookahead", "2", "--scale", "0.001", "--batch-size", "64", "--steps", "10",
           "--warmup", "2", "--threads", "1", "--no-progress"]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "rank 0, steps 4-8: training thread's self CPU ms per step" in out.stdout
    rows = {m.group(1).strip(): (float(m.group(2)), float(m.group(3)))
            for m in re.finditer(r"^  (.{64}) +([\d.]+)  \(([\d.]+)\)$", out.stdout, re.M)}  # fmt: skip
    total = float(re.search(r"^  all ops +([\d.]+)$", out.stdout, re.M).group(1))
    # The forward's pooling and its backward's (the transposed pooling), once a step each, as one autograd node
    # whose rows need no gradient of their own: no op that keeps what a backward of the pooling would need.
    assert rows["aten::_embedding_bag_forward_only"][1] == 2.0
    assert "aten::_embedding_bag" not in rows and "aten::_embedding_bag_dense_backward" not in rows
    assert 0.0 < sum(ms for ms, _ in rows.values()) <= total * 1.001


def test_probe_cold_python_times_the_probe_in_and_out_of_a_step():
    """The probe runs at three points of each step, three times in a row, and idle before and after."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "probe_cold_python.py"), "--sharder", "frugal", "--lookahead", "2",
           "--scale", "0.001", "--batch-size", "64", "--steps", "14", "--warmup", "2", "--threads", "1", "--no-progress"]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-4000:]
    rows = {m.group(1).strip(): [float(x) for x in m.groups()[1:]]
            for m in re.finditer(r"^  (.{36}) +([\d.]+) +([\d.]+) +([\d.]+) +(\d+)$", out.stdout, re.M)}  # fmt: skip
    places = ("step begins,", "forward begins,", "backward hand-off,")
    assert set(rows) == {f"{p} {r}" for p in places for r in ("1st", "2nd", "3rd")} | {
        "idle, before training", "idle, after training"}  # fmt: skip
    for name, (device, loop, empty, runs) in rows.items():
        assert device > 0.0 and loop > 0.0 and empty > 0.0, name
        assert runs == (200 if name.startswith("idle") else 4), name  # 14 steps less 10 of warm-up


def test_time_int_sort_times_both_sorts_per_size():
    """The sort timer prints, per size, PyTorch's and the radix sorts' medians, checked equal first,
    then PyTorch's and numpy's medians of the other id operations of a plan."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "time_int_sort.py"), "--sizes", "100", "3000", "--repeats", "3"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-4000:]
    rows = re.findall(r"^ +(\d+) +([\d.]+) +([\d.]+) +([\d.]+) +([\d.]+)$", out.stdout, re.M)
    assert [r[0] for r in rows] == ["100", "3000"]
    assert all(float(x) > 0 for r in rows for x in r[1:])
    ops = re.findall(r"^ +(\d+) +([a-z].*?) +([\d.]+) +([\d.]+)$", out.stdout, re.M)
    assert len(ops) == 10 and [o[0] for o in ops] == ["100"] * 5 + ["3000"] * 5
    assert "every bag one id" in ops[-1][1] and all(float(o[2]) > 0 and float(o[3]) > 0 for o in ops)


def test_time_plan_times_each_batch_shape():
    """The planning timer prints, per batch size, the median ms of planning a one-hot and a
    multi-hot batch."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "time_plan.py"), "--scale", "0.001", "--batch-sizes", "16", "64", "--repeats", "3"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-4000:]
    rows = re.findall(r"^ +(\d+) +([\d.]+) +([\d.]+)$", out.stdout, re.M)
    assert [r[0] for r in rows] == ["16", "64"]
    assert all(float(x) > 0 for r in rows for x in r[1:])
