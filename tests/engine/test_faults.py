"""Faults: a rank killed mid-run, and bad input that must be refused without changing anything."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import torch

from torchrec_frugal.host.launch import free_port, leaked_segments, run_ranks
from torchrec_frugal import FrugalConfig, FrugalEngine, FrugalInputError, OptimizerSpec, TableSpec

HERE = os.path.dirname(os.path.abspath(__file__))


def test_sigkill_of_one_rank_stops_the_others_with_a_named_error() -> None:
    world, victim, kill_step = 3, 1, 300
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, os.path.join(HERE, "..", "harness", "fault_worker.py"), str(r), str(world), str(port), str(victim), str(kill_step)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(world)
    ]
    try:
        procs[victim].wait(timeout=120)
        killed_at = time.monotonic()
        outs = {}
        for r, p in enumerate(procs):
            if r == victim:
                continue
            out, err = p.communicate(timeout=60)
            outs[r] = (p.returncode, out, err, time.monotonic() - killed_at)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert procs[victim].returncode == -9
    for r, (code, out, err, elapsed) in outs.items():
        assert code != 0, f"rank {r} exited 0 after rank {victim} died:\n{err[-2000:]}"
        assert elapsed < 60, f"rank {r} took {elapsed:.1f} s to notice"
        assert "RankLostError" in err and f"rank {victim} (pid" in err, err[-2000:]
    assert leaked_segments() == []


def _bad_input_checks(rank: int, world: int) -> dict:
    tables = [TableSpec("small", 100, 4), TableSpec("large", 1000, 4)]
    eng = FrugalEngine(tables, OptimizerSpec("sgd", lr=0.1), FrugalConfig(lookahead=2, cache_ratio=0.1, timeout_s=30))
    errors = {}

    def expect(key: str, fn) -> None:
        try:
            fn()
        except FrugalInputError as e:
            errors[key] = str(e)

    good = [eng.rows(0, torch.tensor([1, 2, 3])), eng.rows(1, torch.tensor([5, 990]))]
    batch = torch.cat(good)
    before_w, before_s = eng.read_rows()
    expect("too_large", lambda: eng.rows(1, torch.tensor([3, 1000, 7])))
    expect("negative", lambda: eng.rows(0, torch.tensor([4, -2])))
    expect("dtype", lambda: eng.rows(0, torch.tensor([1.0, 2.0])))
    expect("fused_out_of_range", lambda: eng.begin_step(torch.tensor([0, 1100])))
    expect("fused_dtype", lambda: eng.begin_step(torch.tensor([0, 1], dtype=torch.int32)))
    expect("lookahead_out_of_range", lambda: eng.push_lookahead(torch.tensor([-1])))
    unchanged = eng.step == 0 and eng.steps_ahead == 0
    # Train two good steps; the lookahead then disagrees with the batch trained.
    eng.push_lookahead(batch)
    eng.push_lookahead(batch + 1)
    for step_batch in (batch, batch + 1):
        eng.begin_step(step_batch)
        expect("lookup_out_of_range", lambda: eng.lookup(torch.tensor([2, 1100, 0])))
        eng.lookup(step_batch)
        u = torch.unique(step_batch)
        expect("grad_shape", lambda: eng.apply_gradients(u, torch.ones(u.shape[0], 3)))
        expect("grad_sorted_out_of_range", lambda: eng.apply_gradients(torch.tensor([0, 1100]), torch.ones(2, 4)))
        expect("grad_unsorted_out_of_range", lambda: eng.apply_gradients(torch.tensor([-3, 0]), torch.ones(2, 4)))
        twice = torch.cat([u, u[-1:]])
        expect("grad_repeat", lambda: eng.apply_gradients(twice, torch.ones(twice.shape[0], 4)))
        eng.apply_gradients(u, torch.ones(u.shape[0], 4))
    eng.push_lookahead(batch)
    expect("pushed_out_of_range", lambda: eng.begin_step(torch.tensor([0, 1100])))
    expect("lookahead_mismatch", lambda: eng.begin_step(batch + 2))
    still_step_2 = eng.step
    eng.begin_step(batch)  # the pushed batch still trains
    eng.lookup(batch)
    u = torch.unique(batch)
    eng.apply_gradients(u, torch.ones(u.shape[0], 4))
    eng.flush()
    after_w, _ = eng.read_rows()
    eng.close()
    return {
        "errors": errors,
        "unchanged": unchanged,
        "step_after_mismatch": still_step_2,
        "moved": float((after_w - before_w).abs().max()),
    }


def test_bad_input_is_refused_and_changes_nothing() -> None:
    results = run_ranks(2, _bad_input_checks)
    for res in results:
        e = res["errors"]
        assert "table 'large'" in e["too_large"] and "1000" in e["too_large"], e
        assert "table 'small'" in e["negative"] and "-2" in e["negative"], e
        assert "int32 or int64" in e["dtype"] and "table 'small'" in e["dtype"], e
        assert "1100" in e["fused_out_of_range"] and "'large'" in e["fused_out_of_range"], e
        assert "int64" in e["fused_dtype"], e
        assert "-1" in e["lookahead_out_of_range"], e
        assert "expected shape" in e["grad_shape"], e
        assert "row 1091 appears more than once" in e["grad_repeat"], e  # the last row of the second step's
        # Where another pass checks the rows (the CPU lookup's, the ends of sorted rows, the rows
        # pushed for the step), a row out of range is named all the same.
        assert "lookup" in e["lookup_out_of_range"] and "row 1100" in e["lookup_out_of_range"], e
        assert "row 1100" in e["grad_sorted_out_of_range"] and "'large'" in e["grad_sorted_out_of_range"], e
        assert "row -3" in e["grad_unsorted_out_of_range"], e
        assert "step 2" in e["pushed_out_of_range"] and "row 1100" in e["pushed_out_of_range"], e
        assert "step 2" in e["lookahead_mismatch"] and "differs" in e["lookahead_mismatch"], e
        assert res["unchanged"] and res["step_after_mismatch"] == 2
        assert res["moved"] > 0.0  # training continued after every refused call
    assert leaked_segments() == []
