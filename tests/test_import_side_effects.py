"""Importing the package changes nothing in the process: no signal handler, no exit hook.

Shared memory's SIGTERM handler and exit hook are installed with the first segment a process
creates, the exit's wait for quiet threads by the first engine or batch planner
(``torchrec_frugal.host.shm``, ``torchrec_frugal.quiet_exit``); an application that only imports
the package keeps its own handling of signals and exit.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from torchrec_frugal import quiet_exit
from torchrec_frugal.host import shm
from torchrec_frugal.host.shm import Field, Layout, SharedSegment

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_IMPORTS = textwrap.dedent(
    """
    import atexit, json, signal, sys, weakref

    def handlers():
        return {s.name: repr(signal.getsignal(s)) for s in signal.valid_signals()
                if isinstance(s, signal.Signals) and s not in (signal.SIGKILL, signal.SIGSTOP)}

    before = handlers()
    registered = []
    _register = atexit.register

    def register(func, *args, **kwargs):
        registered.append(f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', '?')}")
        return _register(func, *args, **kwargs)

    atexit.register = register
    for name in sys.argv[1:]:
        __import__(name)
    after = handlers()
    finalizers = [f"{getattr(i.func, '__module__', '?')}.{getattr(i.func, '__qualname__', '?')}"
                  for i in weakref.finalize._registry.values()]
    print(json.dumps({"before": before, "after": after, "atexit": registered, "finalizers": finalizers}))
    """
)


def _import_in_fresh_process(*modules: str) -> dict:
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(
        [sys.executable, "-c", _IMPORTS, *modules], capture_output=True, text=True, env=env, cwd=REPO, timeout=300
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _ours(names: list) -> list:
    return [n for n in names if n.startswith("torchrec_frugal")]


def test_importing_the_package_installs_no_handler_and_no_exit_hook() -> None:
    pytest.importorskip("torchrec")
    seen = _import_in_fresh_process("torchrec_frugal", "torchrec_frugal.torchrec", "torchrec_frugal.host.shm")
    assert seen["after"]["SIGTERM"] == seen["before"]["SIGTERM"]
    assert not [s for s in seen["after"] if seen["after"][s] != seen["before"][s] and "torchrec_frugal" in seen["after"][s]]
    assert _ours(seen["atexit"]) == [], seen["atexit"]
    assert _ours(seen["finalizers"]) == [], seen["finalizers"]


def test_the_engine_layers_alone_install_nothing_either() -> None:
    """Without TorchRec installed, what the engine imports counts too."""
    seen = _import_in_fresh_process("torchrec_frugal.host.shm", "torchrec_frugal.quiet_exit", "torchrec_frugal.engine.frugal_engine")
    assert seen["after"] == seen["before"]
    assert _ours(seen["atexit"]) == [] and _ours(seen["finalizers"]) == []


@pytest.mark.skipif(signal.getsignal(signal.SIGTERM) != signal.SIG_DFL, reason="SIGTERM already handled here")
def test_the_first_segment_installs_the_hooks_and_the_last_unlinked_removes_them() -> None:
    assert not shm.owned_paths()
    assert not shm.exit_hooks_armed()
    lay = Layout([Field("x", torch.float32, (4,))])
    first = SharedSegment.create(shm.PREFIX + shm.new_run_id() + "_a", lay)
    second = None
    try:
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN, None)
        assert shm.exit_hooks_armed()
        second = SharedSegment.create(shm.PREFIX + shm.new_run_id() + "_b", lay)
        first.unlink()
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN, None), "a name still owned keeps them"
        second.unlink()
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        assert not shm.exit_hooks_armed()
    finally:
        first.unlink()
        if second is not None:
            second.unlink()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_arming_the_exit_wait_is_idempotent() -> None:
    """Every engine and planner arms it; the first one does."""
    quiet_exit.arm()
    quiet_exit.arm()
    assert quiet_exit.armed()
