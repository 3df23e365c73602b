"""Real machines: shared-memory room, the shared-memory directory, host memory and locked memory.

Each check fails without its fix: a table larger than the shared-memory mount must be an error at
creation naming the bytes and the fix (not a SIGBUS on first touch), nothing may be left behind,
and every local rank must use one directory.
"""
from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import textwrap
from typing import Optional

import pytest
import torch

from torchrec_frugal import FrugalConfig, FrugalEngine, OptimizerSpec, TableSpec
from torchrec_frugal.host import shm
from torchrec_frugal.errors import FrugalError
from torchrec_frugal.host.memory import HostMemoryError, check_fits
from torchrec_frugal.host.registration import memlock_hint
from torchrec_frugal.host.launch import run_ranks
from torchrec_frugal.host.shm import SharedMemoryFullError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MIB = 2**20

# A container's default shared-memory mount (64 MiB) and an engine whose tables need 256 MiB,
# on 2 ranks; the mount lives in the child's own mount namespace and vanishes with it.
_SMALL_MOUNT = textwrap.dedent(
    """
    import os, sys, torch, torch.distributed as dist, multiprocessing as mp
    sys.path.insert(0, os.path.join(sys.argv[2], "tests"))
    from torchrec_frugal.host.launch import run_ranks

    def rank_fn(rank, world, shm_dir, rows):
        from torchrec_frugal import FrugalConfig, FrugalEngine, OptimizerSpec, TableSpec
        try:
            FrugalEngine([TableSpec("big", rows, 32)], OptimizerSpec(), FrugalConfig(shm_dir=shm_dir)).close()
        except Exception as e:
            return type(e).__name__ + ": " + str(e)
        return "created"

    if __name__ == "__main__":
        shm_dir = sys.argv[1]
        for rows in (2 * 2**20, 100_000):  # 256 MiB: over the mount; 12.8 MiB: fits
            print(rows, run_ranks(2, rank_fn, shm_dir, rows, timeout=300), flush=True)
        print("left", sorted(os.listdir(shm_dir)), flush=True)
    """
)


def _can_mount() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _can_mount(), reason="needs unshare -m and tmpfs mounts (root or user namespaces) for a 64 MiB mount")
def test_tables_larger_than_the_shared_memory_mount_are_an_error_not_a_bus_error(tmp_path) -> None:
    mnt = tmp_path / "shm"
    mnt.mkdir()
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    child = tmp_path / "child.py"
    child.write_text(_SMALL_MOUNT)
    script = f"mount -t tmpfs -o size=64m tmpfs {mnt} && exec {sys.executable} {child} {mnt} {REPO}"
    p = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr  # a SIGBUS would be -7 / 135
    lines = dict(line.split(" ", 1) for line in p.stdout.splitlines())
    big = eval(lines[str(2 * 2**20)])  # noqa: S307 - our own child's repr of two strings
    for msg in big:
        assert msg.startswith("SharedMemoryFullError"), big  # on every rank
        assert "268435" in msg and str(mnt) in msg and "--shm-size" in msg and "big 2097152 x 32" in msg, msg
    assert eval(lines["100000"]) == ["created", "created"]  # noqa: S307 - the mount itself works
    assert lines["left"] == "[]"  # nothing left behind in the mount, on any rank


def test_segment_reservation_fails_at_creation_and_leaves_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A filesystem without room fails posix_fallocate: the create raises, the name is gone."""

    def full(fd: int, off: int, n: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    name = f"{shm.PREFIX}{shm.new_run_id()}_full"
    with pytest.raises(SharedMemoryFullError, match=f"segment {name} need 4096 bytes .* of shared memory in /"):
        shm.SharedSegment.create(name, shm.Layout([shm.Field("x", torch.uint8, (4096,))]))
    assert name not in shm.list_segments() and not shm.owned_paths()


def test_segment_pages_are_reserved_at_creation() -> None:
    """The segment's blocks are allocated before any touch (a sparse file would fault later)."""
    seg = shm.SharedSegment.create(f"{shm.PREFIX}{shm.new_run_id()}_res", shm.Layout([shm.Field("x", torch.uint8, (8 * MIB,))]))
    try:
        assert os.stat(seg.path).st_blocks * 512 >= 8 * MIB
    finally:
        seg.unlink()


def test_check_fits_names_tables_bytes_and_fix(tmp_path) -> None:
    tables = [TableSpec("users", 1000, 16), TableSpec("items", 500, 16)]
    check_fits(tables, 1, 100_000, 1000, 2, str(tmp_path), available=10**9, free=10**9)
    with pytest.raises(HostMemoryError, match=r"users 1000 x 16 .*items 500 x 16 .*need 102000 bytes .*only 50000 bytes"):
        check_fits(tables, 1, 100_000, 1000, 2, str(tmp_path), available=50_000, free=10**9)
    with pytest.raises(SharedMemoryFullError, match=rf"need 102000 bytes .* in {tmp_path}, which has 4096 bytes .*--shm-size=1g.*TORCHREC_FRUGAL_SHM_DIR"):
        check_fits(tables, 1, 100_000, 1000, 2, str(tmp_path), available=10**9, free=4096)


def test_engine_checks_host_memory_before_allocating(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchrec_frugal.host import memory as host_memory

    monkeypatch.setattr(host_memory, "mem_available", lambda: 1 * MIB)
    created = []
    segment_init = shm.SharedSegment.__init__

    def record(self: shm.SharedSegment, name: str, *args: object, **kwargs: object) -> None:
        created.append(name)
        segment_init(self, name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(shm.SharedSegment, "__init__", record)
    with pytest.raises(HostMemoryError, match=r"emb 100000 x 8 \(3.1 MiB\).*1048576 bytes \(0.00 GiB\) are available"):
        FrugalEngine([TableSpec("emb", 100_000, 8)], OptimizerSpec(kind="sgd"), FrugalConfig())
    assert created == []


def test_shm_dir_from_config_then_environment_then_default(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    env_dir, cfg_dir = tmp_path / "env", tmp_path / "cfg"
    env_dir.mkdir()
    cfg_dir.mkdir()
    monkeypatch.delenv(shm.ENV_DIR, raising=False)
    assert shm.resolve_dir() == os.path.realpath(shm.DEFAULT_DIR)
    monkeypatch.setenv(shm.ENV_DIR, str(env_dir))
    assert shm.resolve_dir() == str(env_dir)
    assert shm.resolve_dir(str(cfg_dir)) == str(cfg_dir)  # the config wins
    with pytest.raises(FrugalError, match=rf"{tmp_path}/nope' \(FrugalConfig.shm_dir\) does not exist"):
        shm.resolve_dir(str(tmp_path / "nope"))
    monkeypatch.setenv(shm.ENV_DIR, str(tmp_path / "gone"))
    with pytest.raises(FrugalError, match=r"gone' \(\$TORCHREC_FRUGAL_SHM_DIR\) does not exist"):
        shm.resolve_dir()


def test_engine_segments_live_in_the_configured_directory(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    seen = []
    create = shm.SharedSegment.create

    def spy(name: str, layout: shm.Layout, directory: Optional[str] = None) -> shm.SharedSegment:
        seg = create(name, layout, directory)
        seen.append(os.path.dirname(seg.path))
        return seg

    monkeypatch.setattr(shm.SharedSegment, "create", staticmethod(spy))
    monkeypatch.setenv(shm.ENV_DIR, str(tmp_path))
    with FrugalEngine([TableSpec("t", 64, 4)], OptimizerSpec(kind="sgd"), FrugalConfig(lookahead=2)) as eng:
        assert eng.shm_dir == str(tmp_path)
        rows = torch.arange(10)
        eng.begin_step(rows)
        eng.lookup(rows)
        eng.apply_gradients(rows, torch.ones(10, 4))
    assert seen == [str(tmp_path)] * 3 and os.listdir(tmp_path) == []  # host table and two mailbox records


def _disagree(rank: int, world: int, base: str) -> str:
    os.makedirs(f"{base}/r{rank}", exist_ok=True)
    try:
        FrugalEngine([TableSpec("t", 64, 4)], OptimizerSpec(kind="sgd"), FrugalConfig(shm_dir=f"{base}/r{rank}"))
    except FrugalError as e:
        return str(e)
    return "created"


def test_local_ranks_must_agree_on_the_shm_dir(tmp_path) -> None:
    msgs = run_ranks(2, _disagree, str(tmp_path), timeout=300)
    for m in msgs:
        assert f"rank 0 uses '{tmp_path}/r0', rank 1 uses '{tmp_path}/r1'" in m, msgs


def test_sweep_keeps_a_live_segment_whose_pid_is_not_ours() -> None:
    """Another job (say in another pid namespace) holds its segment: the sweep keeps it, though
    the pid in its name is dead here; once its creator is killed, the sweep removes it."""
    p = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(p.stdout)
    assert not shm.pid_alive(dead)
    name = f"{shm.PREFIX}{dead}x{'ab' * 6}_host"
    code = (
        "import sys, time, torch; from torchrec_frugal.host import shm; "
        f"shm.SharedSegment.create({name!r}, shm.Layout([shm.Field('x', torch.float32, (16,))])); "
        "print('ready', flush=True); time.sleep(120)"
    )
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout.readline().strip() == "ready"
        assert name not in shm.sweep_stale_segments() and name in shm.list_segments()
    finally:
        child.kill()  # SIGKILL: no atexit, the name stays; its lock goes with the process
        child.wait()
    assert name in shm.list_segments()
    assert name in shm.sweep_stale_segments() and name not in shm.list_segments()


def test_memlock_hint_names_the_limit_the_bytes_and_the_fix() -> None:
    assert memlock_hint(4 * 2**30, limit=resource.RLIM_INFINITY, privileged=False) == ""
    assert memlock_hint(4 * 2**30, limit=2**20, privileged=True) == ""  # CAP_IPC_LOCK
    assert memlock_hint(4096, limit=8192, privileged=False) == ""
    hint = memlock_hint(4 * 2**30, limit=8 * 2**20, privileged=False)
    assert "4294967296 bytes (4.00 GiB)" in hint and "ulimit -l) is 8388608 bytes" in hint
    assert "ulimit -l unlimited" in hint and "--ulimit memlock=-1" in hint and "host_path='pinned'" in hint


def test_sweep_keeps_an_unlocked_segment_of_a_live_run() -> None:
    """A live job that takes no lock (an older release) keeps its segments: its pid is alive."""
    name = f"{shm.PREFIX}{os.getpid()}x{'cd' * 6}_host"
    path = os.path.join(shm.resolve_dir(), name)
    os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
    try:
        assert name not in shm.sweep_stale_segments() and os.path.exists(path)
    finally:
        os.unlink(path)
