"""Training batches of a knowledge graph, defined globally and split across ranks.

Step ``s`` draws a global batch of ``B`` training triples (epochs of seeded permutations) and,
for each chunk of ``k`` of them, ``m`` negative entities shared by the chunk (uniform, as DGL-KE's
chunked sampler draws them). Steps alternate between corrupting tails and heads. Rank ``r`` of
``W`` takes chunks ``r * B / (k W) ...``: the data a step trains on does not depend on the number
of ranks, so one process and ``W`` ranks see the same triples and negatives (and, with TorchRec's
gradient division, take the same steps).

Batches are functions of (seed, step, rank), so any process can make any of them:
:meth:`ChunkedNegativeSampler.batches` can make them in DataLoader worker processes, ahead of use
and off the training thread, and a run resumed at step ``s`` gets the batches an uninterrupted run
gets from there.
"""
from __future__ import annotations

from typing import Dict, Iterator

import torch

from torchrec_frugal.presample import count_ids

from examples.graph.models import (
    ENTITY_FEATURE, ENTITY_TABLE, RELATION_FEATURE, RELATION_TABLE, KGBatch, PackedBatches, make_batch, pack_batch,
)  # fmt: skip


class ChunkedNegativeSampler:
    """Deterministic global batches of (positives, shared negatives), and each rank's share."""

    def __init__(
        self,
        train: torch.Tensor,
        num_entities: int,
        batch_size: int,
        chunk_size: int,
        negatives: int,
        world_size: int,
        seed: int = 0,
    ) -> None:
        if train.ndim != 2 or train.shape[1] != 3 or train.shape[0] == 0:
            raise ValueError(f"train triples must be a non-empty [N, 3] tensor, got shape {tuple(train.shape)}")
        if chunk_size < 1 or negatives < 1 or batch_size < 1:
            raise ValueError("batch_size, chunk_size and negatives must be >= 1")
        if batch_size % (chunk_size * world_size):
            raise ValueError(
                f"the global batch ({batch_size}) must split into chunks of {chunk_size} evenly over "
                f"{world_size} ranks: make it a multiple of {chunk_size * world_size}"
            )
        self.train = train.to(torch.int64)
        self.num_entities = num_entities
        self.batch_size = batch_size
        self.chunk_size = chunk_size
        self.negatives = negatives
        self.world_size = world_size
        self.seed = seed
        self._perms: Dict[int, torch.Tensor] = {}

    @property
    def chunks_per_rank(self) -> int:
        return self.batch_size // (self.chunk_size * self.world_size)

    def permutation(self, epoch: int) -> torch.Tensor:
        """The order in which epoch ``epoch`` visits the training triples (seeded; the last few kept)."""
        if epoch not in self._perms:
            if len(self._perms) > 2:
                self._perms.pop(min(self._perms))
            gen = torch.Generator().manual_seed(self.seed * 7919 + epoch)
            self._perms[epoch] = torch.randperm(self.train.shape[0], generator=gen)
        return self._perms[epoch]

    def global_positions(self, step: int) -> torch.Tensor:
        """Indices into ``train`` of step ``step``'s global batch (epochs of permutations)."""
        n = self.train.shape[0]
        lo, hi = step * self.batch_size, (step + 1) * self.batch_size
        if lo // n == (hi - 1) // n:  # the batch lies in one epoch: a slice of its permutation
            e = lo // n
            return self.permutation(e)[lo - e * n : hi - e * n]
        pos = torch.arange(lo, hi)
        epochs = pos // n
        out = torch.empty_like(pos)
        for e in torch.unique(epochs).tolist():  # one or two epochs per batch (more if B > N)
            sel = epochs == e
            out[sel] = self.permutation(int(e))[pos[sel] % n]
        return out

    def rank_batch(self, step: int, rank: int) -> KGBatch:
        """Rank ``rank``'s share of step ``step``."""
        triples = self.train.index_select(0, self.global_positions(step))
        gen = torch.Generator().manual_seed(self.seed * 104_729 + step)
        total_chunks = self.batch_size // self.chunk_size
        negatives = torch.randint(0, self.num_entities, (total_chunks, self.negatives), generator=gen)
        c = self.chunks_per_rank
        lo, hi = rank * c * self.chunk_size, (rank + 1) * c * self.chunk_size
        mine = triples[lo:hi]
        corrupt_heads = step % 2 == 1
        anchors, trues = (mine[:, 2], mine[:, 0]) if corrupt_heads else (mine[:, 0], mine[:, 2])
        return make_batch(anchors, mine[:, 1], trues, negatives[rank * c : (rank + 1) * c], corrupt_heads)

    def batches(self, rank: int, steps: int, start: int = 0, workers: int = 0, pin: bool = False) -> Iterator[KGBatch]:
        """Rank ``rank``'s batches of steps ``start .. start + steps - 1``, in order.

        With ``workers`` > 0 they are made by that many DataLoader worker processes, ahead of use
        and off the training thread, as a real input pipeline makes them; the batches and their
        order are the same. The workers start here, so call this before the training process
        starts threads of its own. ``pin``: batches come in page-locked memory (for an
        asynchronous copy to an accelerator).
        """
        if workers > 0:
            # A generator of its own: the workers' seeds must not be drawn from the global RNG, so
            # the rest of the run draws from it what a run without workers draws.
            loader = torch.utils.data.DataLoader(
                _RankSteps(self, rank, start, steps), batch_size=None, num_workers=workers, prefetch_factor=4,
                pin_memory=pin, generator=torch.Generator().manual_seed(0),
            )  # fmt: skip
            packed = PackedBatches(self.chunks_per_rank * self.chunk_size, self.chunk_size, self.negatives)
            return map(packed.unpack, loader)
        return (self.rank_batch(step, rank) for step in range(start, start + steps))

    def presample_counts(self, rank: int, steps: int, num_relations: int) -> Dict[str, torch.Tensor]:
        """How often each entity and relation is read in this rank's first ``steps`` batches (Frugal's hot rows)."""
        batches = ([b.ids[ENTITY_FEATURE].values(), b.ids[RELATION_FEATURE].values()] for b in self.batches(rank, steps))
        entities, relations = count_ids(batches, [self.num_entities, num_relations])
        return {ENTITY_TABLE: entities, RELATION_TABLE: relations}


class _RankSteps(torch.utils.data.Dataset):
    """One rank's batches of steps ``start .. start + steps - 1``, by index, for DataLoader workers,
    each packed in one buffer (picklable: the sampler holds tensors and ints only)."""

    def __init__(self, sampler: ChunkedNegativeSampler, rank: int, start: int, steps: int) -> None:
        self.sampler, self.rank, self.start, self.steps = sampler, rank, start, steps

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, i: int) -> torch.Tensor:
        return pack_batch(self.sampler.rank_batch(self.start + i, self.rank))
