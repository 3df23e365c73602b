"""The "frugal_row_wise" sharding type: Frugal inside each node, TorchRec's row_wise across nodes.

The counterpart of TorchRec's ``sharding/rw_sharding.py`` with nodes in place of ranks. A table's
rows are split into one block per node, as row_wise splits them per rank. Each rank bucketizes
its batch's ids by node block and sends them, with TorchRec's own ``RwSparseFeaturesDist``, to
the rank of the same local rank on the owning node (the cross-node group: one rank per node).
There the node's block, in the node's shared host memory, is served by a Frugal engine shared by
the node's ranks (owner caches, flushes, gate), and the partial pooled sums go back with
TorchRec's ``RwPooledEmbeddingDist`` (a reduce-scatter over the cross-node group). Inside a node
no rank sends another ids or embeddings; the gradients of a node's rows reach it through the
backward of those dists, and its engine sums them over the node's ranks.

Gradient scaling matches row_wise: the reduce-scatter's backward divides by the nodes, the
engine by the node's ranks, together by the world size.

The lookahead window works across nodes: a future batch announced to the module (by the train
pipeline, or ``push_lookahead``) goes through an input dist of its own to the owning nodes, and
each node's engine learns the rows its ranks will step on L steps ahead. That announcement is a
collective over the cross-node group; it sends the batch's ids a second time (not its embeddings).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, Optional

import torch
from torchrec.distributed.embedding_sharding import BaseEmbeddingDist, BaseSparseFeaturesDist, EmbeddingShardingContext
from torchrec.distributed.sharding.rw_sequence_sharding import RwSequenceEmbeddingDist
from torchrec.distributed.sharding.rw_sharding import RwPooledEmbeddingDist, RwSparseFeaturesDist
from torchrec.distributed.sharding.sequence_sharding import SequenceShardingContext
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from ..errors import FrugalError
from .checkpoint import row_blocks
from .frugal_sharding import C, FrugalEmbeddingSharding
from .node_groups import NodeGroups, node_groups
from .types import FrugalTable


class FrugalRowWiseEmbeddingSharding(FrugalEmbeddingSharding[C]):
    """frugal_row_wise sharding of the tables of one sharded module; the variants below differ
    in their output (pooled sums reduce-scattered, or one embedding per id sent back)."""

    @property
    def _nodes(self) -> NodeGroups:
        return node_groups(self._env.process_group)  # made on first use, then cached

    def _engine_table(self, table: FrugalTable) -> FrugalTable:
        """The node's block of ``table``: its rows, offset, whole size and pre-sample counts."""
        node, nodes = self._nodes.node, self._nodes.nodes
        offset, rows = row_blocks(table.num_embeddings, nodes)[node]
        if rows == 0:
            raise FrugalError(
                f"table {table.name!r}: {table.num_embeddings} rows leave node {node} of {nodes} no row block "
                "under frugal_row_wise; shard it frugal or table_wise instead"
            )
        counts = table.presample_counts
        return replace(
            table,
            num_embeddings=rows,
            row_offset=offset,
            total_rows=table.num_embeddings,
            presample_counts=None if counts is None else counts[offset : offset + rows],
        )

    def create_input_dist(self, device: Optional[torch.device] = None) -> BaseSparseFeaturesDist[KeyedJaggedTensor]:
        return RwSparseFeaturesDist(
            pg=self._nodes.cross,
            num_features=len(self.feature_names()),
            feature_hash_sizes=[t.table_rows for t in self._tables for _ in t.feature_names],
            device=device if device is not None else self._device,
            is_sequence=not self.pooled,
            has_feature_processor=False,
        )

    def _lookup_groups(self, device: Optional[torch.device]) -> Dict[str, Any]:
        """One engine over the node's ranks; checkpoints over every rank; announced batches go
        to the owning nodes through an input dist of their own (the step's keeps its state)."""
        announce_dist = self.create_input_dist(device)

        def to_owning_nodes(features: KeyedJaggedTensor) -> KeyedJaggedTensor:
            return announce_dist(features).wait().wait()

        return {"pg": self._nodes.intra, "checkpoint_pg": self._env.process_group, "announce_dist": to_owning_nodes}


class FrugalRowWisePooledEmbeddingSharding(FrugalRowWiseEmbeddingSharding[EmbeddingShardingContext]):
    """frugal_row_wise sharding of EmbeddingBagCollection tables: partial pooled sums per node,
    reduce-scattered over the cross-node group (TorchRec's RwPooledEmbeddingDist)."""

    pooled = True

    def create_output_dist(
        self, device: Optional[torch.device] = None
    ) -> BaseEmbeddingDist[EmbeddingShardingContext, torch.Tensor, torch.Tensor]:
        return RwPooledEmbeddingDist(self._nodes.cross, embedding_dims=self.embedding_dims())


class FrugalRowWiseSequenceEmbeddingSharding(FrugalRowWiseEmbeddingSharding[SequenceShardingContext]):
    """frugal_row_wise sharding of EmbeddingCollection tables: one embedding per id, sent back over
    the cross-node group and put in input order (TorchRec's RwSequenceEmbeddingDist)."""

    pooled = False

    def create_output_dist(
        self, device: Optional[torch.device] = None
    ) -> BaseEmbeddingDist[SequenceShardingContext, torch.Tensor, torch.Tensor]:
        return RwSequenceEmbeddingDist(
            self._nodes.cross, len(self.feature_names()), device if device is not None else self._device
        )
