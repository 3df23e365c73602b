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
collective over the cross-node group. When the batch's step comes, its input dist sends nothing:
it hands on the ids the announcement delivered (:class:`AnnouncedInputs`), so a batch's ids cross
the network once, with or without the lookahead (EmbeddingBagCollection tables; an
EmbeddingCollection's step sends them again, since TorchRec's sequence output dist takes its
splits from that all-to-all).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from typing import Any, Deque, Dict, Optional

import torch
from torchrec.distributed.embedding_sharding import BaseEmbeddingDist, BaseSparseFeaturesDist, EmbeddingShardingContext
from torchrec.distributed.sharding.rw_sequence_sharding import RwSequenceEmbeddingDist
from torchrec.distributed.sharding.rw_sharding import RwPooledEmbeddingDist, RwSparseFeaturesDist
from torchrec.distributed.sharding.sequence_sharding import SequenceShardingContext
from torchrec.distributed.types import Awaitable, NoWait
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from ...errors import FrugalError, FrugalInputError
from ..checkpoint import row_blocks
from .frugal_sharding import C, FrugalEmbeddingSharding
from .node_groups import NodeGroups, node_groups
from ..types import FrugalTable


@dataclass
class _SentBatch:
    """A batch as announced (copies of its ids, before the dist) and what the dist delivered."""

    values: torch.Tensor
    lengths: torch.Tensor
    weights: Optional[torch.Tensor]
    delivered: KeyedJaggedTensor
    unbucketize_permute_tensor: Optional[torch.Tensor]

    def first_difference(self, features: KeyedJaggedTensor) -> Optional[str]:
        """None if ``features`` are this batch's ids (and weights), else where they first differ."""
        weights = features.weights_or_none()
        if (
            torch.equal(self.lengths, features.lengths())
            and torch.equal(self.values, features.values())
            and (weights is None) == (self.weights is None)
            and (weights is None or torch.equal(self.weights, weights))  # type: ignore[arg-type]
        ):
            return None
        keys, stride = features.keys(), features.stride()
        lengths = self.lengths.to(features.lengths().device)
        for i, key in enumerate(keys):
            if not torch.equal(lengths[i * stride : (i + 1) * stride], features.lengths()[i * stride : (i + 1) * stride]):
                return f"feature {key!r}"
        opk = features.offset_per_key()
        values = self.values.to(features.values().device)
        for i, key in enumerate(keys):
            if not torch.equal(values[opk[i] : opk[i + 1]], features.values()[opk[i] : opk[i + 1]]):
                return f"feature {key!r}"
        return f"the weights of features {keys}"


class AnnouncedInputs:
    """Batches announced ahead, as the input dist sent them to the owning nodes, in step order.

    Announcing a batch runs the input dist's all-to-all L steps early (``send``, then ``commit``
    once every module took the batch); the step's input dist then takes the ids it delivered
    (``take``) instead of sending them again. Announcing is a collective over the cross-node group
    that every rank runs for the same batches in the same order, so at each step every rank of the
    group reuses, or every rank sends. A step must train the batch announced for it.

    The announcement has a dist of its own: TorchRec's train pipeline rewrites the step's.
    ``keep=False`` keeps nothing for the steps, which then send their ids again: TorchRec's
    sequence output dist (EmbeddingCollection) takes its splits from its step's all-to-all.
    """

    def __init__(self, dist: RwSparseFeaturesDist, device: torch.device, keep: bool) -> None:
        self._dist = dist
        self._device = device
        self._keep = keep
        self._staged: Optional[_SentBatch] = None
        self._pending: Deque[Optional[_SentBatch]] = deque()

    def send(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """Send a future batch's ids to the owning nodes (collective); return what this rank received."""
        features = features.to(self._device)
        delivered = self._dist(features).wait().wait()
        weights = features.weights_or_none()
        # Copies: a loader may refill its buffers before the announced step runs.
        self._staged = _SentBatch(
            features.values().clone(),
            features.lengths().clone(),
            None if weights is None else weights.clone(),
            delivered,
            self._dist.unbucketize_permute_tensor,
        )
        return delivered

    def commit(self, sent: bool) -> None:
        """One more step announced; ``sent``: its ids are the last ``send``'s (else its step sends them)."""
        staged, self._staged = self._staged, None
        if self._keep:
            self._pending.append(staged if sent else None)

    def take(self, features: KeyedJaggedTensor) -> Optional[_SentBatch]:
        """What the announcement of this step delivered, or None if its step must send its ids.

        Raises, taking nothing, if ``features`` are not the batch announced for this step.
        """
        if not self._pending:
            return None
        sent = self._pending[0]
        if sent is not None:
            differs = sent.first_difference(features)
            if differs is not None:
                raise FrugalInputError(
                    f"the batch trained differs from the lookahead batch announced for its step in {differs}: under frugal_row_wise a step must train the batch announced for it; nothing was changed"
                )
        self._pending.popleft()
        return sent


class FrugalRwSparseFeaturesDist(RwSparseFeaturesDist):
    """TorchRec's row-wise input dist that hands on the ids an announcement already sent.

    Its results are those of ``RwSparseFeaturesDist``: the step's ids bucketized to the owning
    nodes (and, for sequences, the permutation back); only the all-to-all is skipped when the
    announcement of this step delivered them.
    """

    def __init__(self, announced: AnnouncedInputs, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._announced = announced

    def forward(self, sparse_features: KeyedJaggedTensor) -> Awaitable[Awaitable[KeyedJaggedTensor]]:
        sent = self._announced.take(sparse_features)
        if sent is None:
            return super().forward(sparse_features)
        self.unbucketize_permute_tensor = sent.unbucketize_permute_tensor
        return NoWait(NoWait(sent.delivered))


class FrugalRowWiseEmbeddingSharding(FrugalEmbeddingSharding[C]):
    """frugal_row_wise sharding of the tables of one sharded module; the variants below differ
    in their output (pooled sums reduce-scattered, or one embedding per id sent back)."""

    _announced_inputs: Optional[AnnouncedInputs] = None  # made on first use

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
            # Its ids were brought in range before the input dist (bounds_check.row_zero, on the
            # whole table's rows): one still out of the node's block would be a fault, not data.
            bounds_check="FATAL",
        )

    def _dist_kwargs(self, device: Optional[torch.device]) -> Dict[str, Any]:
        return dict(
            pg=self._nodes.cross,
            num_features=len(self.feature_names()),
            feature_hash_sizes=[t.table_rows for t in self._tables for _ in t.feature_names],
            device=device if device is not None else self._device,
            is_sequence=not self.pooled,
            has_feature_processor=False,
        )

    @property
    def announced_inputs(self) -> AnnouncedInputs:
        """The announced batches' ids as sent, shared by the announcements and the step's input dist."""
        if self._announced_inputs is None:
            dist = RwSparseFeaturesDist(**self._dist_kwargs(None))
            self._announced_inputs = AnnouncedInputs(dist, self._device, keep=self.pooled)
        return self._announced_inputs

    def create_input_dist(self, device: Optional[torch.device] = None) -> BaseSparseFeaturesDist[KeyedJaggedTensor]:
        if not self.pooled:  # the sequence output dist needs the splits of its step's all-to-all
            return RwSparseFeaturesDist(**self._dist_kwargs(device))
        return FrugalRwSparseFeaturesDist(self.announced_inputs, **self._dist_kwargs(device))

    def _lookup_groups(self, device: Optional[torch.device]) -> Dict[str, Any]:
        """One engine over the node's ranks; checkpoints over every rank; announced batches go to
        the owning nodes when they are announced, and their steps reuse what was sent."""
        return {"pg": self._nodes.intra, "checkpoint_pg": self._env.process_group, "announce_dist": self.announced_inputs}

    def _engine_ranks(self) -> int:
        """The node's ranks: its engine divides the rows' summed gradients by them, the output
        dist's backward by the nodes."""
        return self._nodes.local_size


class FrugalRowWisePooledEmbeddingSharding(FrugalRowWiseEmbeddingSharding[EmbeddingShardingContext]):
    """frugal_row_wise sharding of EmbeddingBagCollection tables: partial pooled sums per node,
    reduce-scattered over the cross-node group (TorchRec's RwPooledEmbeddingDist)."""

    pooled = True

    def _stock_output_dist(
        self, device: Optional[torch.device]
    ) -> BaseEmbeddingDist[EmbeddingShardingContext, torch.Tensor, torch.Tensor]:
        return RwPooledEmbeddingDist(self._nodes.cross, embedding_dims=self.embedding_dims())


class FrugalRowWiseSequenceEmbeddingSharding(FrugalRowWiseEmbeddingSharding[SequenceShardingContext]):
    """frugal_row_wise sharding of EmbeddingCollection tables: one embedding per id, sent back over
    the cross-node group and put in input order (TorchRec's RwSequenceEmbeddingDist)."""

    pooled = False

    def _stock_output_dist(
        self, device: Optional[torch.device]
    ) -> BaseEmbeddingDist[SequenceShardingContext, torch.Tensor, torch.Tensor]:
        return RwSequenceEmbeddingDist(
            self._nodes.cross, len(self.feature_names()), device if device is not None else self._device
        )
