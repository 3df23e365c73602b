"""The streams and events that order a device's copies, and the device an engine runs on.

* :class:`Streams`: the caller's compute stream plus a side stream on which flushes run, so host
  writes never queue behind (or block) the training step's kernels.
* Markers (:func:`mark`, :meth:`Streams.mark`): a CUDA event recorded on the current stream; on
  CPU every operation has finished when it returns, so a marker is reached as soon as it is taken.

The gate stays a wait on the owners' progress counters in shared memory, with the events at its
edges: a flush stream waits for the update's event on the device (the host does not block), an
owner raises its flushed-through counter only once the flush's event is reached, and a rank
marks its lookup so that it stages gradients (letting owners overwrite host rows) only after
its own host reads are done. While a rank's host thread waits at the gate, its device keeps
running the work already queued.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, List, Optional, Sequence, Tuple, Union

import torch


def resolve_device(device: Optional[torch.device]) -> torch.device:
    """The engine's device with an explicit index (``cuda`` means the current CUDA device)."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


class Reached:
    """CPU marker: operations on a CPU device are complete when they return."""

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True


REACHED = Reached()
Marker = Union[torch.cuda.Event, Reached]
"""A point on a device stream (CUDA event), or REACHED on a CPU device."""


def mark(device: torch.device) -> Marker:
    """A point on ``device``'s current stream: every operation enqueued so far has run once it is reached."""
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
        return mark(self.device)

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


def to_device(parts: Sequence[torch.Tensor], device: torch.device) -> List[torch.Tensor]:
    """Small CPU index tensors on ``device``: one transfer for all of them (none on CPU)."""
    if device.type == "cpu":
        return list(parts)
    moved = torch.cat(list(parts)).to(device, non_blocking=True)
    return list(moved.split([p.shape[0] for p in parts]))
