"""Two independent torchrun jobs on one machine at once: neither touches the other's segments.

Job B starts (and its rank 0 sweeps stale segments) while job A's grown mailboxes are named in
the shared-memory directory; both must train exactly and leave nothing behind.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from torchrec_frugal.host import shm
from torchrec_frugal.host.launch import leaked_segments

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(REPO, "tests", "harness", "two_jobs_worker.py")
TOL = 1e-5


def _launch(out: str, steps: int, rows: list) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", WORKER, out, str(steps)]
    return subprocess.Popen(cmd + [str(r) for r in rows], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _mailboxes_named(before: set) -> list:
    return [n for n in set(shm.list_segments()) - before if "_ring" in n or "_grads" in n]


def test_two_jobs_at_once_leave_each_other_alone(tmp_path) -> None:
    before = set(shm.list_segments())
    a = _launch(str(tmp_path / "a"), 1200, [3000, 1200])
    try:
        deadline = time.monotonic() + 240
        while not _mailboxes_named(before):  # job A is training: its grown mailbox records are named
            assert a.poll() is None, a.stdout.read()
            assert time.monotonic() < deadline, "job A never grew its mailboxes"
            time.sleep(0.05)
        live_a = _mailboxes_named(before)
        b = _launch(str(tmp_path / "b"), 400, [5000, 700, 90])
        try:
            out_b, _ = b.communicate(timeout=600)
        finally:
            if b.poll() is None:
                b.kill()
        out_a, _ = a.communicate(timeout=600)
    finally:
        if a.poll() is None:
            a.kill()
    assert a.returncode == 0, out_a
    assert b.returncode == 0, out_b
    assert live_a and all(n.split("_")[1] == live_a[0].split("_")[1] for n in live_a)  # one run's names
    for job in ("a", "b"):
        for rank in (0, 1):
            m = json.loads((tmp_path / f"{job}.{rank}.json").read_text())
            assert m["max_rel_read_error"] <= TOL and m["host_vs_ref"] <= TOL, (job, rank, m)
            assert m["grad_rows"] > 2, (job, rank, m)  # the mailboxes grew while the other job ran
    assert leaked_segments(before) == []
