"""The batch agreement among the ranks of one machine, through named pipes (FIFOs).

Each rank has a FIFO that every peer writes its verdicts into (16 bytes: the batch index, the
sender, whether it refused it). A rank sends its verdict to every peer, then reads its peers'
from its own FIFO, blocked in the kernel without the GIL. A gloo all-gather of the same bytes
costs each rank about 0.4 ms of CPU a step in gloo's threads and the planner's call, on the cores
that train; a wait that polls shared memory costs the training thread more, each wake-up taking
the GIL (measured at e0f7734: `git show e0f7734:docs/performance.md`, "Relations as a table of the
sharded collection").

The names are unlinked as soon as every rank has opened them: nothing is left behind by a run,
a crash or a test, and each agreement (one per pipeline) has FIFOs of its own. A process forked
after the agreement is made (a DataLoader worker started later) inherits its descriptors: a rank
that dies while such a child lives is then named at the timeout rather than at once, so the
examples start their loaders' workers before the model.
"""
from __future__ import annotations

import os
import select
import struct
import time
from collections import deque
from typing import Deque, Dict, List, Optional, Tuple

import torch.distributed as dist

from ..errors import FrugalError
from . import shm
from .local_group import LocalGroup

_MSG = struct.Struct("<qii")  # batch index, sender rank, refused: 16 bytes, written whole (PIPE_BUF)


def one_machine(pg: dist.ProcessGroup) -> bool:
    """Whether every rank of ``pg`` runs on this machine (collective)."""
    return len(set(LocalGroup(pg).nodes())) == 1


class NodeBatchAgreement:
    """The ranks of ``pg``, all on one machine, agree batch after batch on which ranks could not plan it.

    Created by every rank of ``pg`` together (collective); each call is made by every rank for the
    same batch, in the same order, as :class:`~.batch_agreement.BatchAgreement`'s. A peer may send
    its next verdict before this rank has read the current one of a slower peer, so verdicts are
    queued per sender.
    """

    def __init__(self, pg: dist.ProcessGroup, timeout_s: float, shm_dir: Optional[str] = None) -> None:
        self._fds: List[int] = []  # every descriptor opened, closed by close()
        self.world_size, self.rank = dist.get_world_size(pg), dist.get_rank(pg)
        self.timeout_s = timeout_s
        directory = shm.resolve_dir(shm_dir)
        run: List[Optional[str]] = [shm.new_run_id() if self.rank == 0 else None]
        dist.broadcast_object_list(run, src=dist.get_global_rank(pg, 0), group=pg)

        def path(r: int) -> str:
            return os.path.join(directory, f"{shm.PREFIX}{run[0]}_agreement_{r}")

        os.mkfifo(path(self.rank), 0o600)
        try:
            dist.barrier(group=pg)
            self._in = os.open(path(self.rank), os.O_RDONLY | os.O_NONBLOCK)  # readers first: a writer's open needs one
            self._fds.append(self._in)
            dist.barrier(group=pg)
            self._out: List[Tuple[int, int]] = []  # (peer, its FIFO's write end)
            for r in range(self.world_size):
                if r != self.rank:
                    self._out.append((r, os.open(path(r), os.O_WRONLY)))
                    self._fds.append(self._out[-1][1])
            dist.barrier(group=pg)
        finally:
            os.unlink(path(self.rank))
        dist.barrier(group=pg)  # no rank's name is left once any rank starts
        self._poll = select.poll()
        self._poll.register(self._in, select.POLLIN)
        self._pending: Dict[int, Deque[Tuple[int, int]]] = {r: deque() for r in range(self.world_size) if r != self.rank}
        self._partial = b""

    def refused_by(self, index: int, refused: bool) -> List[int]:
        """The ranks (of ``pg``) that could not plan batch ``index``; ``refused``: this rank could not."""
        if not self._fds:
            raise FrugalError(
                f"FrugalTrainPipeline: rank {self.rank}'s batch agreement is closed: it cannot agree on batch {index}"
            )
        message = _MSG.pack(index, self.rank, int(refused))
        for peer, fd in self._out:
            try:
                os.write(fd, message)
            except BrokenPipeError as e:  # the peer closed its FIFO: it exited
                raise FrugalError(self._gone(index, [peer])) from e
        deadline = time.monotonic() + self.timeout_s
        while not all(self._pending.values()):
            self._receive(index, deadline)
        refusing = [self.rank] if refused else []
        for peer, queue in self._pending.items():
            peer_index, peer_refused = queue.popleft()
            if peer_index != index:
                raise FrugalError(
                    f"FrugalTrainPipeline: the ranks read different batches: rank {self.rank}'s batch {index} met "
                    f"batch {peer_index} of rank {peer} (each rank must read as many batches)"
                )
            if peer_refused:
                refusing.append(peer)
        return sorted(refusing)

    def _receive(self, index: int, deadline: float) -> None:
        """Read what the peers sent (blocking until something came); a peer gone or silent raises."""
        waiting = [r for r, q in self._pending.items() if not q]
        left = deadline - time.monotonic()
        if left <= 0 or not self._poll.poll(max(1, int(left * 1000))):
            raise FrugalError(
                f"FrugalTrainPipeline: the ranks could not agree on batch {index}: rank(s) {waiting} did not answer "
                f"(a rank failed or stopped, or read fewer batches than the others; the wait times out after "
                f"{self.timeout_s:g} s)"
            )
        try:
            data = os.read(self._in, 4096)
        except BlockingIOError:
            return
        if not data:  # every peer closed its end
            raise FrugalError(self._gone(index, waiting))
        data = self._partial + data
        whole = len(data) - len(data) % _MSG.size
        for peer_index, peer, peer_refused in _MSG.iter_unpack(data[:whole]):
            self._pending[peer].append((peer_index, peer_refused))
        self._partial = data[whole:]

    @staticmethod
    def _gone(index: int, peers: List[int]) -> str:
        return f"FrugalTrainPipeline: the ranks could not agree on batch {index}: rank(s) {peers} are gone"

    def close(self) -> None:
        """Close the pipes (a peer still waiting then sees this rank gone)."""
        while self._fds:
            os.close(self._fds.pop())

    def __del__(self) -> None:  # the pipeline holds only the bound refused_by
        self.close()
