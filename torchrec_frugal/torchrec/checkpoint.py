"""Checkpoint layout of frugal tables: row blocks per rank, as ShardedTensors on CPU.

A frugal table lives once, in host memory; in a state_dict each rank contributes the block of
rows TorchRec's row_wise sharding would give it, so a checkpoint can be loaded with
torch.distributed.checkpoint into any sharding (frugal or stock), and back.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple, Union

import torch
import torch.distributed as dist
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor, ShardedTensorMetadata, TensorProperties

# The optimizer states of each engine optimizer kind, in the order of their columns in the engine's
# state, named as TorchRec's EmbeddingFusedOptimizer names them in state_dict: ``<table>.momentum1``
# for FBGEMM's first state (row-wise Adagrad's accumulator [rows], Adagrad's [rows, dim], Adam's
# exp_avg [rows, dim]), then FBGEMM's own key (Adam's exp_avg_sq [rows, dim]).
OPTIMIZER_STATE_NAMES: Dict[str, Tuple[str, ...]] = {
    "sgd": (),
    "rowwise_adagrad": ("momentum1",),
    "adagrad": ("momentum1",),
    "adam": ("momentum1", "exp_avg_sq"),
}

ROWWISE_KINDS = ("rowwise_adagrad",)
"""Kinds whose state is one value per row ([rows] in a checkpoint; the others' are [rows, dim])."""


def state_columns(kind: str, state_width: int) -> Dict[str, slice]:
    """The engine's state columns of each named state of optimizer ``kind`` (equal widths)."""
    names = OPTIMIZER_STATE_NAMES[kind]
    width = state_width // len(names) if names else 0
    return {name: slice(i * width, (i + 1) * width) for i, name in enumerate(names)}


def row_blocks(num_rows: int, world_size: int) -> List[Tuple[int, int]]:
    """(offset, size) of each rank's row block, as TorchRec's row_wise lays a table out."""
    block = -(-num_rows // world_size)
    return [(min(r * block, num_rows), max(0, min(block, num_rows - r * block))) for r in range(world_size)]


def row_layout(num_rows: int, world_size: int, local_size: int) -> List[Tuple[int, int]]:
    """(offset, size) of each rank's rows in a checkpoint: one block per node as row_wise splits a
    table over nodes, each node's block split over its ``local_size`` ranks the same way (rank =
    node x local_size + local rank). With one node it is :func:`row_blocks`."""
    return [
        (node_off + off, size)
        for node_off, node_rows in row_blocks(num_rows, world_size // local_size)
        for off, size in row_blocks(node_rows, local_size)
    ]


def _global_rank(pg: Optional[dist.ProcessGroup], group_rank: int) -> int:
    return group_rank if pg is None or pg is dist.GroupMember.WORLD else dist.get_global_rank(pg, group_rank)


def rows_sharded_tensor(
    local: torch.Tensor, num_rows: int, pg: Optional[dist.ProcessGroup], blocks: Optional[List[Tuple[int, int]]] = None
) -> ShardedTensor:
    """A ShardedTensor of ``num_rows`` rows whose block of this rank is ``local`` (no collective);
    ``blocks``: each rank's (offset, size), by default :func:`row_blocks`."""
    rank, world = dist.get_rank(pg), dist.get_world_size(pg)
    tail = list(local.shape[1:])
    metas: Dict[int, ShardMetadata] = {
        r: ShardMetadata(
            shard_offsets=[off] + [0] * len(tail),
            shard_sizes=[size] + tail,
            placement=f"rank:{_global_rank(pg, r)}/cpu",
        )
        for r, (off, size) in enumerate(blocks if blocks is not None else row_blocks(num_rows, world))
        if size > 0
    }
    metadata = ShardedTensorMetadata(
        shards_metadata=list(metas.values()),
        size=torch.Size([num_rows] + tail),
        tensor_properties=TensorProperties(dtype=local.dtype, requires_grad=False),
    )
    shards = [Shard(local, metas[rank])] if rank in metas else []
    return ShardedTensor._init_from_local_shards_and_global_metadata(shards, metadata, process_group=pg)


def held_rows(
    value: Union[ShardedTensor, torch.Tensor],
    what: str,
    pg: Optional[dist.ProcessGroup],
    blocks: Optional[List[Tuple[int, int]]] = None,
) -> List[Tuple[int, torch.Tensor]]:
    """(first row, rows) pieces of a loaded value this rank loads; each piece has whole rows.

    A ShardedTensor gives its local shards; a whole tensor (the same on every rank) gives this
    rank's row block (``blocks``, by default :func:`row_blocks`), so that the ranks together load
    every row once.
    """
    if isinstance(value, ShardedTensor):
        full_cols = list(value.size()[1:])
        pieces = []
        for shard in value.local_shards():
            meta = shard.metadata
            if list(meta.shard_sizes[1:]) != full_cols:
                raise ValueError(
                    f"{what}: a shard holds columns {meta.shard_offsets[1:]}+{meta.shard_sizes[1:]} of "
                    f"{full_cols}; frugal tables load whole rows (load the checkpoint with "
                    "torch.distributed.checkpoint into this model's state_dict first)"
                )
            pieces.append((int(meta.shard_offsets[0]), shard.tensor))
        return pieces
    if isinstance(value, torch.Tensor):
        layout = blocks if blocks is not None else row_blocks(value.shape[0], dist.get_world_size(pg))
        off, size = layout[dist.get_rank(pg)]
        return [(off, value[off : off + size])]
    raise TypeError(f"{what}: expected a Tensor or ShardedTensor, got {type(value).__name__}")
