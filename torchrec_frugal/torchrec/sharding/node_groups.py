"""The nodes of a job, as the frugal_row_wise sharding sees them: which ranks share a node's
host memory (the intra-node group, served by one Frugal engine) and which ranks of different
nodes exchange ids and embeddings (the cross-node group, TorchRec's row-wise all-to-alls).

The counterpart of TorchRec's ``comm.intra_and_cross_node_pg``, with the same layout (rank =
node x local size + local rank): ranks k, k + L, k + 2L, ... form cross-node group k. The groups
are made once per process group and local size and then reused, since creating a group is a
collective of every rank.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch.distributed as dist

from ...errors import FrugalError
from ...host.local_group import node_identity


@dataclass(frozen=True)
class NodeGroups:
    """This rank's node and its two process groups."""

    node: int  # this rank's node, 0 .. nodes - 1
    nodes: int
    local_rank: int  # rank within the node
    local_size: int  # ranks per node
    intra: dist.ProcessGroup  # the node's ranks: one Frugal engine
    cross: dist.ProcessGroup  # one rank per node, same local rank: row-wise all-to-alls


_GROUPS: Dict[Tuple[int, int], NodeGroups] = {}


def local_world_size(world: int) -> int:
    """Ranks per node: torchrun's LOCAL_WORLD_SIZE, else every rank on one node."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", world))


def node_groups(pg: Optional[dist.ProcessGroup] = None, local_size: Optional[int] = None) -> NodeGroups:
    """The node groups of ``pg`` (default: the world) with ``local_size`` ranks per node (default:
    LOCAL_WORLD_SIZE). Collective on first use; raises, naming the ranks, if the ranks of one node
    of that layout run on different nodes (hosts, or torchrun launches)."""
    pg = pg if pg is not None else dist.GroupMember.WORLD
    world, rank = dist.get_world_size(pg), dist.get_rank(pg)
    size = local_size if local_size is not None else local_world_size(world)
    key = (id(pg), size)
    if key in _GROUPS:
        return _GROUPS[key]
    if size < 1 or world % size:
        raise FrugalError(f"frugal_row_wise: {world} ranks do not split into nodes of {size} ranks (LOCAL_WORLD_SIZE)")
    seen: List[Optional[str]] = [None] * world
    dist.all_gather_object(seen, node_identity(), group=pg)
    for n in range(world // size):
        ranks = range(n * size, (n + 1) * size)
        if len({seen[r] for r in ranks}) > 1:  # a node's ranks must share its host memory
            raise FrugalError(
                f"frugal_row_wise expects ranks {n * size}..{(n + 1) * size - 1} on one node "
                f"({size} ranks per node, LOCAL_WORLD_SIZE), but the ranks run on: "
                + ", ".join(f"rank {r}: {s}" for r, s in enumerate(seen))
            )
    global_ranks = [r if pg is dist.GroupMember.WORLD else dist.get_global_rank(pg, r) for r in range(world)]
    intra: Optional[dist.ProcessGroup] = None
    cross: Optional[dist.ProcessGroup] = None
    for n in range(world // size):  # every rank creates every group, in the same order
        g = dist.new_group([global_ranks[r] for r in range(n * size, (n + 1) * size)])
        if rank // size == n:
            intra = g
    for k in range(size):
        g = dist.new_group([global_ranks[r] for r in range(k, world, size)])
        if rank % size == k:
            cross = g
    assert intra is not None and cross is not None
    groups = NodeGroups(node=rank // size, nodes=world // size, local_rank=rank % size, local_size=size,
                        intra=intra, cross=cross)  # fmt: skip
    _GROUPS[key] = groups
    return groups
