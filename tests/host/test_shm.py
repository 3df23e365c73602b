"""Shared-memory segments: layout, create/attach/unlink, and nothing outliving its creator."""
from __future__ import annotations

import mmap
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from torchrec_frugal.host import shm
from torchrec_frugal.host.shm import Field, Layout, SharedSegment

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _name(kind: str = "test", run_id: str | None = None) -> str:
    return f"{shm.PREFIX}{run_id or shm.new_run_id()}_{kind}"


def _exists(name: str) -> bool:
    return os.path.exists(os.path.join(shm.resolve_dir(), name))


def _layout() -> Layout:
    return Layout(
        [
            Field("a", torch.float32, (3, 5)),
            Field("b", torch.int64, (7,)),
            Field("flag", torch.uint8, (1,)),
            Field("empty", torch.float32, (0, 4)),
            Field("c", torch.float64, (2, 2)),
        ]
    )


def test_layout_alignment_and_size():
    lay = _layout()
    sizes = {"a": 60, "b": 56, "flag": 1, "empty": 0, "c": 32}
    prev_end = 0
    for f in lay.fields:
        off = lay.offsets[f.name]
        assert off % 64 == 0, f.name
        assert off >= prev_end, f"{f.name} overlaps its predecessor"
        assert off - prev_end < 64, f"{f.name} wastes a whole alignment unit"
        prev_end = off + sizes[f.name]
    assert lay.offsets == {"a": 0, "b": 64, "flag": 128, "empty": 192, "c": 192}
    assert lay.nbytes == prev_end == 224
    assert Layout([]).nbytes == 64  # never a zero-byte segment


def test_create_attach_share_and_unlink():
    lay = _layout()
    name = _name()
    seg = SharedSegment.create(name, lay)
    try:
        assert _exists(name) and name in shm.list_segments()
        assert os.path.getsize(os.path.join(shm.resolve_dir(), name)) == lay.nbytes
        assert seg["a"].shape == (3, 5) and seg["a"].dtype == torch.float32
        assert seg["empty"].shape == (0, 4)
        assert seg["a"].abs().sum().item() == 0  # a new segment is zeroed
        seg["a"].copy_(torch.arange(15, dtype=torch.float32).view(3, 5))
        seg["b"].fill_(-3)
        other = SharedSegment.attach(name, lay)
        assert torch.equal(other["a"], seg["a"]) and other["b"].tolist() == [-3] * 7
        other["c"].fill_(2.5)
        other["flag"][0] = 9
        assert seg["c"].tolist() == [[2.5, 2.5], [2.5, 2.5]] and seg["flag"].item() == 9
        # Fields do not overlap in memory.
        assert seg["a"].sum().item() == sum(range(15)) and seg["b"].sum().item() == -21
    finally:
        seg.unlink()
    assert not _exists(name) and os.path.join(shm.resolve_dir(), name) not in shm.owned_paths()
    # Mappings outlive the name.
    seg["b"][0] = 11
    assert other["b"][0].item() == 11
    with pytest.raises(FileNotFoundError):
        SharedSegment.attach(name, lay)
    seg.unlink()  # unlinking twice is harmless


@pytest.mark.skipif(not hasattr(mmap, "MAP_POPULATE"), reason="no MAP_POPULATE on this platform")
def test_a_mapping_has_every_page_in_place():
    """A rank attaching a segment reads every page without a page fault: the mapping is populated
    (a step's random rows of a big table would otherwise fault on page after page)."""
    import resource

    pages = 16384  # 64 MiB
    lay = Layout([Field("big", torch.uint8, (pages * 4096,))])
    name = _name()
    seg = SharedSegment.create(name, lay)
    try:
        other = SharedSegment.attach(name, lay)  # a new mapping: its own page table entries
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        touched = int(other["big"][::4096].sum())  # one byte of every page
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        assert touched == 0
        # unpopulated, reads fault once per page, or per 16 with the kernel's fault-around
        assert faults < pages // 64, faults
    finally:
        seg.unlink()


def test_attach_wrong_size_names_segment_and_sizes():
    lay = _layout()
    name = _name()
    seg = SharedSegment.create(name, lay)
    try:
        small = Layout([Field("a", torch.float32, (3, 5))])
        with pytest.raises(RuntimeError) as ei:
            SharedSegment.attach(name, small)
        msg = str(ei.value)
        assert name in msg and str(lay.nbytes) in msg and str(small.nbytes) in msg
    finally:
        seg.unlink()


def test_create_existing_name_fails_without_claiming_it():
    """A failed create must not register the name: at exit we would unlink another process's segment."""
    lay = _layout()
    name = _name()
    path = os.path.join(shm.resolve_dir(), name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)  # someone else's segment
    os.close(fd)
    try:
        with pytest.raises(FileExistsError):
            SharedSegment.create(name, lay)
        assert os.path.join(shm.resolve_dir(), name) not in shm.owned_paths()
    finally:
        os.unlink(path)


def test_remove_run_segments_only_that_run():
    lay = Layout([Field("x", torch.int32, (4,))])
    run_a, run_b = shm.new_run_id(), shm.new_run_id()
    segs = [SharedSegment.create(_name(k, run_a), lay) for k in ("w", "s")]
    keep = SharedSegment.create(_name("w", run_b), lay)
    try:
        assert shm.list_segments(run_a) == sorted(s.name for s in segs)
        shm.remove_run_segments(run_a)
        assert shm.list_segments(run_a) == []
        assert shm.list_segments(run_b) == [keep.name]
    finally:
        keep.unlink()
        for s in segs:
            s.unlink()


_CHILD = textwrap.dedent(
    """
    import os, sys, time, torch
    from torchrec_frugal.host import shm
    mode = sys.argv[1]
    if mode == "other_job" and os.fork():
        os._exit(0)        # the child lives on, no longer a descendant of the test: another job
    name = shm.PREFIX + shm.new_run_id() + "_child"
    shm.SharedSegment.create(name, shm.Layout([shm.Field("x", torch.float32, (16,))]))
    print(name, flush=True)
    if mode == "crash":
        os._exit(0)        # no atexit handlers: the segment stays behind
    elif mode == "exit":
        sys.exit(0)        # atexit unlinks it
    else:
        time.sleep(60)     # wait for SIGTERM
    """
)


def _child(mode: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, mode], stdout=subprocess.PIPE, text=True, env=env, cwd=REPO
    )


def test_sweep_removes_segment_of_dead_creator_and_keeps_live_ones():
    lay = Layout([Field("x", torch.float32, (16,))])
    mine = SharedSegment.create(_name("live"), lay)
    odd = os.path.join(shm.resolve_dir(), shm.PREFIX + "notapid_x")  # not of the naming scheme: left alone
    os.close(os.open(odd, os.O_RDWR | os.O_CREAT, 0o600))
    try:
        p = _child("crash")
        name = p.stdout.readline().strip()
        assert p.wait(timeout=60) == 0
        assert name.startswith(shm.PREFIX + str(p.pid) + "x")
        assert _exists(name), "os._exit must skip atexit, leaving the segment behind"
        assert not shm.pid_alive(p.pid)
        removed = shm.sweep_stale_segments()
        assert name in removed and not _exists(name)
        assert mine.name not in removed and _exists(mine.name)
        assert _exists(odd)
    finally:
        mine.unlink()
        os.unlink(odd)
    assert not _exists(mine.name)


def test_the_leak_check_leaves_other_jobs_live_segments_alone():
    """The tests' leak check answers for segments of this test run (stale ones, or held by this
    process's descendants), not for those another job on the machine holds live meanwhile."""
    from torchrec_frugal.host.launch import of_this_run

    mine = _child("sleep")
    other = _child("other_job")
    try:
        ours, theirs = mine.stdout.readline().strip(), other.stdout.readline().strip()
        assert other.wait(timeout=60) == 0  # its creator is the orphaned child, still alive
        other_pid = shm.creator_pid(theirs)
        assert other_pid != other.pid and shm.pid_alive(other_pid)
        assert _exists(ours) and _exists(theirs)
        assert of_this_run(ours)
        assert not of_this_run(theirs)
        os.kill(other_pid, signal.SIGTERM)  # the other job ends and unlinks its segment
        deadline = time.monotonic() + 60
        while _exists(theirs) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _exists(theirs)
    finally:
        mine.kill()
        mine.wait()
        pid = shm.creator_pid(theirs) if "theirs" in locals() else None
        if pid is not None and shm.pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
    assert of_this_run(ours)  # its creator was killed: stale, nobody will unlink it
    assert ours in shm.sweep_stale_segments() and not _exists(ours)


def test_creator_unlinks_at_exit():
    p = _child("exit")
    name = p.stdout.readline().strip()
    assert p.wait(timeout=60) == 0
    assert name and not _exists(name)


def test_creator_unlinks_on_sigterm():
    p = _child("sleep")
    name = p.stdout.readline().strip()
    try:
        assert _exists(name)
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=60) == -signal.SIGTERM  # still dies by SIGTERM after cleaning up
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert not _exists(name)


def test_pid_alive():
    assert shm.pid_alive(os.getpid())
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    try:
        # Unreaped, the child is a zombie: not alive.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
            if stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] == b"Z":
                break
            time.sleep(0.005)
        else:
            pytest.fail("child did not become a zombie")
        assert os.path.exists(f"/proc/{pid}")
        assert not shm.pid_alive(pid)
    finally:
        os.waitpid(pid, 0)
    assert not shm.pid_alive(pid)  # reaped: gone
