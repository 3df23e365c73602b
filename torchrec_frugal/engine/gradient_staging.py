"""A step's gradients on their way to host memory, copied without the host waiting."""
from __future__ import annotations

from typing import Tuple

import torch

from .streams import REACHED, Marker, mark


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
        return out, mark(self.device)
