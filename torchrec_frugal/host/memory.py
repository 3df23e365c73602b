"""Whether a run's shared host memory fits the machine, checked before anything is allocated.

Frugal keeps every table, with its optimizer state, once in the shared memory of one machine,
beside a small mailbox per local rank. Shared memory is RAM: the run needs that many bytes both
free in the shared-memory filesystem (its size limit, e.g. a container's ``--shm-size``) and
available in host memory. Either shortfall is an error naming the tables and their sizes, raised
before the first byte is reserved.
"""
from __future__ import annotations

from typing import Optional, Sequence

from ..config import TableSpec
from ..errors import FrugalError
from .shm import SharedMemoryFullError, free_bytes, room_error


class HostMemoryError(FrugalError):
    """Host memory cannot hold the tables."""


def mem_available() -> Optional[int]:
    """The kernel's estimate of memory available to new allocations (MemAvailable), in bytes."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def describe_tables(tables: Sequence[TableSpec], state_width: int) -> str:
    """``name rows x dim (bytes)`` per table, with the optimizer state's columns counted."""
    return ", ".join(
        f"{t.name} {t.num_embeddings} x {t.embedding_dim} ({t.num_embeddings * (t.embedding_dim + state_width) * 4 / 2**20:.1f} MiB)"
        for t in tables
    )


def check_fits(
    tables: Sequence[TableSpec],
    state_width: int,
    host_bytes: int,
    mailbox_bytes: int,
    world_size: int,
    directory: str,
    available: Optional[int] = None,
    free: Optional[int] = None,
) -> None:
    """Raise unless ``host_bytes`` of tables and ``world_size`` mailboxes fit shared and host memory.

    ``available`` and ``free`` default to the machine's MemAvailable and the directory's free bytes.
    """
    needed = host_bytes + world_size * mailbox_bytes
    what = (
        f"the host tables ({describe_tables(tables, state_width)}; {host_bytes} bytes with the optimizer state) "
        f"and {world_size} rank mailboxes of {mailbox_bytes} bytes"
    )
    available = mem_available() if available is None else available
    if available is not None and needed > available:
        raise HostMemoryError(
            f"{what} need {needed} bytes ({needed / 2**30:.2f} GiB) of host memory, but only {available} bytes "
            f"({available / 2**30:.2f} GiB) are available on this machine: use a machine with more memory, "
            "fewer or smaller tables on Frugal, or a stock TorchRec sharding for some of them"
        )
    free = free_bytes(directory) if free is None else free
    if needed > free:
        raise SharedMemoryFullError(room_error(directory, needed, free, what))
