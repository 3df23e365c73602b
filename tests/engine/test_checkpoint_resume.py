"""Training that survives a lost rank: the examples' checkpoints (examples/checkpointing.py).

A DLRM job under ``torchrun --max-restarts`` loses rank 1 to SIGKILL mid-run, restarts, resumes
from its newest complete checkpoint and ends bit for bit where an uninterrupted run with the same
checkpoint cadence ends (final checkpoint: tables, optimizer state; summary loss and AUC), with no
shared-memory segment left. Partial checkpoint writes are never resumed from. The graph example
resumes too: two launches equal one.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from examples import checkpointing  # noqa: E402
from torchrec_frugal.host.shm import list_segments  # noqa: E402
from torchrec_frugal.host.launch import leaked_segments  # noqa: E402

DLRM = [
    "--sharder", "frugal", "--scale", "0.001", "--batch-size", "64", "--steps", "50", "--warmup", "5",
    "--lookahead", "4", "--auc-window", "20", "--log-every", "10", "--threads", "1",
    "--checkpoint-every", "10",
]  # fmt: skip
GRAPH = [
    "--dataset", "synthetic", "--synthetic-entities", "3000", "--synthetic-relations", "12",
    "--synthetic-triples", "30000", "--model", "complex", "--dim", "32", "--batch-size", "256",
    "--chunk-size", "32", "--negatives", "16", "--log-every", "0", "--seed", "3", "--sharder", "frugal",
    "--lookahead", "4", "--threads", "1", "--no-eval", "--checkpoint-every", "10",
]  # fmt: skip


def torchrun(
    script: str,
    args: List[str],
    summary: Path,
    max_restarts: int = 0,
    env: Optional[Dict[str, str]] = None,
    nproc: int = 2,
) -> str:
    """Run ``script`` on ``nproc`` ranks; returns its output (the run must exit 0)."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
        f"--max-restarts={max_restarts}", str(ROOT / "examples" / script / "train.py"),
        *args, "--summary", str(summary), "--no-progress",
    ]  # fmt: skip
    run_env = {k: v for k, v in os.environ.items() if k != checkpointing.KILL_ENV}
    run_env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", **(env or {}))
    proc = subprocess.run(cmd, cwd=ROOT, env=run_env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out[-8000:]}"
    return out


def final_state(checkpoint: Path, whole: Path, ranks: int = 2) -> Dict[str, Any]:
    """Every value of a DCP checkpoint (converted into the file ``whole``), flattened, plus each rank's own file."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(checkpoint, whole)
    flat: Dict[str, Any] = {}

    def walk(value: Any, key: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{key}/{k}")
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(v, f"{key}/{i}")
        else:
            flat[key] = value

    walk(torch.load(whole, weights_only=False), "dcp")
    for rank in range(ranks):
        walk(torch.load(checkpoint / f"rank_{rank}.pt", weights_only=True), f"rank_{rank}")
    return flat


def assert_same(a: Dict[str, Any], b: Dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert torch.equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Tuple[Path, Dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("uninterrupted")
    torchrun("dlrm", DLRM + ["--checkpoint-dir", str(tmp / "ckpt")], tmp / "summary.json")
    return tmp / "ckpt", json.loads((tmp / "summary.json").read_text())


@pytest.mark.slow
def test_dlrm_survives_a_sigkilled_rank(uninterrupted, tmp_path) -> None:
    ckpt_a, whole = uninterrupted
    before = set(list_segments())
    out = torchrun(
        "dlrm", DLRM + ["--checkpoint-dir", str(tmp_path / "ckpt")], tmp_path / "summary.json",
        max_restarts=2, env={checkpointing.KILL_ENV: "1:25"},
    )  # fmt: skip
    resumed = json.loads((tmp_path / "summary.json").read_text())
    assert "[fault] rank 1 SIGKILLs itself after step 25" in out
    assert f"[checkpoint] resumed from {tmp_path / 'ckpt' / 'step_20'} (step 20 of 50)" in out, out[-4000:]
    assert whole["resumed_from_step"] is None and whole["checkpoint_steps"] == [10, 20, 30, 40, 50]
    assert resumed["resumed_from_step"] == 20 and resumed["checkpoint_steps"] == [30, 40, 50]
    assert resumed["steps"] == 50
    assert (resumed["loss"], resumed["auc"], resumed["auc_first_window"]) == (
        whole["loss"], whole["auc"], whole["auc_first_window"],
    )  # fmt: skip
    # --checkpoint-keep 2 (the default): the newest two remain
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step_40", "step_50"]
    assert_same(
        final_state(ckpt_a / "step_50", tmp_path / "uninterrupted.pt"),
        final_state(tmp_path / "ckpt" / "step_50", tmp_path / "resumed.pt"),
    )
    assert leaked_segments(before) == []


def _fake_checkpoint(path: Path, step: Optional[int]) -> None:
    path.mkdir(parents=True)
    (path / "__0_0.distcp").write_bytes(b"partial")
    if step is not None:
        (path / checkpointing.MARKER).write_text(json.dumps({"step": step, "world_size": 2}))


@pytest.mark.slow
def test_dlrm_on_4_ranks_resumes_bit_for_bit(tmp_path) -> None:
    """With 4 ranks, gloo's ring all-reduce of the dense gradients adds in an order that depends on
    DDP's buckets: the examples keep the first ones (``Checkpointer.data_parallel_wrapper``), so the
    first step after a restart sums like the uninterrupted run's."""
    args = [a for a in DLRM if a not in ("--steps", "50")] + ["--steps", "30"]
    whole_dir, resumed_dir = tmp_path / "whole", tmp_path / "resumed"
    torchrun("dlrm", args + ["--checkpoint-dir", str(whole_dir)], tmp_path / "whole.json", nproc=4)
    out = torchrun(
        "dlrm", args + ["--checkpoint-dir", str(resumed_dir)], tmp_path / "resumed.json",
        max_restarts=1, env={checkpointing.KILL_ENV: "2:15"}, nproc=4,
    )  # fmt: skip
    assert f"[checkpoint] resumed from {resumed_dir / 'step_10'} (step 10 of 30)" in out, out[-4000:]
    whole, resumed = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("whole", "resumed"))
    assert (resumed["loss"], resumed["auc"]) == (whole["loss"], whole["auc"])
    assert_same(
        final_state(whole_dir / "step_30", tmp_path / "whole.pt", ranks=4),
        final_state(resumed_dir / "step_30", tmp_path / "resumed.pt", ranks=4),
    )


def test_partial_writes_are_never_resumed_from(tmp_path) -> None:
    _fake_checkpoint(tmp_path / "step_10", 10)
    _fake_checkpoint(tmp_path / "step_30.tmp-0123abcd", 30)  # renamed only once complete
    _fake_checkpoint(tmp_path / "step_40", None)  # no marker
    _fake_checkpoint(tmp_path / "step_50", 5)  # a marker of another step
    _fake_checkpoint(tmp_path / "step_x", 60)
    assert checkpointing.latest_checkpoint(tmp_path) == (10, tmp_path / "step_10")
    assert checkpointing.latest_checkpoint(tmp_path / "missing") is None
    assert checkpointing.remove_partial(tmp_path) == [tmp_path / "step_30.tmp-0123abcd"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_10", "step_40", "step_50", "step_x"]


def test_kill_hook_fires_on_the_first_attempt_only(monkeypatch) -> None:
    monkeypatch.setenv(checkpointing.KILL_ENV, "1:25")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    assert (checkpointing.kill_step(1), checkpointing.kill_step(0)) == (25, None)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert checkpointing.kill_step(1) is None
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    monkeypatch.setenv(checkpointing.KILL_ENV, "one:25")
    with pytest.raises(SystemExit, match="one:25"):
        checkpointing.kill_step(1)


@pytest.mark.slow
def test_graph_resumes_where_it_stopped(tmp_path) -> None:
    def run(name: str, steps: int, ckpt: Path) -> Tuple[str, Dict[str, Any]]:
        out = torchrun(
            "graph", GRAPH + ["--steps", str(steps), "--checkpoint-dir", str(ckpt),
                              "--save-entities", str(tmp_path / f"{name}.pt")],
            tmp_path / f"{name}.json",
        )  # fmt: skip
        summary = json.loads((tmp_path / f"{name}.json").read_text())
        summary["tables"] = torch.load(tmp_path / f"{name}.pt")
        return out, summary

    _, whole = run("whole", 60, tmp_path / "whole")
    run("first", 30, tmp_path / "parts")
    # An interrupted later write, complete but for its rename, and a directory without the marker.
    partial = tmp_path / "parts" / "step_50.tmp-0123abcd"
    _fake_checkpoint(partial, 50)
    _fake_checkpoint(tmp_path / "parts" / "step_40", None)
    out, second = run("second", 60, tmp_path / "parts")
    assert re.search(r"\[checkpoint\] resumed from \S+step_30 \(step 30 of 60\)", out), out[-4000:]
    assert not partial.exists()
    assert second["resumed_from_step"] == 30 and second["checkpoint_steps"] == [40, 50, 60]
    assert second["loss"] == whole["loss"]
    for key in ("entities", "relations"):
        assert torch.equal(second["tables"][key], whole["tables"][key]), key
