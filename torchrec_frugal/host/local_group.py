"""The ranks of one machine that share the host tables, as the set-up of an engine sees them.

Set-up is the only part of the engine that uses the process group: to agree on where the shared
memory lives, to check that every rank runs on this machine, to sum the pre-sample counts, and to
make each set-up step all-or-none (a step that fails on one rank fails on all, each naming it,
and leaves no segment behind). After set-up the ranks talk through shared memory only.
"""
from __future__ import annotations

import os
import socket
from typing import Callable, Dict, List, Optional, Sequence, TypeVar

import torch
import torch.distributed as dist

from . import shm
from ..errors import FrugalError, FrugalInputError
from .memory import HostMemoryError

T = TypeVar("T")
# torchrun's node rank (one per --nnodes launch); absent outside torchrun.
NODE_RANK_ENV = "GROUP_RANK"
# Errors of set-up that every rank raises alike when one rank hits them.
SETUP_ERRORS = {c.__name__: c for c in (FrugalError, FrugalInputError, HostMemoryError, shm.SharedMemoryFullError)}


def node_identity() -> str:
    """This process's node: its host, and its launcher node rank when there is one."""
    node = os.environ.get(NODE_RANK_ENV)
    return socket.gethostname() + ("" if node is None else f" (node {node})")


class LocalGroup:
    """Rank, world size and the collective set-up steps of the ranks sharing one machine."""

    def __init__(self, pg: Optional[dist.ProcessGroup] = None) -> None:
        self.pg = pg
        if dist.is_available() and dist.is_initialized():
            self.rank, self.world_size = dist.get_rank(pg), dist.get_world_size(pg)
        else:
            self.rank, self.world_size = 0, 1

    def gather(self, obj: object) -> List[object]:
        """Every rank's ``obj``, by rank."""
        if self.world_size == 1:
            return [obj]
        out: List[object] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.pg)
        return out

    def all_reduce_sum(self, t: torch.Tensor, device: torch.device) -> torch.Tensor:
        """The sum of ``t`` (CPU) over ranks, on CPU."""
        if self.world_size == 1:
            return t
        if dist.get_backend(self.pg) == "nccl":  # NCCL reduces device tensors only
            t = t.to(device)
            dist.all_reduce(t, group=self.pg)
            return t.cpu()
        dist.all_reduce(t, group=self.pg)
        return t

    def all_or_none(self, fn: Callable[[], T], created: Sequence[shm.SharedSegment], what: str) -> List[T]:
        """Run a set-up step on every rank; returns each rank's result, or, if it failed anywhere,
        unlinks what this rank created and raises (the rank's own error, else one naming the rank)."""
        err: Optional[BaseException] = None
        result: Optional[T] = None
        try:
            result = fn()
        except Exception as e:  # every rank must learn of it, or the others wait at the next collective
            err = e
        outcomes = self.gather(("ok", result) if err is None else (type(err).__name__, str(err)))
        failed = [r for r, (kind, _) in enumerate(outcomes) if kind != "ok"]  # type: ignore[misc]
        if failed:
            for seg in created:
                seg.unlink()
            if err is not None:
                raise err
            kind, message = outcomes[failed[0]]  # type: ignore[misc]
            cls = SETUP_ERRORS.get(str(kind), FrugalError)
            raise cls(f"rank {self.rank}: {what} failed on rank {failed[0]}: {kind}: {message}")
        return [value for _, value in outcomes]  # type: ignore[misc]

    def nodes(self) -> List[str]:
        """Every rank's node (:func:`node_identity`), by rank."""
        return [str(n) for n in self.gather(node_identity())]

    def check_one_machine(self) -> None:
        """Raise, naming the nodes and their ranks, if the group spans machines or launcher nodes.

        A node is a host, or one ``torchrun --nnodes`` launch (its ``GROUP_RANK``): nodes simulated
        on one host keep separate shared memory, so one engine cannot span them either.
        """
        nodes = self.nodes()
        if len(set(nodes)) > 1:
            by_node: Dict[str, List[int]] = {}
            for r, n in enumerate(nodes):
                by_node.setdefault(n, []).append(r)
            raise FrugalError(
                "a Frugal engine keeps its tables in the shared memory of one node, but the ranks of its "
                f"process group run on {len(by_node)} nodes: "
                + "; ".join(f"{n}: ranks {rs}" for n, rs in by_node.items())
                + ". Across nodes, shard the tables with frugal_row_wise (a Frugal engine per node, "
                "TorchRec's row-wise all-to-alls between nodes), or give the engine one node's process group"
            )

    def agree_on_shm_dir(self, configured: Optional[str]) -> str:
        """The shared-memory directory, the same on every local rank (or an error naming both)."""
        dirs = self.all_or_none(lambda: shm.resolve_dir(configured), [], "resolving the shared-memory directory")
        if len(set(dirs)) > 1:
            r = next(i for i, x in enumerate(dirs) if x != dirs[0])
            raise FrugalError(
                f"local ranks disagree on the shared-memory directory: rank 0 uses {dirs[0]!r}, rank {r} uses "
                f"{dirs[r]!r}; set the same FrugalConfig.shm_dir (or ${shm.ENV_DIR}) on every rank"
            )
        return str(dirs[0])
