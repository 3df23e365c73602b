"""One machine's hardware profile: the typed constants the cost model prices a step with, and
their checks (every field, by name, where a profile file is read)."""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

DEVICE_KINDS = ("cpu", "cuda")
UVM_MISS_S = 5e-9
"""Device time per miss of FBGEMM's LRU cache when a profile does not set ``uvm_miss_s``: an
**assumption** (docs/cost_model.md, "TorchRec's offloading"): the miss's share of sorting the misses
by cache set and of ``lru_cache_insert`` (a warp sorts the set's 32 timestamps, evicts, loads)."""


class ProfileError(ValueError):
    """A profile file that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class HardwareProfile:
    """One machine: N devices (GPUs, or the cores of a CPU) sharing one host memory.

    Bandwidths in bytes/s, times in seconds. "Device" is where a rank trains: a GPU, or host
    memory and one core on a CPU machine (``device == "cpu"``: no host<->device copies).
    """

    name: str
    description: str
    device: str  # "cpu" or "cuda"
    devices: int  # GPUs in the box (cpu: cores); ranks beyond it share devices
    host_cores: int  # cores for the ranks' host-side work and their background threads
    device_memory_bytes: float  # per device
    p2p: bool  # devices exchange data directly; False: collectives bounce through host memory
    # dense compute
    dense_flops_per_s: float  # fp32 MLP forward+backward throughput of one rank (cpu: one thread)
    dense_thread_efficiency: float  # cpu: speed-up of each extra intra-op thread (0..1); gpu: 0
    op_overhead_s: float  # launch/dispatch time of one dense operator
    # the training loop around the model (TorchRec pipeline, input batch, optimizers)
    framework_step_s: float  # fixed per step
    framework_id_s: float  # per sparse id of the rank's batch (KJT handling, input data)
    framework_dist_step_s: float  # per step when W > 1: the distributed loop's own work (dists, DDP, ranks' switches)
    # embedding kernels in device memory
    device_gather_bw: float  # random 128-byte rows gathered in device memory
    device_scatter_bw: float  # random 128-byte rows written in device memory
    device_mem_bw: float  # streaming device memory (dense optimizer, whole-table updates)
    kernel_id_s: float  # per id: pooling and gradient accumulation of TorchRec's TBE kernel
    # host memory and the host link
    host_memcpy_bw: float  # one host thread copying contiguous memory
    host_mem_bw: float  # whole host memory system (bounds host-bounced collectives)
    host_read_random_bw: float  # device reads of random 128-byte host rows (large table)
    host_read_sorted: List[Tuple[float, float]]  # (distinct rows read in row order, bytes/s)
    host_write_bw: float  # device writes of random 128-byte rows into host memory (flush)
    h2d_bw: float  # pinned host-to-device copy (cpu: ignored)
    d2h_bw: float  # pinned device-to-host copy (cpu: ignored)
    # collectives between ranks
    a2a_bw: float  # bytes one rank sends per second in an all-to-all (p2p or host-bounced)
    a2a_latency_s: float  # per peer and call
    allreduce_bw: float  # bus bandwidth of an all-reduce
    allreduce_latency_s: float  # per call and ring step
    # Frugal's host-side work per rank (the planned step: docs/cost_model.md, "Frugal's threads")
    frugal_train_thread_s: float  # the training thread's own frugal work per step (flat in the batch)
    planner_step_s: float  # the planner thread, per batch: fixed
    planner_id_s: float  # the planner thread, per id of the rank's batch
    planner_row_s: float  # the planner thread, per distinct row of the rank's batch
    exchange_step_s: float  # the exchange worker, per step: fixed (announce, exchange, bookkeeping)
    exchange_row_s: float  # the exchange worker, per distinct row of the step
    lookahead_row_s: float  # the exchange worker, per distinct announced row when L > 0 (window bookkeeping)
    sync_latency_s: float  # one barrier of the ranks through shared memory
    # between machines (optional: only plans spanning nodes need them)
    network_bw: Optional[float] = None  # bytes/s one node sends to the others (its NICs together)
    network_latency_s: Optional[float] = None  # per remote peer and call
    host_memory_bytes: Optional[float] = None  # per node: holds Frugal's tables (None: not checked)
    frugal_kernel_id_s: Optional[float] = None  # per id: Frugal's pooling and its transposed backward (None: kernel_id_s)
    # the last-level cache (optional: None prices every row at the memory rates above)
    llc_bytes: Optional[float] = None  # last-level cache of one node, shared by its ranks
    llc_gather_bw: Optional[float] = None  # random rows gathered from a table held in the last-level cache
    llc_scatter_bw: Optional[float] = None  # random rows written into a table held in the last-level cache
    # TorchRec's offloading (optional: None takes UVM_MISS_S)
    uvm_miss_s: Optional[float] = None  # fused_uvm_caching: device time of one cache miss (FBGEMM's sort by set, LRU insert)
    notes: str = ""
    extra: Dict[str, Any] = field(default_factory=dict)  # free-form facts (measured points, dates)

    @property
    def device_is_host(self) -> bool:
        return self.device == "cpu"

    @property
    def has_llc(self) -> bool:
        """Whether gathers and scatters distinguish tables held in the last-level cache."""
        return self.llc_bytes is not None and self.llc_gather_bw is not None and self.llc_scatter_bw is not None

    @property
    def uvm_miss_cost_s(self) -> float:
        """Device time per miss of a fused_uvm_caching cache: ``uvm_miss_s``, or ``UVM_MISS_S`` where unset."""
        return UVM_MISS_S if self.uvm_miss_s is None else self.uvm_miss_s

    @property
    def frugal_id_s(self) -> float:
        """Frugal's per-id kernel work: ``frugal_kernel_id_s``, or stock's ``kernel_id_s`` where unmeasured."""
        return self.kernel_id_s if self.frugal_kernel_id_s is None else self.frugal_kernel_id_s

    def host_read_bw(self, rows: float, row_bytes: float, ordered: bool = True) -> float:
        """Bytes/s of reading ``rows`` distinct host rows of ``row_bytes``.

        Rows read in row order (the engine's order) follow the measured curve, interpolated in
        log(rows); random order gets ``host_read_random_bw``. Rows wider than 128 bytes: the random
        rate scales with the row size up to the ordered rate (per-row translation costs dominate
        small rows: docs/gpu.md and gpu-h200 measurements, dim 32 against dim 128).
        """
        random = self.host_read_random_bw * max(1.0, row_bytes / 128.0)
        if not ordered:
            return min(random, self.host_read_sorted[-1][1])
        xs = [math.log(max(r, 1.0)) for r, _ in self.host_read_sorted]
        ys = [bw for _, bw in self.host_read_sorted]
        x = math.log(max(rows, 1.0))
        if x <= xs[0]:
            sorted_bw = ys[0]
        elif x >= xs[-1]:
            sorted_bw = ys[-1]
        else:
            i = next(k for k in range(1, len(xs)) if xs[k] >= x)
            w = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
            sorted_bw = ys[i - 1] + w * (ys[i] - ys[i - 1])
        return max(sorted_bw, min(random, ys[-1]))

    def to_json(self) -> Dict[str, Any]:
        d = asdict(self)
        d["host_read_sorted"] = [list(p) for p in self.host_read_sorted]
        return d

    def save(self, path: Union[str, Path]) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")


_LLC = ("llc_bytes", "llc_gather_bw", "llc_scatter_bw")
_OPTIONAL = {"notes", "extra", "network_bw", "network_latency_s", "host_memory_bytes", "frugal_kernel_id_s", "uvm_miss_s", *_LLC}
_OBSOLETE = {"engine_step_s", "engine_row_s"}
"""Fields of profiles written before the planned step (the engine's host work priced on the training
thread); a file holding them still loads, without them (docs/cost_model.md, "Frugal's threads")."""
_NONNEGATIVE = {"dense_thread_efficiency", "op_overhead_s", "framework_step_s", "framework_id_s", "framework_dist_step_s",
                "kernel_id_s", "a2a_latency_s", "allreduce_latency_s", "frugal_train_thread_s", "planner_step_s",
                "planner_id_s", "planner_row_s", "exchange_step_s", "exchange_row_s", "lookahead_row_s",
                "sync_latency_s", "network_latency_s", "frugal_kernel_id_s", "uvm_miss_s"}  # fmt: skip


def profile_from_dict(d: Dict[str, Any], where: str = "profile") -> HardwareProfile:
    """Check every field of ``d`` and build the profile; errors name ``where`` and the field."""
    if not isinstance(d, dict):
        raise ProfileError(f"{where}: expected a JSON object, got {type(d).__name__}")
    known = {f.name: f for f in fields(HardwareProfile)}
    d = {k: v for k, v in d.items() if k not in _OBSOLETE}
    unknown = sorted(set(d) - set(known))
    if unknown:
        raise ProfileError(f"{where}: unknown field(s) {', '.join(unknown)}")
    missing = [n for n in known if n not in d and n not in _OPTIONAL]
    if missing:
        raise ProfileError(f"{where}: missing field(s) {', '.join(missing)}")
    out: Dict[str, Any] = {}
    for name, f in known.items():
        if name not in d:
            continue
        v = d[name]
        if name in ("network_bw", "network_latency_s", "host_memory_bytes", "frugal_kernel_id_s", "uvm_miss_s", *_LLC) and v is None:
            out[name] = None
            continue
        if name in ("name", "description", "notes"):
            if not isinstance(v, str):
                raise ProfileError(f"{where}: field {name!r} must be a string, got {v!r}")
        elif name == "device":
            if v not in DEVICE_KINDS:
                raise ProfileError(f"{where}: field 'device' must be one of {DEVICE_KINDS}, got {v!r}")
        elif name == "p2p":
            if not isinstance(v, bool):
                raise ProfileError(f"{where}: field 'p2p' must be true or false, got {v!r}")
        elif name in ("devices", "host_cores"):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ProfileError(f"{where}: field {name!r} must be an integer >= 1, got {v!r}")
        elif name == "host_read_sorted":
            v = _curve(v, where)
        elif name == "extra":
            if not isinstance(v, dict):
                raise ProfileError(f"{where}: field 'extra' must be an object, got {v!r}")
        else:
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                raise ProfileError(f"{where}: field {name!r} must be a finite number, got {v!r}")
            if v < 0 or (v == 0 and name not in _NONNEGATIVE):
                raise ProfileError(f"{where}: field {name!r} must be {'>= 0' if name in _NONNEGATIVE else '> 0'}, got {v!r}")
            v = float(v)
        out[name] = v
    if len({out.get(k) is None for k in _LLC}) > 1:
        raise ProfileError(f"{where}: fields {', '.join(_LLC)} go together: set all three or none")
    if out["dense_thread_efficiency"] > 1:
        raise ProfileError(f"{where}: field 'dense_thread_efficiency' must be in [0, 1], got {out['dense_thread_efficiency']}")
    return HardwareProfile(**out)


def _curve(v: Any, where: str) -> List[Tuple[float, float]]:
    err = ProfileError(f"{where}: field 'host_read_sorted' must be a list of [rows, bytes_per_s] pairs "
                       f"with rows increasing and both > 0, got {v!r}")  # fmt: skip
    if not isinstance(v, list) or not v:
        raise err
    pts: List[Tuple[float, float]] = []
    for p in v:
        if not (isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(x, (int, float)) and x > 0 for x in p)):
            raise err
        pts.append((float(p[0]), float(p[1])))
    if any(b[0] <= a[0] for a, b in zip(pts, pts[1:])):
        raise err
    return pts
