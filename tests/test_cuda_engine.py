"""The CUDA path: mapped host tables, staged copies, the flush stream, and exactness on one GPU.

Several ranks share GPU 0 (as on one-GPU machines): every rank's engine registers the same
shared segment in its own process and reads it from the device. scripts/device_check.sh runs
this file on a GPU machine; without CUDA every test is skipped.
"""
from __future__ import annotations

import pytest
import torch

import test_engine_exactness as exact
from dist_harness import run_ranks
from engine_reference import Scenario, run_scenarios
from torchrec_frugal import shm
from torchrec_frugal.device import HostTables, Streams
from torchrec_frugal.errors import FrugalError

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
    base = torch.empty(0, dtype=torch.uint8)  # nothing to register
    with pytest.raises(FrugalError, match="cannot be mapped"):
        HostTables({"weights": seg["weights"]}, base, torch.device("cuda", 0), "zero_copy", seg)


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
    exact._check(world, scenarios, results)
    for i, sc in enumerate(scenarios):
        for r in range(world):
            m = results[r][i]
            assert m["device"] == "cuda:0" and m["host_path"] == sc.host_path, m
            assert m["registered"] == float(sc.host_path == "zero_copy"), m
    assert shm.list_segments() == []
