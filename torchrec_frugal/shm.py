"""Named POSIX shared-memory segments that never outlive a run.

Every segment lives in /dev/shm under a name ``frugal_<pid>x<uuid>_<kind>`` where ``pid`` is the
creating process. A run unlinks each segment as soon as all local ranks have mapped it (the
mappings stay valid), so a crash afterwards leaves nothing behind. Segments created by a process
that has died are swept by :func:`sweep_stale_segments`, and the creating process unlinks what it
still owns at exit or on SIGTERM.
"""
from __future__ import annotations

import atexit
import mmap
import os
import signal
import threading
import uuid
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import torch

SHM_DIR = "/dev/shm"
PREFIX = "frugal_"
_ALIGN = 64

_owned: Dict[str, None] = {}
_owned_lock = threading.Lock()


def new_run_id() -> str:
    """A machine-unique run id that embeds the creating pid (for the stale-segment sweep)."""
    return f"{os.getpid()}x{uuid.uuid4().hex[:12]}"


def pid_alive(pid: int) -> bool:
    """True if ``pid`` runs and is not a zombie (a SIGKILLed child stays a zombie until reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return False
    state = stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3]
    return state not in (b"Z", b"X")


def _path(name: str) -> str:
    return os.path.join(SHM_DIR, name)


def _unlink(name: str) -> None:
    try:
        os.unlink(_path(name))
    except FileNotFoundError:
        pass
    with _owned_lock:
        _owned.pop(name, None)


def _unlink_owned() -> None:
    with _owned_lock:
        names = list(_owned)
    for name in names:
        _unlink(name)


def _on_sigterm(signum: int, frame: object) -> None:
    _unlink_owned()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


atexit.register(_unlink_owned)
if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
    signal.signal(signal.SIGTERM, _on_sigterm)


def list_segments(run_id: str | None = None) -> List[str]:
    """Names of frugal segments in /dev/shm (of one run, if given)."""
    prefix = PREFIX + (f"{run_id}_" if run_id else "")
    try:
        return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(prefix))
    except FileNotFoundError:
        return []


def sweep_stale_segments() -> List[str]:
    """Remove segments whose creating process is gone; returns the names removed."""
    removed = []
    for name in list_segments():
        pid_part = name[len(PREFIX) :].split("x", 1)[0]
        if pid_part.isdigit() and not pid_alive(int(pid_part)):
            _unlink(name)
            removed.append(name)
    return removed


def remove_run_segments(run_id: str) -> None:
    """Unlink every segment of a run (used when the run aborts)."""
    for name in list_segments(run_id):
        _unlink(name)


@dataclass(frozen=True)
class Field:
    name: str
    dtype: torch.dtype
    shape: Tuple[int, ...]


class Layout:
    """Byte layout of named tensors inside one segment, each 64-byte aligned."""

    def __init__(self, fields: Sequence[Field]) -> None:
        self.fields = list(fields)
        self.offsets: Dict[str, int] = {}
        off = 0
        for f in self.fields:
            off = (off + _ALIGN - 1) // _ALIGN * _ALIGN
            self.offsets[f.name] = off
            off += _numel(f.shape) * torch.empty((), dtype=f.dtype).element_size()
        self.nbytes = max(off, _ALIGN)


def _numel(shape: Tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


class SharedSegment:
    """One mapped shared-memory segment with typed tensor views."""

    def __init__(self, name: str, layout: Layout, create: bool) -> None:
        self.name = name
        self.layout = layout
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(_path(name), flags, 0o600)
        if create:  # only a name we created is ours to unlink at exit
            with _owned_lock:
                _owned[name] = None
        try:
            if create:
                os.ftruncate(fd, layout.nbytes)
            elif os.fstat(fd).st_size != layout.nbytes:
                raise RuntimeError(
                    f"shared segment {name} has {os.fstat(fd).st_size} bytes, expected {layout.nbytes}: "
                    "ranks disagree on table shapes"
                )
            self._mm = mmap.mmap(fd, layout.nbytes)
        finally:
            os.close(fd)
        # The whole mapping as bytes: its address and size are what a device registers.
        self.base = torch.frombuffer(self._mm, dtype=torch.uint8)
        self.views: Dict[str, torch.Tensor] = {}
        for f in layout.fields:
            n = _numel(f.shape)
            if n == 0:
                self.views[f.name] = torch.empty(f.shape, dtype=f.dtype)
                continue
            t = torch.frombuffer(self._mm, dtype=f.dtype, count=n, offset=layout.offsets[f.name])
            self.views[f.name] = t.view(f.shape)

    @classmethod
    def create(cls, name: str, layout: Layout) -> "SharedSegment":
        return cls(name, layout, create=True)

    @classmethod
    def attach(cls, name: str, layout: Layout) -> "SharedSegment":
        return cls(name, layout, create=False)

    def unlink(self) -> None:
        """Remove the name; existing mappings stay valid until the process ends."""
        _unlink(self.name)

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.views[key]
