"""The device layer on CPU: lookup split, host-path choice, markers and streams, staged host I/O.

These pieces run unchanged on CUDA (tests/engine/test_cuda_engine.py covers what needs a GPU); here the
CPU implementations are exercised as the engine uses them, including a 2-rank exactness run of
the pinned (staged) path with background flushes through dynamic slots.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Any, List, Optional, Tuple

import numpy as np
import pytest
import torch

from torchrec_frugal.host.launch import run_ranks
from engine_reference import Scenario, run_scenario, run_scenarios
from torchrec_frugal.host import registration as host_registration, shm
from torchrec_frugal.config import FrugalConfig
from torchrec_frugal.errors import FrugalError
from torchrec_frugal.host.registration import PAGE_BYTES, HostRegistration, registration_range
from torchrec_frugal.engine.host_tables import HostTables, choose_host_path, pick_path
from torchrec_frugal.engine.lookup_plan import plan_lookup
from torchrec_frugal.engine.streams import REACHED, Streams, resolve_device, to_device

CPU = torch.device("cpu")
CUDA = torch.device("cuda", 0)


def test_choose_host_path() -> None:
    assert choose_host_path("auto", CPU, can_map=True) == "zero_copy"
    assert choose_host_path("zero_copy", CPU, can_map=True) == "zero_copy"
    assert choose_host_path("pinned", CPU, can_map=True) == "pinned"
    assert choose_host_path("auto", CUDA, can_map=True) == "zero_copy"
    assert choose_host_path("auto", CUDA, can_map=False) == "pinned"
    assert choose_host_path("pinned", CUDA, can_map=True) == "pinned"
    assert choose_host_path("zero_copy", CUDA, can_map=True) == "zero_copy"
    with pytest.raises(FrugalError, match="cannot be mapped"):
        choose_host_path("zero_copy", CUDA, can_map=False)
    with pytest.raises(ValueError, match="host_path"):
        choose_host_path("uva", CPU, can_map=True)
    with pytest.raises(ValueError, match="host_path"):
        FrugalConfig(host_path="uva")


def test_resolve_device() -> None:
    assert resolve_device(None) == CPU
    assert resolve_device(torch.device("cpu")) == CPU
    assert resolve_device(torch.device("cuda", 1)) == torch.device("cuda", 1)


@pytest.mark.parametrize("seed", range(5))
def test_plan_lookup_splits_store_and_host_reads(seed: int) -> None:
    rng = np.random.default_rng(seed)
    num_rows, num_static = 500, 40
    slot_of = np.full(num_rows, -1, dtype=np.int64)
    held = rng.choice(num_rows, 70, replace=False)
    slot_of[held] = rng.permutation(70)  # slots < 40 static, the rest dynamic
    rows = rng.integers(0, num_rows, 300)
    plan = plan_lookup(slot_of, num_static, rows)
    hit_pos, hit_slots, miss_pos, miss_rows, expand = (p.numpy() for p in plan.parts())
    assert expand.size == 0 and plan.n_host == plan.n_miss  # not asked to deduplicate
    # Every output position exactly once; hits read their slot, misses their row from host.
    assert sorted(np.concatenate([hit_pos, miss_pos]).tolist()) == list(range(rows.shape[0]))
    assert np.array_equal(hit_slots, slot_of[rows[hit_pos]]) and (hit_slots >= 0).all()
    assert np.array_equal(miss_rows, rows[miss_pos]) and (slot_of[miss_rows] == -1).all()
    assert plan.n_static_hits == int(np.count_nonzero(slot_of[rows] >= 0) - np.count_nonzero(slot_of[rows] >= num_static))
    # Reassembling from a store and a host table gives the plain gather.
    host = torch.randn(num_rows, 3)
    store = torch.zeros(70, 3)
    store[torch.from_numpy(slot_of[held])] = host[torch.from_numpy(held)]
    out = torch.empty(rows.shape[0], 3)
    hp, hs, mp, mr, _ = plan.parts()
    out.index_copy_(0, hp, store.index_select(0, hs))
    out.index_copy_(0, mp, host.index_select(0, mr))
    assert torch.equal(out, host[torch.from_numpy(rows)])


@pytest.mark.parametrize("seed", range(5))
def test_plan_lookup_sorted_reads_read_each_host_row_once_in_order(seed: int) -> None:
    rng = np.random.default_rng(seed)
    num_rows = 400
    slot_of = np.full(num_rows, -1, dtype=np.int64)
    held = rng.choice(num_rows, 30, replace=False)
    slot_of[held] = np.arange(30)
    rows = (rng.zipf(1.3, 600) - 1) % num_rows  # duplicates, in no order
    plan = plan_lookup(slot_of, 30, rows, sorted_reads=True)
    hp, hs, mp, host_rows, expand = plan.parts()
    hr = host_rows.numpy()
    assert np.array_equal(hr, np.unique(rows[mp.numpy()]))  # each distinct host row once, sorted
    assert plan.n_expand == plan.n_miss > plan.n_host
    host = torch.randn(num_rows, 4)
    store = host[torch.from_numpy(held)]
    out = torch.empty(rows.shape[0], 4)
    out.index_copy_(0, hp, store.index_select(0, hs))
    out.index_copy_(0, mp, host.index_select(0, host_rows).index_select(0, expand))
    assert torch.equal(out, host[torch.from_numpy(rows)])
    # Already unique and sorted (what the TorchRec glue passes): nothing to expand.
    srt = np.unique(rows)
    again = plan_lookup(slot_of, 30, srt, sorted_reads=True)
    assert again.n_expand == 0 and again.n_host == again.n_miss


def plan_lookup_with_numpy_unique(slot_of: np.ndarray, num_static: int, rows: np.ndarray) -> np.ndarray:
    """``plan_lookup(..., sorted_reads=True).packed`` as it was computed with ``np.unique``."""
    slots = slot_of[rows]
    hit_pos = np.flatnonzero(slots >= 0)
    miss_pos = np.flatnonzero(slots < 0)
    host_rows = rows[miss_pos]
    expand = np.zeros(0, dtype=np.int64)
    if host_rows.size > 1 and not bool(np.all(host_rows[1:] > host_rows[:-1])):
        host_rows, expand = np.unique(host_rows, return_inverse=True)
        expand = expand.reshape(-1)
    return np.concatenate([hit_pos, slots[hit_pos], miss_pos, host_rows, expand])


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("seed", range(4))
def test_plan_lookup_sorted_reads_equal_numpy_unique(seed: int, dtype: type) -> None:
    """The deduplication of host reads gives exactly what ``np.unique`` gave: values, dtype, order."""
    rng = np.random.default_rng(seed)
    num_rows = [1, 7, 400, 200_000][seed]
    slot_of = np.full(num_rows, -1, dtype=np.int64)
    held = rng.choice(num_rows, size=num_rows // 4, replace=False)
    slot_of[held] = np.arange(held.shape[0])
    for n in (0, 1, 2, 3, 60, 5000):
        for rows in (rng.integers(0, num_rows, size=n), np.sort(rng.integers(0, num_rows, size=n))):
            rows = rows.astype(dtype)
            plan = plan_lookup(slot_of, 10, rows, sorted_reads=True)
            ref = plan_lookup_with_numpy_unique(slot_of, 10, rows)
            assert plan.packed.numpy().dtype == ref.dtype and np.array_equal(plan.packed.numpy(), ref)


def test_plan_lookup_edges() -> None:
    slot_of = np.array([0, -1, 1, -1], dtype=np.int64)
    none = plan_lookup(slot_of, 2, np.zeros(0, dtype=np.int64))
    assert (none.n_hit, none.n_miss, none.packed.numel()) == (0, 0, 0)
    all_hit = plan_lookup(slot_of, 2, np.array([2, 0, 2]))
    assert (all_hit.n_hit, all_hit.n_miss, all_hit.n_static_hits) == (3, 0, 3)
    assert all_hit.parts()[1].tolist() == [1, 0, 1]
    all_miss = plan_lookup(slot_of, 2, np.array([3, 1]))
    assert (all_miss.n_hit, all_miss.n_miss) == (0, 2)
    assert all_miss.parts()[3].tolist() == [3, 1] and all_miss.parts()[2].tolist() == [0, 1]
    one = plan_lookup(slot_of, 2, np.array([3, 3, 1]), sorted_reads=True)
    assert one.parts()[3].tolist() == [1, 3] and one.parts()[4].tolist() == [1, 1, 0]


def test_streams_and_markers_on_cpu() -> None:
    streams = Streams(CPU)
    assert streams.side_stream is None
    m = streams.mark()
    assert m is REACHED and m.query()
    m.synchronize()
    x = torch.zeros(4)
    with streams.side(m):  # runs the block in place: CPU work is done when it returns
        x.add_(1)
        done = streams.mark()
    done.synchronize()
    assert torch.equal(x, torch.ones(4))


def test_to_device_on_cpu_moves_nothing() -> None:
    a, b = torch.arange(3), torch.arange(5)
    out = to_device([a, b], CPU)
    assert out[0] is a and out[1] is b


def _segment(rows: int, width: int) -> shm.SharedSegment:
    layout = shm.Layout([shm.Field("weights", torch.float32, (rows, width)), shm.Field("state", torch.float32, (rows, 1))])
    seg = shm.SharedSegment.create(f"{shm.PREFIX}{shm.new_run_id()}_devtest", layout)
    seg.unlink()
    return seg


@pytest.mark.parametrize("path", ["zero_copy", "pinned"])
def test_host_tables_read_write_on_cpu(path: str) -> None:
    seg = _segment(100, 4)
    seg["weights"].copy_(torch.randn(100, 4))
    ht = HostTables({"weights": seg["weights"], "state": seg["state"]}, seg.base, CPU, path, seg)
    assert ht.path == path and not ht.registered
    assert seg.base.numel() == seg.layout.nbytes
    rows = torch.tensor([5, 3, 99, 5])
    first = ht.read("weights", rows)
    assert torch.equal(first, seg["weights"][rows])
    if path == "zero_copy":
        assert ht.mapped["weights"] is seg["weights"]  # on CPU the mapping is the table itself
    # A later read reuses the staging buffer; the first result must not change with it.
    keep = first.clone()
    ht.read("weights", torch.tensor([0, 1, 2, 4]))
    assert torch.equal(first, keep)
    first.add_(100)
    assert not torch.equal(seg["weights"][rows], first)  # results are copies, not views of host
    vals = torch.randn(2, 4)
    ht.write("weights", torch.tensor([7, 8]), vals)
    assert torch.equal(seg["weights"][7:9], vals)
    ht.write("state", torch.tensor([1]), torch.tensor([[3.0]]))
    assert float(seg["state"][1, 0]) == 3.0
    ht.close()
    assert ht.mapped == {}


def test_pick_path_takes_the_nearest_calibrated_size() -> None:
    choices = [(1024, "pinned"), (16384, "zero_copy"), (262144, "pinned")]
    assert pick_path(choices, 1) == "pinned"
    assert pick_path(choices, 3000) == "pinned"  # nearer 1k than 16k on a log scale
    assert pick_path(choices, 8000) == "zero_copy"
    assert pick_path(choices, 100_000) == "pinned"
    assert pick_path(choices, 10**9) == "pinned"


def test_calibration_times_both_paths_and_leaves_the_tables_unchanged() -> None:
    seg = _segment(5000, 4)
    seg["weights"].copy_(torch.randn(5000, 4))
    seg["state"].copy_(torch.randn(5000, 1))
    before = seg["weights"].clone(), seg["state"].clone()
    ht = HostTables({"weights": seg["weights"], "state": seg["state"]}, seg.base, CPU, "auto", seg)
    assert ht.path_by_size == {}  # on CPU the table is read in place: nothing to choose
    ht.calibrate(sizes=(10, 300, 10**6), reps=2)
    sizes = [int(r["rows"]) for r in ht.calibration]  # distinct rows drawn at 10, 300 and 5000 (capped)
    assert len(sizes) == 3 and 0 < sizes[0] <= 10 < sizes[1] <= 300 < sizes[2] <= 5000
    for r in ht.calibration:
        assert all(r[f"{op}_{p}_s"] > 0 for op in ("read", "write") for p in ("zero_copy", "pinned"))
    assert set(ht.path_by_size) == {"read", "write"} and all(len(v) == 3 for v in ht.path_by_size.values())
    assert torch.equal(seg["weights"], before[0]) and torch.equal(seg["state"], before[1])
    # Whatever was chosen per size, reads and writes are exact; force one of each.
    ht.path_by_size = {"read": [(10, "pinned"), (1000, "zero_copy")], "write": [(10, "zero_copy"), (1000, "pinned")]}
    for n in (3, 2000):
        rows = torch.randperm(5000)[:n]
        assert torch.equal(ht.read("weights", rows), seg["weights"][rows])
        vals = torch.randn(n, 4)
        ht.write("weights", rows, vals)
        assert torch.equal(seg["weights"][rows], vals)
    ht.close()


@pytest.mark.parametrize("in_host", [None, False])
def test_engine_pinned_path_single_rank(in_host) -> None:
    """The staged path gives exactly what the in-place path gives (one rank, lookahead on)."""
    common = dict(lookahead=4, cache_ratio=0.05, optimizer="rowwise_adagrad", steps=150, in_host=in_host)
    staged = run_scenario(0, 1, Scenario(host_path="pinned", **common))
    direct = run_scenario(0, 1, Scenario(host_path="zero_copy", **common))
    assert staged["host_path"] == "pinned" and direct["host_path"] == "zero_copy"
    for m in (staged, direct):
        assert m["max_rel_read_error"] <= 1e-5 and m["host_vs_ref"] <= 1e-5, m
        assert m["cache_vs_host"] == 0.0 and m["dynamic_after_flush"] == 0.0, m
    assert staged["host_vs_ref"] == direct["host_vs_ref"]


def test_engine_pinned_path_two_ranks() -> None:
    """Staged reads and writes with background flushers and dynamic slots stay exact on 2 ranks."""
    scenarios = [
        Scenario(lookahead=10, cache_ratio=0.05, optimizer="rowwise_adagrad", steps=300, in_host=False, host_path="pinned"),
        Scenario(lookahead=1, cache_ratio=0.0, optimizer="sgd", steps=300, in_host=False, host_path="pinned",
                 flush_workers=2, max_deferred_rows=50),
    ]
    results = run_ranks(2, run_scenarios, scenarios, timeout=600)
    for per_rank in zip(*results):
        for m in per_rank:
            assert m["host_path"] == "pinned"
            assert m["max_rel_read_error"] <= 1e-5 and m["host_vs_ref"] <= 1e-5, m
            assert m["cache_vs_host"] == 0.0 and m["dynamic_after_flush"] == 0.0, m
            assert m["flushed_rows"] > 0, m


# ---------------------------------------------------------------------------------------------- registration
class FakeCudart:
    """Stands in for ``torch.cuda.cudart()``: records calls; cudaHostRegister returns ``register_error``."""

    def __init__(self, register_error: int = 0, get_last_error: bool = True) -> None:
        self.calls: List[Tuple[Any, ...]] = []
        self.register_error = register_error
        if get_last_error:
            self.cudaGetLastError = lambda: self.calls.append(("cudaGetLastError",)) or 0

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:
        self.calls.append(("cudaHostRegister", ptr, size, flags))
        return self.register_error

    def cudaHostUnregister(self, ptr: int) -> int:
        self.calls.append(("cudaHostUnregister", ptr))
        return 0

    def cudaGetErrorString(self, err: int) -> str:
        return {1: "invalid argument", 712: "part or all of the requested memory range is already mapped"}[int(err)]


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Patch the CUDA entry points HostRegistration uses; returns a function installing a FakeCudart."""

    def install(cudart: FakeCudart, loaded: Optional[object] = None) -> FakeCudart:
        monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
        monkeypatch.setattr(torch.cuda, "device", lambda d: nullcontext())
        monkeypatch.setattr(torch.cuda, "init", lambda: None)
        monkeypatch.setattr(host_registration, "loaded_cudart", lambda: loaded)
        return cudart

    return install


@pytest.mark.parametrize(
    "ptr, nbytes, message",
    [
        (7 * PAGE_BYTES, 0, "at 0x7000: the range of 0 bytes is empty or null"),
        (7 * PAGE_BYTES, -5, "empty or null"),
        (0, 4 * PAGE_BYTES, "at 0x0: .*empty or null"),
        (7 * PAGE_BYTES + 64, PAGE_BYTES, "at 0x7040 .4096 bytes.: the start is not aligned"),
    ],
)
def test_registration_refuses_a_bad_range_without_calling_cuda(fake_cuda: Any, ptr: int, nbytes: int, message: str) -> None:
    assert PAGE_BYTES == 4096  # the messages above spell 4 KiB pages
    cudart = fake_cuda(FakeCudart())
    with pytest.raises(FrugalError, match=message):
        HostRegistration(ptr, nbytes, CUDA, owner=None)
    assert cudart.calls == []  # a refused range never reaches CUDA, so no error state is left


def test_registration_range_covers_whole_pages() -> None:
    assert registration_range(3 * PAGE_BYTES, 1) == (3 * PAGE_BYTES, PAGE_BYTES)
    assert registration_range(3 * PAGE_BYTES, PAGE_BYTES) == (3 * PAGE_BYTES, PAGE_BYTES)
    assert registration_range(3 * PAGE_BYTES, 2 * PAGE_BYTES + 1) == (3 * PAGE_BYTES, 3 * PAGE_BYTES)
    seg = _segment(10, 3)  # a shared segment's mapping starts on a page and covers its last page
    start, length = registration_range(seg.base.data_ptr(), seg.base.numel())
    assert start == seg.base.data_ptr() and length == PAGE_BYTES and seg.layout.nbytes < PAGE_BYTES


def test_registration_registers_whole_pages_and_unregisters(fake_cuda: Any) -> None:
    cudart = fake_cuda(FakeCudart())
    reg = HostRegistration(5 * PAGE_BYTES, 2 * PAGE_BYTES + 100, CUDA, owner=None)
    assert cudart.calls == [("cudaHostRegister", 5 * PAGE_BYTES, 3 * PAGE_BYTES, 0x03)]
    assert reg.registered and reg.nbytes == 2 * PAGE_BYTES + 100
    reg.close()
    reg.close()
    assert not reg.registered and cudart.calls[1:] == [("cudaHostUnregister", 5 * PAGE_BYTES)]


def test_failed_registration_clears_the_cuda_error(fake_cuda: Any) -> None:
    cudart = fake_cuda(FakeCudart(register_error=712))
    with pytest.raises(FrugalError, match=r"at 0x5000 failed with CUDA error 712 \(part or all") as e:
        HostRegistration(5 * PAGE_BYTES, PAGE_BYTES, CUDA, owner=None)
    assert "could not be cleared" not in str(e.value)
    assert [c[0] for c in cudart.calls] == ["cudaHostRegister", "cudaGetLastError"]


def test_failed_registration_clears_through_the_loaded_runtime(fake_cuda: Any) -> None:
    """Where torch does not expose cudaGetLastError, the runtime library torch loaded is called."""
    cleared: List[int] = []

    class Runtime:
        def cudaGetLastError(self) -> int:
            cleared.append(1)
            return 1

    fake_cuda(FakeCudart(register_error=1, get_last_error=False), loaded=Runtime())
    with pytest.raises(FrugalError, match=r"CUDA error 1 \(invalid argument\)$"):
        HostRegistration(5 * PAGE_BYTES, PAGE_BYTES, CUDA, owner=None)
    assert cleared == [1]


def test_failed_registration_says_when_the_error_stays(fake_cuda: Any) -> None:
    fake_cuda(FakeCudart(register_error=1, get_last_error=False), loaded=None)
    with pytest.raises(FrugalError, match="could not be cleared"):
        HostRegistration(5 * PAGE_BYTES, PAGE_BYTES, CUDA, owner=None)


def test_loaded_runtime_is_the_one_in_this_process() -> None:
    """Without CUDA no libcudart is mapped here, and none is loaded anew to look for one."""
    if torch.cuda.is_available():
        lib = host_registration.loaded_cudart()
        assert lib is not None and hasattr(lib, "cudaGetLastError")
    else:
        assert host_registration.loaded_cudart() is None


def test_failed_registration_names_the_locked_memory_limit(fake_cuda: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a small ``ulimit -l`` without CAP_IPC_LOCK, the error (and so the fallback's warning) says so."""
    import resource

    fake_cuda(FakeCudart(register_error=1))
    monkeypatch.setattr(resource, "getrlimit", lambda which: (8192, 8192))
    monkeypatch.setattr(host_registration, "can_lock_any", lambda: False)
    with pytest.raises(FrugalError, match=r"CUDA error 1 .*page-locking the 12288 bytes .* is 8192 bytes .*ulimit -l unlimited"):
        HostRegistration(5 * PAGE_BYTES, 3 * PAGE_BYTES, CUDA, owner=None)
    monkeypatch.setattr(resource, "getrlimit", lambda which: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    with pytest.raises(FrugalError, match=r"CUDA error 1 \(invalid argument\)$"):
        HostRegistration(5 * PAGE_BYTES, 3 * PAGE_BYTES, CUDA, owner=None)
