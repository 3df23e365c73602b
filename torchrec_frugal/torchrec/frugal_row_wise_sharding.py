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
from typing import Any, Callable, Dict, List, Optional

import torch
from torchrec.distributed.embedding_sharding import (
    BaseEmbeddingDist,
    BaseEmbeddingLookup,
    BaseSparseFeaturesDist,
    EmbeddingShardingContext,
    EmbeddingShardingInfo,
)
from torchrec.distributed.embedding_types import BaseGroupedFeatureProcessor
from torchrec.distributed.sharding.rw_sequence_sharding import RwSequenceEmbeddingDist
from torchrec.distributed.sharding.rw_sharding import RwPooledEmbeddingDist, RwSparseFeaturesDist
from torchrec.distributed.sharding.sequence_sharding import SequenceShardingContext
from torchrec.distributed.types import ShardingEnv
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from ..config import FrugalConfig
from ..errors import FrugalError
from .checkpoint import row_blocks
from .embedding_lookup import FrugalEmbeddingLookup
from .frugal_sharding import C, FrugalEmbeddingSharding
from .node_groups import NodeGroups, node_groups


class FrugalRowWiseEmbeddingSharding(FrugalEmbeddingSharding[C]):
    """frugal_row_wise sharding of the tables of one sharded module; the variants below differ
    in their output (pooled sums reduce-scattered, or one embedding per id sent back)."""

    def __init__(
        self,
        sharding_infos: List[EmbeddingShardingInfo],
        env: ShardingEnv,
        device: Optional[torch.device] = None,
        config: Optional[FrugalConfig] = None,
        presample_counts: Optional[Dict[str, torch.Tensor]] = None,
        init_fns: Optional[Dict[str, Callable[[torch.Tensor], Any]]] = None,
    ) -> None:
        super().__init__(sharding_infos, env, device, config, presample_counts, init_fns)
        self._nodes: NodeGroups = node_groups(env.process_group)
        node, nodes = self._nodes.node, self._nodes.nodes
        for i, t in enumerate(self._tables):
            offset, rows = row_blocks(t.num_embeddings, nodes)[node]
            if rows == 0:
                raise FrugalError(
                    f"table {t.name!r}: {t.num_embeddings} rows leave node {node} of {nodes} no row block "
                    "under frugal_row_wise; shard it frugal or table_wise instead"
                )
            counts = t.presample_counts
            self._tables[i] = replace(
                t,
                num_embeddings=rows,
                row_offset=offset,
                total_rows=t.num_embeddings,
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

    def create_lookup(
        self,
        device: Optional[torch.device] = None,
        fused_params: Optional[Dict[str, Any]] = None,
        feature_processor: Optional[BaseGroupedFeatureProcessor] = None,
    ) -> BaseEmbeddingLookup:
        if feature_processor is not None:
            raise NotImplementedError("frugal_row_wise sharding does not support feature processors")
        announce_dist = self.create_input_dist(device)  # its own: the step's dist keeps its state

        def to_owning_nodes(features: KeyedJaggedTensor) -> KeyedJaggedTensor:
            return announce_dist(features).wait().wait()

        return FrugalEmbeddingLookup(
            self._tables,
            pooled=self.pooled,
            config=self._config,
            pg=self._nodes.intra,
            device=device if device is not None else self._device,
            checkpoint_pg=self._env.process_group,
            announce_dist=to_owning_nodes,
        )

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
