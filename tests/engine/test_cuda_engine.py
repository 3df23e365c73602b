"""The CUDA path: mapped host tables, staged copies, the flush stream, and exactness on one GPU.

Several ranks share GPU 0 (as on one-GPU machines): every rank's engine registers the same
shared segment in its own process and reads it from the device. scripts/device_check.sh runs
this file on a GPU machine; without CUDA every test is skipped.
"""
from __future__ import annotations

from typing import Any, List

import pytest
import torch

import test_engine_exactness as exact
from torchrec_frugal.host.launch import leaked_segments, run_ranks
from engine_reference import Scenario, run_scenarios
from torchrec_frugal.host import shm
from torchrec_frugal.config import FrugalConfig, OptimizerSpec, TableSpec
from torchrec_frugal.engine.frugal_engine import FrugalEngine
from torchrec_frugal.errors import FrugalError
from torchrec_frugal.host.registration import HostRegistration
from torchrec_frugal.engine.host_tables import HostTables
from torchrec_frugal.engine.streams import Streams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (runs in scripts/device_check.sh)")

STEPS = 500


def _tables(rows: int = 4096, width: int = 16):
    layout = shm.Layout([shm.Field("weights", torch.float32, (rows, width)), shm.Field("state", torch.float32, (rows, 0))])
    seg = shm.SharedSegment.create(f"{shm.PREFIX}{shm.new_run_id()}_cudatest", layout)
    seg.unlink()
    seg["weights"].copy_(torch.randn(rows, width))
    return seg


def test_zero_copy_maps_host_memory_and_unregisters() -> None:
    dev = torch.device("cuda", 0)
    seg = _tables()
    ht = HostTables({"weights": seg["weights"], "state": seg["state"]}, seg.base, dev, "zero_copy", seg)
    assert ht.path == "zero_copy" and ht.registered
    mapped = ht.mapped["weights"]
    assert mapped.device == dev and mapped.data_ptr() == seg["weights"].data_ptr()  # UVA: same address
    rows = torch.randint(0, 4096, (1000,))
    assert torch.equal(ht.read("weights", rows).cpu(), seg["weights"][rows])
    # A device kernel writes host memory: visible to the CPU once the stream is done.
    vals = torch.randn(3, 16, device=dev)
    ht.write("weights", torch.tensor([1, 2, 3]), vals)
    torch.cuda.synchronize()
    assert torch.equal(seg["weights"][1:4], vals.cpu())
    ht.close()
    assert not ht.registered and ht.mapped == {}


def test_pinned_path_matches_and_auto_prefers_zero_copy() -> None:
    dev = torch.device("cuda", 0)
    seg = _tables()
    auto = HostTables({"weights": seg["weights"]}, seg.base, dev, "auto", seg)
    assert auto.path == "zero_copy"
    auto.close()
    ht = HostTables({"weights": seg["weights"]}, seg.base, dev, "pinned", seg)
    assert ht.path == "pinned" and not ht.registered
    a = torch.randint(0, 4096, (5000,))
    b = torch.randint(0, 4096, (5000,))
    ra = ht.read("weights", a)
    rb = ht.read("weights", b)  # reuses the staging buffer: must wait for ra's copy
    assert torch.equal(ra.cpu(), seg["weights"][a]) and torch.equal(rb.cpu(), seg["weights"][b])
    vals = torch.randn(2, 16, device=dev)
    ht.write("weights", torch.tensor([10, 20]), vals)  # returns once host holds the rows
    assert torch.equal(seg["weights"][torch.tensor([10, 20])], vals.cpu())
    ht.close()


def test_zero_copy_required_but_unavailable_is_an_error() -> None:
    seg = _tables()
    base = torch.empty(0, dtype=torch.uint8)  # nothing to register: refused before any CUDA call
    with pytest.raises(FrugalError, match="cannot be mapped.*empty or null"):
        HostTables({"weights": seg["weights"]}, base, torch.device("cuda", 0), "zero_copy", seg)


class _RegisterTwice:
    """torch.cuda.cudart() whose cudaHostRegister registers the range, then fails registering it again.

    The second call fails inside CUDA (the range is already registered), past every range check:
    the failure a real registration can meet, on demand. ``held`` lists the ranges left registered.
    """

    def __init__(self, real: Any) -> None:
        self.real = real
        self.held: List[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> Any:
        assert int(self.real.cudaHostRegister(ptr, size, flags)) == 0
        self.held.append(ptr)
        return self.real.cudaHostRegister(ptr, size, flags)


def test_failed_registration_leaves_cuda_usable(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a cudaHostRegister that CUDA itself refused, the next allocation and kernel work, and
    an engine with host_path="auto" trains on the pinned path, in the same process."""
    dev = torch.device("cuda", 0)
    real = torch.cuda.cudart()
    seg = _tables()
    held = HostRegistration(seg.base.data_ptr(), seg.base.numel(), dev, seg)
    try:
        with pytest.raises(FrugalError, match="cudaHostRegister of .* failed with CUDA error"):
            HostRegistration(seg.base.data_ptr(), seg.base.numel(), dev, seg)
        x = torch.randn(1 << 20, device=dev)  # the first allocation and kernels after the failure
        assert float((x * 0).sum()) == 0.0
    finally:
        held.close()

    twice = _RegisterTwice(real)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: twice)
    with pytest.warns(UserWarning, match="using the pinned path"):
        engine = FrugalEngine(
            [TableSpec("t", 5000, 16)],
            OptimizerSpec("sgd", lr=0.5),
            FrugalConfig(lookahead=0, cache_ratio=0.1, host_path="auto"),
            device=dev,
        )
    monkeypatch.undo()
    for ptr in twice.held:  # the pinned path never uses the range the wrapper left registered
        assert int(real.cudaHostUnregister(ptr)) == 0
    try:
        assert engine.host.path == "pinned" and not engine.host.registered
        rows = torch.arange(0, 5000, 7)
        before = engine.read_rows(rows)[0]
        engine.begin_step(rows)
        out = engine.lookup(rows)
        assert out.device == dev and torch.equal(out.cpu(), before)
        engine.apply_gradients(rows, torch.ones(rows.shape[0], 16, device=dev))
        engine.flush()
        assert torch.allclose(engine.read_rows(rows)[0], before - 0.5)
    finally:
        engine.close()


def test_side_stream_waits_for_the_update_not_the_host() -> None:
    """A flush on the side stream after a marker sees the compute stream's last write."""
    dev = torch.device("cuda", 0)
    seg = _tables(rows=1 << 16, width=64)
    ht = HostTables({"weights": seg["weights"]}, seg.base, dev, "zero_copy", seg)
    streams = Streams(dev)
    store = torch.zeros(1 << 16, 64, device=dev)
    a = torch.randn(4096, 4096, device=dev)
    for _ in range(8):  # keep the compute stream busy so an unordered flush would read zeros
        a = a @ a / 64.0
    store.fill_(7.0)
    after = streams.mark()
    rows = torch.arange(1 << 16)
    with streams.side(after):
        ht.write("weights", rows, store.index_select(0, rows.to(dev)))
        done = streams.mark()
    done.synchronize()
    assert bool((seg["weights"] == 7.0).all())
    ht.close()


def _scenarios(world: int) -> list:
    cu = dict(device="cuda", steps=STEPS)
    both = [
        Scenario(lookahead=10, cache_ratio=0.05, optimizer="rowwise_adagrad", host_path=p, **cu)
        for p in ("zero_copy", "pinned")
    ]
    if world == 4:
        return both + [
            Scenario(lookahead=1, cache_ratio=0.0, optimizer="sgd", host_path="zero_copy", **cu),
            Scenario(lookahead=10, cache_ratio=0.05, optimizer="sgd", host_path="zero_copy", device="cuda", steps=200,
                     broken_lookahead=True),
        ]
    return both + [
        Scenario(lookahead=0, cache_ratio=0.05, optimizer="sgd", host_path="zero_copy", **cu),
        Scenario(lookahead=1, cache_ratio=0.0, optimizer="sgd", host_path="pinned", **cu),
        Scenario(lookahead=10, cache_ratio=1.0, optimizer="rowwise_adagrad", host_path="zero_copy", **cu),
        Scenario(lookahead=10, cache_ratio=0.05, optimizer="adam", host_path="zero_copy", flush_workers=2,
                 max_deferred_rows=100, **cu),
        Scenario(lookahead=10, cache_ratio=0.05, optimizer="rowwise_adagrad", host_path="zero_copy", in_host=True, **cu),
        Scenario(lookahead=10, cache_ratio=0.05, optimizer="sgd", host_path="zero_copy", device="cuda", steps=200,
                 broken_lookahead=True),
    ]


@pytest.mark.parametrize("world", [2, 4])
def test_engine_exact_with_ranks_sharing_one_gpu(world: int) -> None:
    scenarios = _scenarios(world)
    results = run_ranks(world, run_scenarios, scenarios, timeout=600)
    exact.check_results(world, scenarios, results)
    for i, sc in enumerate(scenarios):
        for r in range(world):
            m = results[r][i]
            assert m["device"] == "cuda:0" and m["host_path"] == sc.host_path, m
            assert m["registered"] == float(sc.host_path == "zero_copy"), m
    assert leaked_segments() == []


_LOW_MEMLOCK = """
import json, resource, sys, torch
from torchrec_frugal.host import shm
from torchrec_frugal.errors import FrugalError
from torchrec_frugal.host.registration import HostRegistration, can_lock_any
resource.setrlimit(resource.RLIMIT_MEMLOCK, (65536, 65536))
layout = shm.Layout([shm.Field("weights", torch.float32, (16 * 2**20 // 4,))])
seg = shm.SharedSegment.create(f"{shm.PREFIX}{shm.new_run_id()}_memlock", layout)
seg.unlink()
try:
    HostRegistration(seg.base.data_ptr(), seg.base.numel(), torch.device("cuda", 0), seg).close()
    out = {"registered": True, "error": ""}
except FrugalError as e:
    out = {"registered": False, "error": str(e)}
out["privileged"] = can_lock_any()
print(json.dumps(out))
"""


def test_registration_under_a_small_locked_memory_limit_names_it() -> None:
    """16 MiB registered under ``ulimit -l`` 64 KiB: registered (the privilege or the driver does not
    count it), or refused with an error that names the limit and the fix."""
    import json
    import os
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=repo + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", _LOW_MEMLOCK], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    print(f"registration under ulimit -l 64 KiB: {out}")
    if not out["registered"]:
        assert "ulimit -l) is 65536 bytes" in out["error"] or out["privileged"], out


def test_copies_made_ahead_reach_the_compute_stream_and_gradients_reach_host() -> None:
    """CopyStream: indices moved on a stream of their own, used by the compute stream after its
    event without a host wait; GradientStaging: two page-locked buffers used in turn."""
    from torchrec_frugal.engine.gradient_staging import GradientStaging
    from torchrec_frugal.engine.streams import CopyStream

    dev = torch.device("cuda", 0)
    copies = CopyStream(dev)
    src = [torch.arange(10_000).pin_memory(), None, torch.randn(500).pin_memory()]
    moved, ready = copies.to_device(src)
    copies.use(moved, ready)  # the current stream now waits for the copies
    assert moved[1] is None and moved[0].device == dev
    assert torch.equal(moved[0].cpu(), src[0]) and torch.equal(moved[2].cpu(), src[2])
    staging = GradientStaging(8, dev)
    grads = [torch.randn(n, 8, device=dev) for n in (100, 3000, 50)]
    outs = []
    for g in grads:
        host, copied = staging.to_host(g)
        copied.synchronize()
        assert host.is_pinned() and torch.equal(host, g.cpu())
        outs.append(host.data_ptr())
    assert outs[0] != outs[1]  # steps alternate buffers


def test_a_planned_step_reads_what_rows_read(tmp_path: Any) -> None:
    """FrugalEngine.plan_step on CUDA: the plan's lookup (static cache, host reads) gives the
    values a lookup of the same rows gives, and its gradients train the same tables."""
    dev = torch.device("cuda", 0)
    counts = [torch.arange(2000, 0, -1, dtype=torch.float32)]
    out = []
    for planned in (False, True):
        cfg = FrugalConfig(lookahead=2, cache_ratio=0.1, shm_dir=str(tmp_path))
        with FrugalEngine([TableSpec("t", 2000, 8)], OptimizerSpec("rowwise_adagrad", lr=0.1), cfg, device=dev,
                          presample_counts=counts, seed=3) as eng:  # fmt: skip
            gen = torch.Generator().manual_seed(0)
            for _ in range(20):
                rows = torch.unique(torch.randint(0, 2000, (300,), generator=gen))
                step = eng.plan_step(rows) if planned else rows
                eng.begin_step(step)
                vals = eng.lookup(step)
                eng.apply_gradients(step, vals * 0.5)
            eng.flush()
            out.append(eng.read_rows()[0].clone())
    assert torch.equal(out[0], out[1])
