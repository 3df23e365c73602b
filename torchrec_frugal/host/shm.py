"""Named POSIX shared-memory segments that never outlive a run, and never fault for lack of room.

Segments live in one directory of a shared-memory filesystem (``/dev/shm`` unless configured, see
:func:`resolve_dir`) under a name ``frugal_<pid>x<uuid>_<kind>``, ``pid`` being the process that
chose the run id. A run unlinks each segment as soon as all local ranks have mapped it (the
mappings stay valid), so a crash afterwards leaves nothing behind. While a name exists, its
creator holds a shared ``flock`` on it: the lock dies with the process however it ends (SIGKILL
included), so :func:`sweep_stale_segments` never removes a live segment, even one of a job in
another pid namespace sharing the directory. The creating
process also unlinks what it still owns at exit or on SIGTERM: its exit hook and SIGTERM handler
are installed with the first name it creates and removed with the last it unlinks, so importing
this module changes nothing in the process.

A segment's pages are reserved when it is created (``posix_fallocate``): a filesystem without
room for it fails then, with an error naming the bytes and the fix, instead of a SIGBUS on the
first touch of a page that cannot be allocated.
"""
from __future__ import annotations

import atexit
import errno
import fcntl
import math
import mmap
import os
import signal
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..errors import FrugalError

DEFAULT_DIR = "/dev/shm"
ENV_DIR = "TORCHREC_FRUGAL_SHM_DIR"
PREFIX = "frugal_"
_CREATING = ".creating-"  # a name being set up: invisible to the sweep until locked and renamed
_ALIGN = 64

_owned: Dict[str, int] = {}  # path of a name this process created -> the fd holding its lock
# Reentrant: the SIGTERM handler takes it on the main thread, which may hold it when the signal comes.
_owned_lock = threading.RLock()
_hooks_armed = False  # _at_exit registered with atexit while this process owns a name
_exiting = False  # _at_exit runs: it is not unregistered from within its own call


class SharedMemoryFullError(FrugalError):
    """The shared-memory filesystem has no room for the segments a run needs."""


def resolve_dir(configured: Optional[str] = None) -> str:
    """The shared-memory directory: ``configured``, else $TORCHREC_FRUGAL_SHM_DIR, else /dev/shm."""
    if configured:
        path, source = configured, "FrugalConfig.shm_dir"
    elif os.environ.get(ENV_DIR):
        path, source = os.environ[ENV_DIR], f"${ENV_DIR}"
    else:
        path, source = DEFAULT_DIR, "the default"
    if not os.path.isdir(path):
        raise FrugalError(f"shared-memory directory {path!r} ({source}) does not exist or is not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise FrugalError(f"shared-memory directory {path!r} ({source}) is not writable by this process")
    return os.path.realpath(path)


def free_bytes(directory: str) -> int:
    """Bytes the filesystem of ``directory`` can still give an unprivileged process."""
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


def _gib(n: int) -> str:
    return f"{n} bytes ({n / 2**30:.2f} GiB)"


def room_error(directory: str, needed: int, free: int, what: str) -> str:
    """The message for a shared-memory filesystem too small for ``needed`` bytes."""
    return (
        f"{what} need {_gib(needed)} of shared memory in {directory}, which has {_gib(free)} free. "
        f"Give it more room (a container's --shm-size, e.g. docker run --shm-size={max(1, math.ceil(needed * 1.1 / 2**30))}g, "
        f"or a larger tmpfs: mount -o remount,size=... {directory}), or point the run at another "
        f"shared-memory directory with room (FrugalConfig(shm_dir=...) or ${ENV_DIR})"
    )


def check_room(directory: str, needed: int, what: str) -> None:
    """Raise :class:`SharedMemoryFullError` unless ``directory`` has ``needed`` bytes free."""
    free = free_bytes(directory)
    if needed > free:
        raise SharedMemoryFullError(room_error(directory, needed, free, what))


def new_run_id() -> str:
    """A machine-unique run id that embeds the creating pid."""
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


def _unlink_path(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    with _owned_lock:
        fd = _owned.pop(path, None)
        if fd is not None and not _owned:
            _disarm_exit_hooks()
    if fd is not None:
        os.close(fd)


def owned_paths() -> List[str]:
    """Paths of the names this process created and has not unlinked yet (unlinked at exit)."""
    with _owned_lock:
        return list(_owned)


def _unlink_owned() -> None:
    with _owned_lock:
        paths = list(_owned)
    for path in paths:
        _unlink_path(path)


def _at_exit() -> None:
    global _exiting
    _exiting = True
    _unlink_owned()


def _on_sigterm(signum: int, frame: object) -> None:
    _unlink_owned()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def exit_hooks_armed() -> bool:
    """Whether this process's exit hook (and, set from the main thread, SIGTERM handler) is installed:
    from its first created name to its last unlinked one."""
    with _owned_lock:
        return _hooks_armed


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _arm_exit_hooks() -> None:
    """Unlink the names this process owns at exit and on SIGTERM (called, lock held, once it owns one).

    The handler replaces only the default action, which it then takes, and only from the main
    thread (the only one that may set it): a name first created elsewhere arms it at the next
    creation on the main thread.
    """
    global _hooks_armed
    if not _hooks_armed:
        atexit.register(_at_exit)
        _hooks_armed = True
    if _on_main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)


def _disarm_exit_hooks() -> None:
    """Undo :func:`_arm_exit_hooks` (called, lock held, once the last owned name is unlinked).

    Off the main thread the handler stays: owning nothing, it takes the default action it replaced.
    """
    global _hooks_armed
    if _hooks_armed and not _exiting:
        atexit.unregister(_at_exit)
        _hooks_armed = False
    if _on_main_thread() and signal.getsignal(signal.SIGTERM) is _on_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def list_segments(run_id: Optional[str] = None, directory: Optional[str] = None) -> List[str]:
    """Names of frugal segments in ``directory`` (of one run, if given)."""
    prefix = PREFIX + (f"{run_id}_" if run_id else "")
    try:
        return sorted(n for n in os.listdir(directory or resolve_dir()) if n.startswith(prefix))
    except FileNotFoundError:
        return []


def creator_pid(name: str) -> Optional[int]:
    """The pid a name of our scheme (``frugal_<pid>x<hex>_...``, maybe being created) embeds:
    the process that chose the run id; None for any other name."""
    if name.startswith(_CREATING):
        name = name[len(_CREATING) :]
    if not name.startswith(PREFIX):
        return None
    pid, sep, rest = name[len(PREFIX) :].partition("x")
    return int(pid) if pid.isdigit() and sep and "_" in rest else None


def _creator_alive(path: str) -> bool:
    """Whether some process holds the lock a creator takes on its segment."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return True  # already gone: nothing to sweep
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also drops our probe's lock
    return False


def _age_s(path: str) -> float:
    try:
        return time.time() - os.stat(path).st_mtime
    except FileNotFoundError:
        return 0.0


def is_stale(name: str, directory: Optional[str] = None) -> bool:
    """Whether the segment ``name`` belongs to a run that is gone: nobody will unlink it.

    Stale when the pid its name embeds is not alive here and nobody holds its creator's lock: the
    lock keeps segments of a live job in another pid namespace, the pid keeps those of a live job
    that takes no lock (an older release of this package). A name still being created is young
    and never stale: its creator may be between creating and locking it.
    """
    path = os.path.join(directory or resolve_dir(), name)
    if name.startswith(_CREATING) and _age_s(path) < 60.0:
        return False
    pid = creator_pid(name)
    return pid is not None and not pid_alive(pid) and not _creator_alive(path)


def sweep_stale_segments(directory: Optional[str] = None) -> List[str]:
    """Remove the stale segments (:func:`is_stale`) of ``directory``; returns the names removed."""
    directory = directory or resolve_dir()
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    removed = []
    for name in names:
        if is_stale(name, directory):
            _unlink_path(os.path.join(directory, name))
            removed.append(name)
    return removed


def remove_run_segments(run_id: str, directory: Optional[str] = None) -> None:
    """Unlink every segment of a run (used when the run aborts)."""
    directory = directory or resolve_dir()
    for name in list_segments(run_id, directory):
        _unlink_path(os.path.join(directory, name))


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


def _reserve(fd: int, nbytes: int) -> None:
    """Allocate every page of the file now, so that no later touch of the mapping can fault."""
    try:
        os.posix_fallocate(fd, 0, nbytes)
        return
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
    chunk = bytes(1 << 24)  # a filesystem without fallocate: writing the zeros allocates the pages
    for off in range(0, nbytes, len(chunk)):
        os.pwrite(fd, chunk[: min(len(chunk), nbytes - off)], off)


_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
"""Map every page of a segment when it is mapped (Linux). A rank that did not write a page itself
would otherwise take a page fault at its first touch of each page of the host table, a step's
random rows spread over a table of gigabytes: measured, 260 more faults a step on the rank that
did not initialize the table, which made it the later rank at every meeting point (the KG step's
critical path, measured at 75e2d41: `git show 75e2d41:docs/performance.md`)."""


class SharedSegment:
    """One mapped shared-memory segment with typed tensor views."""

    def __init__(self, name: str, layout: Layout, create: bool, directory: Optional[str] = None) -> None:
        self.name = name
        self.layout = layout
        self.directory = directory or resolve_dir()
        self.path = os.path.join(self.directory, name)
        fd = self._create() if create else os.open(self.path, os.O_RDWR)
        try:
            if create:
                os.ftruncate(fd, layout.nbytes)
                try:
                    _reserve(fd, layout.nbytes)
                except OSError as e:
                    _unlink_path(self.path)
                    if e.errno in (errno.ENOSPC, errno.ENOMEM, errno.EDQUOT):
                        raise SharedMemoryFullError(
                            room_error(self.directory, layout.nbytes, free_bytes(self.directory), f"segment {name}")
                        ) from e
                    raise
            elif os.fstat(fd).st_size != layout.nbytes:
                raise RuntimeError(
                    f"shared segment {name} has {os.fstat(fd).st_size} bytes, expected {layout.nbytes}: "
                    "ranks disagree on table shapes"
                )
            self._mm = mmap.mmap(fd, layout.nbytes, flags=mmap.MAP_SHARED | _POPULATE)
        finally:
            if not create:  # a creator keeps its fd (and lock) while the name exists
                os.close(fd)
        # The whole mapping as bytes: its address and size are what a device registers.
        self.base = torch.frombuffer(self._mm, dtype=torch.uint8)
        self.views: Dict[str, torch.Tensor] = {}
        self._arrays: Dict[str, np.ndarray] = {}  # numpy views, made on first use (array)
        for f in layout.fields:
            n = _numel(f.shape)
            if n == 0:
                self.views[f.name] = torch.empty(f.shape, dtype=f.dtype)
                continue
            t = torch.frombuffer(self._mm, dtype=f.dtype, count=n, offset=layout.offsets[f.name])
            self.views[f.name] = t.view(f.shape)

    def _create(self) -> int:
        """Create the name locked: set up under a name the sweep ignores, lock, then link it in place.

        Linking fails if the name exists (it is then not ours to unlink); the lock is held from
        the first moment the name is visible.
        """
        tmp = os.path.join(self.directory, _CREATING + self.name)
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            os.link(tmp, self.path)
        except BaseException:
            os.close(fd)
            raise
        finally:
            os.unlink(tmp)
        with _owned_lock:  # only a name we created is ours to unlink at exit
            _owned[self.path] = fd
            _arm_exit_hooks()
        return fd

    def rows(self, key: str, lo: int, hi: int) -> torch.Tensor:
        """Rows [lo, hi) of field ``key`` as a tensor whose storage is exactly those rows.

        A slice of a view would keep the whole field as its storage, and torch.save (hence a
        torch.distributed.checkpoint save) copies a tensor smaller than its storage first.
        """
        f = next(f for f in self.layout.fields if f.name == key)
        row = _numel(f.shape[1:])
        if hi <= lo or row == 0:
            return torch.empty((max(hi - lo, 0),) + tuple(f.shape[1:]), dtype=f.dtype)
        size = torch.empty((), dtype=f.dtype).element_size()
        t = torch.frombuffer(self._mm, dtype=f.dtype, count=(hi - lo) * row, offset=self.layout.offsets[key] + lo * row * size)
        return t.view((hi - lo,) + tuple(f.shape[1:]))

    @classmethod
    def create(cls, name: str, layout: Layout, directory: Optional[str] = None) -> "SharedSegment":
        return cls(name, layout, create=True, directory=directory)

    @classmethod
    def attach(cls, name: str, layout: Layout, directory: Optional[str] = None) -> "SharedSegment":
        return cls(name, layout, create=False, directory=directory)

    def unlink(self) -> None:
        """Remove the name; existing mappings stay valid until the process ends."""
        _unlink_path(self.path)

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.views[key]

    def array(self, key: str) -> np.ndarray:
        """``self[key]`` as a numpy view, made once: for bookkeeping that a training thread may run
        while it waits, which then dispatches no torch op."""
        a = self._arrays.get(key)
        if a is None:
            a = self._arrays[key] = self.views[key].numpy()
        return a
