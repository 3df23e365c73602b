"""Test set-up: import helpers from tests/, one thread per process, no shared memory left behind."""
from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
torch.set_num_threads(1)

from torchrec_frugal.shm import creator_pid, is_stale, list_segments, owned_paths, sweep_stale_segments  # noqa: E402


def of_this_run(name: str) -> bool:
    """A segment this test run must answer for: one nobody will unlink any more (its creator is
    gone), or one a process of this run (this process or a descendant) still holds.

    Segments that another job on this machine holds live are not ours, whatever they do meanwhile.
    """
    if is_stale(name):
        return True
    pid = creator_pid(name)
    return pid is not None and _descends_from(pid, os.getpid())


def _descends_from(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            return False
        pid = int(stat[stat.rindex(b")") + 2 :].split()[1])  # field 4: the parent's pid
    return False


@pytest.fixture(autouse=True)
def no_shared_memory_left():
    """Every test must leave /dev/shm free of frugal segments (a crash may not leak them either),
    and this process holding no segment name it created, wherever its directory (tmp_path too).
    Live segments of other jobs on the machine are left out of the check."""
    sweep_stale_segments()
    before = set(list_segments())
    held = set(owned_paths())
    yield
    leaked = sorted(n for n in set(list_segments()) - before if of_this_run(n))
    assert not leaked, f"shared-memory segments left behind: {leaked}"
    named = sorted(set(owned_paths()) - held)
    assert not named, f"segment names this process created and never unlinked: {named}"
