"""How the shared host tables are read and written from an engine's device.

:class:`HostTables` has two paths: ``zero_copy`` (the segment is page-locked with
``cudaHostRegister`` and mapped into the device's address space, so a gather kernel reads host
rows straight over PCIe and a scatter kernel writes them back) and ``pinned`` (the host gathers
into a page-locked staging buffer, then one asynchronous copy moves it; writes go the other way).
On a CPU device the mapped view is the host table itself, and the calls run inline.
"""
from __future__ import annotations

import math
import time
import warnings
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..config import HOST_PATHS
from ..errors import FrugalError
from ..host.registration import HostRegistration
from .streams import REACHED, Marker, mark


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


CALIBRATION_ROWS = (1 << 10, 1 << 14, 1 << 18)  # rows per call at which the two paths are timed


def pick_path(choices: Sequence[Tuple[int, str]], n: int) -> str:
    """The path measured fastest at the calibrated size nearest to ``n`` rows (log scale)."""
    _, path = min(choices, key=lambda c: abs(math.log(max(c[0], 1)) - math.log(max(n, 1))))
    return path


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
            mark(self.device).synchronize()
            times.append(time.perf_counter() - t0)
        return float(np.median(times))

    def _path(self, op: str, n: int) -> str:
        choices = self.path_by_size.get(op)
        return pick_path(choices, n) if choices else self.path

    @property
    def in_place(self) -> bool:
        """Whether the device reads and writes the host tables in place: a CPU device on the
        zero-copy path, where store and host are one memory and the compiled loops do the copies."""
        return self.device.type == "cpu" and self.path == "zero_copy"

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
        stage.busy = mark(self.device)
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
        mark(self.device).synchronize()
        self.tables[name].index_copy_(0, rows, buf)

    def close(self) -> None:
        """Drop the device views and unregister the host range (before it can be unmapped)."""
        self.mapped = {}
        if self._reg is not None:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)  # no kernel may still touch the range
            self._reg.close()

