"""Test set-up: the shared harness (tests/harness/) importable, one thread per process, no shared memory left behind."""
from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "harness"))  # the shared harness
torch.set_num_threads(1)

from torchrec_frugal.host.shm import list_segments, owned_paths, sweep_stale_segments  # noqa: E402
from torchrec_frugal.host.launch import leaked_segments  # noqa: E402


@pytest.fixture(autouse=True)
def no_shared_memory_left():
    """Every test must leave /dev/shm free of frugal segments (a crash may not leak them either),
    and this process holding no segment name it created, wherever its directory (tmp_path too).
    Live segments of other jobs on the machine are left out of the check."""
    sweep_stale_segments()
    before = set(list_segments())
    held = set(owned_paths())
    yield
    leaked = leaked_segments(before)
    assert not leaked, f"shared-memory segments left behind: {leaked}"
    named = sorted(set(owned_paths()) - held)
    assert not named, f"segment names this process created and never unlinked: {named}"
