"""Host memory page-locked and mapped into a CUDA device (``cudaHostRegister``), and why it may fail.

A registered range lets a gather kernel read host rows straight over PCIe and a scatter kernel
write them back (the ``zero_copy`` host path). Registration counts against the locked-memory
limit, and a failed call leaves CUDA's error state set: both are handled here, before the engine
falls back to the ``pinned`` path.
"""
from __future__ import annotations

import ctypes
import functools
import mmap
import resource
import weakref
from typing import Any, Callable, Optional, Tuple

import torch

from ..errors import FrugalError

# cudaHostRegisterPortable | cudaHostRegisterMapped: pinned for every CUDA context of the process
# and mapped into the device address space (with UVA the device address is the host address).
_REGISTER_FLAGS = 0x01 | 0x02
_TYPESTR = {torch.float32: "<f4"}  # the tables' dtype


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

