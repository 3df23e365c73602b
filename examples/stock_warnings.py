"""Silence the warnings stock TorchRec and torch print on any training script shaped like ours.

A newcomer reads a warning as a failure. These come from TorchRec 1.8 and torch 2.13 whatever the
sharder (a stock script prints them too), and none asks anything of the user:

- ``The topology was constructed directly ...``: ``DistributedModelParallel`` without a plan builds
  TorchRec's planner on a ``Topology(...)`` of its own;
- ``HeuristicalStorageReservation is known to cause issues`` and ``There is a known issue with
  TorchRec's dense tensor size calculation``: that planner's default storage reservation;
- ```broadcast_buffers` is deprecated``: ``DistributedModelParallel``'s own DDP wrapper;
- ``is_fx_tracing will return true ...``: torch.fx, on TorchRec's forward;
- ```_get_pg_default_device` will be deprecated`` and ``Multiple backends are registered with this
  ProcessGroup``: TorchRec 1.6.1's ``ShardingEnv`` on torch 2.13.

The examples call :func:`quiet_stock_warnings` first; the library itself filters nothing.
"""
from __future__ import annotations

import logging
import re
import warnings
from typing import Tuple

LOGGED: Tuple[Tuple[str, str], ...] = (
    ("torchrec.distributed.planner.types", "The topology was constructed directly"),
    ("torchrec.distributed.planner.storage_reservations", "There is a known issue with TorchRec's dense tensor size"),
    ("torch.fx._symbolic_trace", "is_fx_tracing will return true"),
)
"""(logger, start of the message) of every logged warning hidden."""

WARNED: Tuple[Tuple[type, str], ...] = (
    (FutureWarning, re.escape("HeuristicalStorageReservation is known to cause issues")),
    (FutureWarning, re.escape("`broadcast_buffers` is deprecated")),
    (UserWarning, re.escape("`_get_pg_default_device` will be deprecated")),
    (UserWarning, re.escape("Multiple backends are registered with this ProcessGroup")),
)
"""(category, pattern of the message's start) of every ``warnings.warn`` hidden."""


class _DropStarting(logging.Filter):
    def __init__(self, start: str) -> None:
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.start)


def quiet_stock_warnings() -> None:
    """Hide :data:`LOGGED` and :data:`WARNED` in this process (call it before TorchRec plans);
    every other warning still shows."""
    for name, start in LOGGED:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropStarting) and f.start == start for f in logger.filters):
            logger.addFilter(_DropStarting(start))
    for category, pattern in WARNED:
        warnings.filterwarnings("ignore", message=pattern, category=category)
