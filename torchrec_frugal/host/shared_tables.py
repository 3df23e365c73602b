"""The run's shared memory: the host tables with the control block, and every rank's mailboxes.

Rank 0 sweeps stale segments, checks that the run fits the machine, names the run, creates the
host segment (full tables of weights and optimizer state, plus the per-rank progress counters)
and initialises the weights. Every rank then maps it, creates its own mailbox records and maps
the others'. Each step is all-or-none over the local ranks; once every rank has mapped every
segment the names go, so nothing is left behind however the run ends.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, List, Sequence, Tuple, Union

import numpy as np
import torch
from tqdm import tqdm

from . import shm
from ..config import FrugalConfig, TableSpec
from .control_record import FLUSHED, GRAD_ROWS, INGESTED, PID, PUBLISHED, RING_ROWS, RUNNING, STAGED, STATUS, SYNC, UPDATED, Control, control_field
from ..errors import FrugalInputError
from .memory import check_fits
from .local_group import LocalGroup
from .mailbox import Record, grads_layout, keep_ring, ring_layout
from ..priorities import INF

InitWeights = Union[Sequence[torch.Tensor], Callable[[int, torch.Tensor], None], None]
"""Initial weights: one tensor per table, a function ``(table index, host view)``, or None
(uniform in +-1/sqrt(rows), as TorchRec's default)."""


@dataclass
class SharedTables:
    """This rank's handles on the run's shared memory."""

    run_id: str
    segment: shm.SharedSegment  # the host tables: weights, optimizer state, control block
    control: Control  # this rank's view of the progress counters
    ring_record: Record  # the mailboxes' lookahead rings
    grad_record: Record  # the mailboxes' staged gradients


def open_shared_tables(
    group: LocalGroup,
    shm_dir: str,
    tables: Sequence[TableSpec],
    state_width: int,
    config: FrugalConfig,
    init_weights: InitWeights,
    seed: int,
) -> SharedTables:
    """Set up the run's shared memory on every local rank (collective, all-or-none)."""
    n, d, world = sum(t.num_embeddings for t in tables), tables[0].embedding_dim, group.world_size
    layout = host_layout(n, d, state_width, world)
    slots = config.lookahead + 2
    # Mailbox records start at mailbox_rows rows (announced rows only with a lookahead).
    ring = Record(
        "ring", lambda k: ring_layout(slots, world, k), keep_ring, RING_ROWS,
        shm_dir, config.mailbox_rows, n if config.lookahead > 0 else 0, group.rank, world,
    )  # fmt: skip
    grads = Record(
        "grads", lambda k: grads_layout(world, k, d), None, GRAD_ROWS, shm_dir, config.mailbox_rows, n, group.rank, world
    )
    run_id = start_run(group, shm_dir, tables, state_width, layout.nbytes, ring.nbytes() + grads.nbytes())
    segment, control = create_shared_memory(
        group, run_id, shm_dir, layout, [ring, grads], config.timeout_s,
        lambda seg: init_host_tables(seg["weights"], seg["state"], tables, init_weights, seed),
    )  # fmt: skip
    return SharedTables(run_id, segment, control, ring, grads)


def host_layout(num_rows: int, dim: int, state_width: int, world_size: int) -> shm.Layout:
    """The host segment: weights [rows, dim], optimizer state [rows, state_width], control block."""
    return shm.Layout(
        [
            shm.Field("weights", torch.float32, (num_rows, dim)),
            shm.Field("state", torch.float32, (num_rows, state_width)),
            control_field(world_size),
        ]
    )


def start_run(
    group: LocalGroup, shm_dir: str, tables: Sequence[TableSpec], state_width: int, host_bytes: int, mailbox_bytes: int
) -> str:
    """Rank 0 sweeps stale segments, checks that the run fits the machine and names the run."""

    def name() -> Union[str, None]:
        if group.rank != 0:
            return None
        shm.sweep_stale_segments(shm_dir)
        check_fits(tables, state_width, host_bytes, mailbox_bytes, group.world_size, shm_dir)
        return shm.new_run_id()

    return str(group.all_or_none(name, [], "checking the room for the host tables")[0])


def create_shared_memory(
    group: LocalGroup,
    run_id: str,
    shm_dir: str,
    layout: shm.Layout,
    records: Sequence[Record],
    timeout_s: float,
    init: Callable[[shm.SharedSegment], None],
) -> Tuple[shm.SharedSegment, Control]:
    """Create and map every segment, then drop the names; a failure on any rank fails all, leaving nothing.

    ``init`` fills the host segment's tables on rank 0 before any other rank maps it.
    Returns the host segment and this rank's view of the control block.
    """
    created: List[shm.SharedSegment] = []
    prefix = f"{shm.PREFIX}{run_id}_"
    mapped: List[shm.SharedSegment] = []  # the host segment
    controls: List[Control] = []

    def host() -> None:
        if group.rank == 0:
            seg = shm.SharedSegment.create(prefix + "host", layout, shm_dir)
            created.append(seg)
            mapped.append(seg)
            init(seg)

    def mailboxes() -> None:
        if group.rank != 0:
            mapped.append(shm.SharedSegment.attach(prefix + "host", layout, shm_dir))
        c = Control(mapped[0]["control"], group.rank, timeout_s)
        controls.append(c)
        for f, v in ((STAGED, -1), (UPDATED, -1), (FLUSHED, INF), (PUBLISHED, -1), (INGESTED, -1), (SYNC, 0)):
            c.set(f, v)
        c.set(STATUS, RUNNING)
        c.set(PID, os.getpid())
        for rec in records:
            created.append(rec.create_own(c, prefix))

    def attach() -> None:
        for rec in records:
            rec.attach_peers()

    group.all_or_none(host, created, "creating the host tables")
    group.all_or_none(mailboxes, created, "creating the mailboxes")
    group.all_or_none(attach, created, "mapping the mailboxes")
    for seg in created:  # every local rank has mapped it: the name can go
        seg.unlink()
    return mapped[0], controls[0]


PROGRESS_BYTES = 1 << 30


def init_host_tables(
    weights: torch.Tensor, state: torch.Tensor, tables: Sequence[TableSpec], init_weights: InitWeights, seed: int
) -> None:
    """Fill the fused host tables: zero optimizer state, each table's weights from ``init_weights``.

    Tables of more than ``PROGRESS_BYTES`` in all show a progress bar: filling tens of gigabytes on
    one rank takes minutes, and the other ranks wait for it silently."""
    gen = torch.Generator().manual_seed(seed)
    state.zero_()
    offsets = np.cumsum([0] + [t.num_embeddings for t in tables])
    quiet = weights.numel() * weights.element_size() < PROGRESS_BYTES
    for t, spec in enumerate(tqdm(tables, desc="torchrec_frugal: initialising host tables", unit="table", disable=quiet)):
        view = weights[int(offsets[t]) : int(offsets[t + 1])]
        if init_weights is None:
            bound = (1.0 / spec.num_embeddings) ** 0.5
            view.uniform_(-bound, bound, generator=gen)
        elif callable(init_weights):
            init_weights(t, view)
        else:
            w = init_weights[t]
            if tuple(w.shape) != (spec.num_embeddings, spec.embedding_dim):
                raise FrugalInputError(
                    f"table {spec.name!r}: initial weights have shape {tuple(w.shape)}, "
                    f"expected {(spec.num_embeddings, spec.embedding_dim)}"
                )
            view.copy_(w.detach().to("cpu", torch.float32))
