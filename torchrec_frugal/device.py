"""How host tables reach an engine's device, and the streams and events that order the copies.

The engine is written once against three small abstractions, each with a CUDA implementation and
a CPU one that is the same code path with nothing to overlap:

* :class:`HostTables`: reads and writes rows of the shared host tables from the device. Two paths:
  ``zero_copy`` (the segment is page-locked with ``cudaHostRegister`` and mapped into the device's
  address space, so a gather kernel reads host rows straight over PCIe and a scatter kernel
  writes them back) and ``pinned`` (the host gathers into a page-locked staging buffer, then one
  asynchronous copy moves it; writes go the other way). On a CPU device the mapped view is the
  host table itself.
* :class:`Streams`: the caller's compute stream plus a side stream on which flushes run, so host
  writes never queue behind (or block) the training step's kernels.
* Markers (:meth:`Streams.mark`): a CUDA event recorded on the current stream; on CPU every
  operation has finished when it returns, so a marker is reached as soon as it is taken.

The gate stays a wait on the owners' progress counters in shared memory, with the events at its
edges: a flush stream waits for the update's event on the device (the host does not block), an
owner raises its flushed-through counter only once the flush's event is reached, and a rank
marks its lookup so that it stages gradients (letting owners overwrite host rows) only after
its own host reads are done. While a rank's host thread waits at the gate, its device keeps
running the work already queued.

:func:`plan_lookup` splits a lookup into rows this rank holds (read from its device store) and
rows read from host; it runs on CPU and is the same for every path.
"""
from __future__ import annotations

import ctypes
import functools
import math
import mmap
import resource
import time
import warnings
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from .config import HOST_PATHS
from .errors import FrugalError

# cudaHostRegisterPortable | cudaHostRegisterMapped: pinned for every CUDA context of the process
# and mapped into the device address space (with UVA the device address is the host address).
_REGISTER_FLAGS = 0x01 | 0x02
_TYPESTR = {torch.float32: "<f4"}  # the tables' dtype


def resolve_device(device: Optional[torch.device]) -> torch.device:
    """The engine's device with an explicit index (``cuda`` means the current CUDA device)."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def choose_host_path(requested: str, device: torch.device, can_map: bool) -> str:
    """The host access path an engine uses: what was asked for, or the fastest that works.

    ``auto`` takes ``zero_copy`` wherever the host tables can be mapped (always on CPU, where
    the mapping is the table itself) and falls back to ``pinned`` where registration failed.
    """
    if requested not in HOST_PATHS:
        raise ValueError(f"host_path must be one of {HOST_PATHS}, got {requested!r}")
    if device.type == "cpu":
        return "pinned" if requested == "pinned" else "zero_copy"
    if requested == "auto":
        return "zero_copy" if can_map else "pinned"
    if requested == "zero_copy" and not can_map:
        raise FrugalError(f"host_path='zero_copy' but the host tables cannot be mapped into {device}")
    return requested


# ---------------------------------------------------------------------------------------------- lookup plan
@dataclass
class LookupPlan:
    """Where each row of a lookup comes from, packed into one int64 tensor (one transfer).

    ``packed`` is ``[hit_pos | hit_slots | miss_pos | host_rows | expand]``: output positions and
    store slots of the rows this rank holds, output positions of the host reads, the fused rows
    read from host, and (when those were deduplicated) each host read's index into them.
    """

    packed: torch.Tensor
    n_hit: int
    n_miss: int
    n_host: int
    n_expand: int
    n_static_hits: int

    def parts(self, t: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, ...]:
        """(hit_pos, hit_slots, miss_pos, host_rows, expand) as views of ``t`` (``packed`` moved)."""
        t = self.packed if t is None else t
        h, m, u = self.n_hit, self.n_miss, self.n_host
        return t[:h], t[h : 2 * h], t[2 * h : 2 * h + m], t[2 * h + m : 2 * h + m + u], t[2 * h + m + u :]


def plan_lookup(
    slot_of: np.ndarray, num_static: int, rows: np.ndarray, sorted_reads: bool = False, static_only: bool = False
) -> LookupPlan:
    """Split ``rows`` into store reads (slot >= 0) and host reads, keeping output positions.

    With ``static_only`` only the static cache (slots below ``num_static``, fixed after set-up)
    counts as held: such a plan stays valid however long before its step it is made, and may
    be made on another thread while the owner moves rows in and out of dynamic slots (the gate
    makes their host copies current before the step reads them).

    With ``sorted_reads`` the host reads are deduplicated and sorted by row (unless they already
    are), to be expanded to their positions on the device: scattered reads of small rows use a
    fraction of a PCIe link's bandwidth, reads in row order most of it.
    """
    slots = slot_of[rows]
    hit = (slots >= 0) & (slots < num_static) if static_only else slots >= 0
    hit_pos = np.flatnonzero(hit)
    miss_pos = np.flatnonzero(~hit)
    hit_slots = slots[hit_pos]
    host_rows = rows[miss_pos]
    expand = np.zeros(0, dtype=np.int64)
    if sorted_reads and host_rows.size > 1 and not bool(np.all(host_rows[1:] > host_rows[:-1])):
        host_rows, expand = np.unique(host_rows, return_inverse=True)
        expand = expand.reshape(-1)
    packed = np.concatenate([hit_pos, hit_slots, miss_pos, host_rows, expand])
    return LookupPlan(
        torch.from_numpy(packed),
        n_hit=int(hit_pos.shape[0]),
        n_miss=int(miss_pos.shape[0]),
        n_host=int(host_rows.shape[0]),
        n_expand=int(expand.shape[0]),
        n_static_hits=int(np.count_nonzero(hit_slots < num_static)),
    )


# ---------------------------------------------------------------------------------------------- streams
class Reached:
    """CPU marker: operations on a CPU device are complete when they return."""

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True


REACHED = Reached()
Marker = Union[torch.cuda.Event, Reached]
"""A point on a device stream (CUDA event), or REACHED on a CPU device."""


def _mark(device: torch.device) -> Marker:
    if device.type != "cuda":
        return REACHED
    ev = torch.cuda.Event()
    ev.record(torch.cuda.current_stream(device))
    return ev


class Streams:
    """The compute stream (whatever is current for the caller) and one side stream for flushes."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.side_stream = torch.cuda.Stream(device=device) if device.type == "cuda" else None

    def mark(self) -> Marker:
        """A point on the current stream: every operation enqueued so far has run once it is reached."""
        return _mark(self.device)

    @contextmanager
    def side(self, after: Marker) -> Iterator[None]:
        """Run the block on the side stream, ordered after ``after`` on the device, not on the host."""
        if self.side_stream is None:
            yield
            return
        if after is not REACHED:  # nothing recorded yet: nothing to wait for
            self.side_stream.wait_event(after)  # type: ignore[arg-type]
        with torch.cuda.stream(self.side_stream):
            yield


class CopyStream:
    """Host-to-device copies made ahead, off the training thread, on a stream of their own.

    A planner thread moves a future step's index tensors (from page-locked memory) on this
    stream and records an event; the training thread then orders its compute stream after that
    event (:meth:`use`) without the host waiting. On a CPU device both are no-ops.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device=device) if device.type == "cuda" else None

    def to_device(self, parts: Sequence[Optional[torch.Tensor]]) -> Tuple[List[Optional[torch.Tensor]], Marker]:
        """``parts`` (CPU; page-locked for an asynchronous copy) on the device, and the marker
        reached once they are there."""
        if self.stream is None:
            return list(parts), REACHED
        with torch.cuda.stream(self.stream):
            moved = [None if p is None else p.to(self.device, non_blocking=True) for p in parts]
            ev = torch.cuda.Event()
            ev.record(self.stream)
        return moved, ev

    def use(self, parts: Sequence[Optional[torch.Tensor]], ready: Marker) -> None:
        """Order the caller's current stream after ``ready`` (no host wait) and keep the copies'
        memory from being reused while that stream may still read them."""
        if ready is REACHED:
            return
        current = torch.cuda.current_stream(self.device)
        current.wait_event(ready)  # type: ignore[arg-type]
        for p in parts:
            if p is not None and p.is_cuda:
                p.record_stream(current)


class GradientStaging:
    """A step's gradients copied to host without the host waiting: into two page-locked buffers
    used in turn (on CUDA), with a marker reached once the copy is done.

    A buffer is reused two steps after it was filled; by then the exchange worker has staged the
    step it held (the gate between the two steps waits for this rank's update of the first).
    On a CPU device the gradients are already in host memory and are handed over as they are.
    """

    def __init__(self, width: int, device: torch.device) -> None:
        self.device = device
        self.width = width
        self._bufs = [torch.empty(0, width, dtype=torch.float32) for _ in range(2)]
        self._next = 0

    def to_host(self, grads: torch.Tensor) -> Tuple[torch.Tensor, Marker]:
        if self.device.type != "cuda":
            on_host = grads.device.type == "cpu" and grads.dtype == torch.float32
            return (grads if on_host else grads.to("cpu", torch.float32)), REACHED
        i, self._next = self._next, 1 - self._next
        n = grads.shape[0]
        if self._bufs[i].shape[0] < n:
            self._bufs[i] = torch.empty(max(n, 2 * self._bufs[i].shape[0]), self.width, dtype=torch.float32, pin_memory=True)
        out = self._bufs[i][:n]
        out.copy_(grads, non_blocking=True)
        return out, _mark(self.device)


# ---------------------------------------------------------------------------------------------- staging
class _Staging:
    """A reusable page-locked (on CUDA) host buffer; reuse waits for the copy that last used it."""

    def __init__(self, width: int, pin: bool) -> None:
        self.width = width
        self.pin = pin
        self.buf = torch.empty(0, width, dtype=torch.float32)
        self.busy: Marker = REACHED

    def take(self, n: int) -> torch.Tensor:
        self.busy.synchronize()
        if self.buf.shape[0] < n:
            self.buf = torch.empty(max(n, 2 * self.buf.shape[0]), self.width, dtype=torch.float32, pin_memory=self.pin)
        return self.buf[:n]


# ---------------------------------------------------------------------------------------------- host tables
CALIBRATION_ROWS = (1 << 10, 1 << 14, 1 << 18)  # rows per call at which the two paths are timed


def pick_path(choices: Sequence[Tuple[int, str]], n: int) -> str:
    """The path measured fastest at the calibrated size nearest to ``n`` rows (log scale)."""
    _, path = min(choices, key=lambda c: abs(math.log(max(c[0], 1)) - math.log(max(n, 1))))
    return path


class _CudaArray:
    """A raw device address as ``__cuda_array_interface__``, for torch to wrap without copying."""

    def __init__(self, ptr: int, shape: Tuple[int, ...], dtype: torch.dtype) -> None:
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": _TYPESTR[dtype],
            "data": (ptr, False),
            "strides": None,
            "version": 3,
        }


PAGE_BYTES = mmap.PAGESIZE


def registration_range(ptr: int, nbytes: int) -> Tuple[int, int]:
    """(start, length) that ``cudaHostRegister`` is given for ``nbytes`` at ``ptr``.

    The start must be page-aligned and the range non-empty; the length is rounded up to whole
    pages, which the caller's mapping covers (``mmap``, as for the shared segments, maps whole
    pages). A bad range is refused here, before any CUDA call, because a failed registration
    leaves CUDA's error state set.
    """
    if nbytes <= 0 or ptr == 0:
        raise FrugalError(f"cannot register host memory at {ptr:#x}: the range of {nbytes} bytes is empty or null")
    if ptr % PAGE_BYTES:
        raise FrugalError(
            f"cannot register host memory at {ptr:#x} ({nbytes} bytes): the start is not aligned to the "
            f"{PAGE_BYTES}-byte page"
        )
    return ptr, -(-nbytes // PAGE_BYTES) * PAGE_BYTES


@functools.lru_cache(maxsize=1)
def loaded_cudart() -> Optional[ctypes.CDLL]:
    """The CUDA runtime library torch loaded (its error state is the one to clear), or None."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libcudart.so" in line}
    except OSError:
        paths = set()
    for path in sorted(paths):
        try:
            return ctypes.CDLL(path)  # already loaded: the same instance, not a second runtime
        except OSError:
            continue
    return None


def _get_last_error() -> Optional[Callable[[], Any]]:
    """``cudaGetLastError`` of torch's CUDA runtime: through torch if it exposes it, else ctypes."""
    fn = getattr(torch.cuda.cudart(), "cudaGetLastError", None)
    if fn is not None:
        return fn
    lib = loaded_cudart()
    return getattr(lib, "cudaGetLastError", None) if lib is not None else None


def clear_cuda_error() -> bool:
    """Reset this thread's CUDA last-error state; False if no way to reach it was found.

    A failed runtime call such as ``cudaHostRegister`` leaves the error set, and torch's check
    after the next kernel launch in the process would report it as that kernel's failure.
    """
    fn = _get_last_error()
    if fn is None:
        return False
    fn()
    return True


def can_lock_any() -> bool:
    """Whether this process may page-lock without limit (CAP_IPC_LOCK in its effective set)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> 14 & 1)
    except (OSError, ValueError):
        pass
    return False


def memlock_hint(nbytes: int, limit: Optional[int] = None, privileged: Optional[bool] = None) -> str:
    """Why page-locking ``nbytes`` may fail here and what to do, or "" where the limit allows it.

    ``limit`` (bytes, RLIM_INFINITY for none) and ``privileged`` default to this process's.
    Page-locking host memory counts against the locked-memory limit (``ulimit -l``,
    RLIMIT_MEMLOCK) unless the process has CAP_IPC_LOCK; containers often start with 64 KiB or 8 MiB.
    """
    if limit is None:
        limit = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
    if privileged is None:
        privileged = can_lock_any()
    if limit == resource.RLIM_INFINITY or privileged or nbytes <= limit:
        return ""
    return (
        f"page-locking the {nbytes} bytes ({nbytes / 2**30:.2f} GiB) of shared host tables can need a locked-memory "
        f"limit of at least that, but this process's limit (ulimit -l) is {limit} bytes and it lacks CAP_IPC_LOCK: "
        "if that is the cause, raise it (ulimit -l unlimited in the launching shell, LimitMEMLOCK=infinity for a "
        "systemd service, docker run --ulimit memlock=-1), or use host_path='pinned', which page-locks only small "
        "staging buffers"
    )


def _unregister(ptr: int) -> None:
    torch.cuda.cudart().cudaHostUnregister(ptr)


class HostRegistration:
    """One host address range page-locked and mapped for CUDA; unregistered by :meth:`close`.

    ``ptr`` must be page-aligned and ``nbytes`` positive (see :func:`registration_range`); the
    registration covers whole pages. A failed ``cudaHostRegister`` raises :class:`FrugalError`
    with CUDA's error state cleared, so the process can go on with CUDA (the pinned path).
    ``owner`` (the shared segment) is kept alive by the registration so that the range is never
    unmapped while registered, even if the engine is dropped without close().
    """

    def __init__(self, ptr: int, nbytes: int, device: torch.device, owner: object) -> None:
        start, length = registration_range(ptr, nbytes)
        self.ptr = ptr
        self.nbytes = nbytes
        self.device = device
        with torch.cuda.device(device):
            torch.cuda.init()
            cudart = torch.cuda.cudart()
            err = cudart.cudaHostRegister(start, length, _REGISTER_FLAGS)
            if int(err) != 0:
                cleared = clear_cuda_error()
                hint = memlock_hint(length)
                raise FrugalError(
                    f"cudaHostRegister of {length} bytes of shared host memory at {start:#x} failed with "
                    f"CUDA error {int(err)} ({cudart.cudaGetErrorString(err)})"
                    + ("" if cleared else "; CUDA's error state could not be cleared, later CUDA calls may report it")
                    + (f"; {hint}" if hint else "")
                )
        self._finalizer = weakref.finalize(self, _unregister, ptr)
        self._owner = owner

    def view(self, tensor: torch.Tensor) -> torch.Tensor:
        """The device's zero-copy view of ``tensor``, a contiguous tensor inside the range."""
        if tensor.numel() == 0:  # nothing to map (an optimizer without state)
            return torch.empty(tensor.shape, dtype=tensor.dtype, device=self.device)
        off = tensor.data_ptr() - self.ptr
        if off < 0 or off + tensor.numel() * tensor.element_size() > self.nbytes or not tensor.is_contiguous():
            raise ValueError("view() takes a contiguous tensor inside the registered range")
        with torch.cuda.device(self.device):
            out = torch.as_tensor(_CudaArray(tensor.data_ptr(), tuple(tensor.shape), tensor.dtype), device=self.device)
        if out.device != self.device or out.data_ptr() != tensor.data_ptr():  # a copy would not be a view
            raise FrugalError(f"could not map host memory into {self.device} (got a tensor on {out.device})")
        return out

    @property
    def registered(self) -> bool:
        return self._finalizer.alive

    def close(self) -> None:
        """Unregister now (before the segment may be unmapped); idempotent."""
        self._finalizer()


class HostTables:
    """Row reads and writes of the shared host tables as seen from one device.

    ``tables`` are views into one shared segment (``base``, the segment's whole byte range, for
    registration). Reads run on the caller's current stream; writes on whatever stream is
    current (the engine's flush side stream) and are complete in host memory once a marker taken
    after them is reached. Reads are issued by one thread at a time, writes likewise.
    """

    def __init__(
        self,
        tables: Dict[str, torch.Tensor],
        base: torch.Tensor,
        device: torch.device,
        requested: str,
        segment: object,
    ) -> None:
        self.device = device
        self.tables = tables
        # Host rows cross a link only on an accelerator: there, read each once, in row order.
        self.sorted_reads = device.type == "cuda"
        self._reg: Optional[HostRegistration] = None
        self._reg_error: Optional[BaseException] = None
        # On CPU the device reads the tables in place: they are their own mapping.
        self.mapped: Dict[str, torch.Tensor] = dict(tables) if device.type == "cpu" else {}
        if device.type == "cuda" and requested != "pinned":
            try:
                self._reg = HostRegistration(base.data_ptr(), base.numel(), device, segment)
                self.mapped = {k: self._reg.view(v) for k, v in tables.items()}
            except (FrugalError, RuntimeError) as e:
                if self._reg is not None:
                    self._reg.close()
                    self._reg = None
                self._reg_error = e
        try:
            self.path = choose_host_path(requested, device, can_map=device.type == "cpu" or self._reg is not None)
        except FrugalError as e:
            raise FrugalError(f"{e}: {self._reg_error!r}") from self._reg_error
        if self._reg_error is not None:  # auto fell back: say why, the pinned path is slower
            warnings.warn(f"host tables not mapped into {device} ({self._reg_error}); using the pinned path")
        pin = device.type == "cuda"
        self._read_stage = {k: _Staging(v.shape[1], pin) for k, v in tables.items()}
        self._write_stage = {k: _Staging(v.shape[1], pin) for k, v in tables.items()}
        # Per operation, (rows, path) pairs: the path measured fastest at that many rows.
        self.path_by_size: Dict[str, List[Tuple[int, str]]] = {}
        self.calibration: List[Dict[str, float]] = []
        if device.type == "cuda" and requested == "auto" and self.path == "zero_copy":
            self.calibrate()

    def calibrate(self, sizes: Sequence[int] = CALIBRATION_ROWS, reps: int = 5) -> None:
        """Time both paths on this machine and use, for each size, the one that was faster.

        Which path wins depends on the link, the row width and the number of rows (a gather
        kernel over a mapping suffers from scattered small rows, a host gather plus one copy
        from per-call overheads), so it is measured here rather than fixed. Distinct rows in
        row order, as the engine reads and writes them; the writes put back each row's own
        value, so the tables do not change.
        """
        name = "weights" if "weights" in self.tables else next(iter(self.tables))
        table = self.tables[name]
        gen = torch.Generator().manual_seed(0)
        self.calibration = []
        for size in sorted({min(int(n), table.shape[0]) for n in sizes}):
            rows = torch.unique(torch.randint(0, table.shape[0], (size,), generator=gen))
            rows_dev = rows.to(self.device)
            values = self._read("pinned", name, rows, rows_dev)
            row: Dict[str, float] = {"rows": float(rows.shape[0])}
            for path in ("zero_copy", "pinned"):
                row[f"read_{path}_s"] = self._median_s(lambda p=path: self._read(p, name, rows, rows_dev), reps)
                row[f"write_{path}_s"] = self._median_s(lambda p=path: self._write(p, name, rows, values, rows_dev), reps)
            self.calibration.append(row)
        self.path_by_size = {
            op: [
                (int(r["rows"]), "zero_copy" if r[f"{op}_zero_copy_s"] <= r[f"{op}_pinned_s"] else "pinned")
                for r in self.calibration
            ]
            for op in ("read", "write")
        }

    def _median_s(self, fn: Callable[[], object], reps: int) -> float:
        fn()  # warm-up: staging buffers, kernels
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            _mark(self.device).synchronize()
            times.append(time.perf_counter() - t0)
        return float(np.median(times))

    def _path(self, op: str, n: int) -> str:
        choices = self.path_by_size.get(op)
        return pick_path(choices, n) if choices else self.path

    @property
    def registered(self) -> bool:
        return self._reg is not None and self._reg.registered

    def read(self, name: str, rows: torch.Tensor, rows_on_device: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Rows ``rows`` (CPU int64) of table ``name`` as a new tensor on the device.

        ``rows_on_device`` may pass the same indices already moved (the zero-copy gather reads
        them on the device).
        """
        return self._read(self._path("read", rows.shape[0]), name, rows, rows_on_device)

    def _read(self, path: str, name: str, rows: torch.Tensor, rows_on_device: Optional[torch.Tensor]) -> torch.Tensor:
        if path == "zero_copy":
            idx = rows_on_device if rows_on_device is not None else rows.to(self.device, non_blocking=True)
            return self.mapped[name].index_select(0, idx)
        stage = self._read_stage[name]
        buf = stage.take(rows.shape[0])
        torch.index_select(self.tables[name], 0, rows, out=buf)
        out = torch.empty(buf.shape, dtype=buf.dtype, device=self.device)
        out.copy_(buf, non_blocking=True)
        stage.busy = _mark(self.device)
        return out

    def write(self, name: str, rows: torch.Tensor, values: torch.Tensor, rows_on_device: Optional[torch.Tensor] = None) -> None:
        """Write ``values`` (device) into rows ``rows`` (CPU int64) of host table ``name``.

        Zero-copy: one scatter kernel on the current stream writes host memory directly; the
        write is in host memory once a marker taken afterwards is reached. Pinned: an
        asynchronous device-to-host copy into staging, then the host scatters (this waits for
        the copy, not for the rest of the device's work).
        """
        self._write(self._path("write", rows.shape[0]), name, rows, values, rows_on_device)

    def _write(
        self, path: str, name: str, rows: torch.Tensor, values: torch.Tensor, rows_on_device: Optional[torch.Tensor]
    ) -> None:
        if path == "zero_copy":
            idx = rows_on_device if rows_on_device is not None else rows.to(self.device, non_blocking=True)
            self.mapped[name].index_copy_(0, idx, values)
            return
        stage = self._write_stage[name]
        buf = stage.take(rows.shape[0])
        buf.copy_(values, non_blocking=True)
        _mark(self.device).synchronize()
        self.tables[name].index_copy_(0, rows, buf)

    def close(self) -> None:
        """Drop the device views and unregister the host range (before it can be unmapped)."""
        self.mapped = {}
        if self._reg is not None:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)  # no kernel may still touch the range
            self._reg.close()


def to_device(parts: Sequence[torch.Tensor], device: torch.device) -> List[torch.Tensor]:
    """Small CPU index tensors on ``device``: one transfer for all of them (none on CPU)."""
    if device.type == "cpu":
        return list(parts)
    moved = torch.cat(list(parts)).to(device, non_blocking=True)
    return list(moved.split([p.shape[0] for p in parts]))
