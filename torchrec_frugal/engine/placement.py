"""Where a rank's engine does each job: the choices its device decides, made once.

On an accelerator the training thread mostly waits for the device, so the lookahead and the
flushes get threads of their own, and an owner keeps the uncached rows it updates in dynamic
slots of device memory until a flush writes them (the paper's path). On a CPU device the training
threads keep every core busy (a helper thread only takes time from them: on 2 cores with 2 ranks
a flusher thread made the DLRM example 5% slower), and device memory is host memory, so the
exchange worker publishes, ingests and flushes, and owners update uncached rows in place in the
host tables. :class:`~torchrec_frugal.config.FrugalConfig` may set each choice; None leaves it to
the device. Every consumer reads the one record the engine resolves.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import FrugalConfig


@dataclass(frozen=True)
class Placement:
    """The device-dependent choices of one engine."""

    flush_workers: int  # flusher threads; 0: the exchange worker flushes everything
    lookahead_thread: bool  # publish and ingest on a lookahead worker (else on the exchange worker)
    update_uncached_in_host: bool  # owners update rows they do not cache in place in host memory

    @classmethod
    def resolve(cls, device: torch.device, config: FrugalConfig) -> "Placement":
        accelerator = device.type != "cpu"
        return cls(
            flush_workers=int(accelerator) if config.flush_workers is None else config.flush_workers,
            lookahead_thread=config.lookahead > 0 and (accelerator if config.lookahead_thread is None else config.lookahead_thread),
            update_uncached_in_host=not accelerator if config.update_uncached_in_host is None else config.update_uncached_in_host,
        )  # fmt: skip
