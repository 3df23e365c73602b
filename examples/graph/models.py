"""Knowledge-graph embedding models over TorchRec entity and relation tables: TransE, DistMult, ComplEx.

The entities and the relations are two tables of one ``EmbeddingCollection`` (features
``"entity"`` and ``"relation"``), so that any TorchRec sharder (stock or Frugal) shards both, and
both train with the sharder's fused row-wise Adagrad on the rows a step reads, as DGL-KE trains its
entity and relation embeddings (its sparse row-wise Adagrad).

Every score is written as "query against candidate": a query ``q`` combines the anchor entity
with the relation, and candidates are the entities on the corrupted side. Tail corruption uses
the head as anchor, head corruption the tail; the batch carries a sign ``s`` (+1 or -1) that turns
one form into the other without control flow (TorchRec's pipeline traces the forward):

- TransE: ``gamma - ||a + s r - c||_p``  (``h + r - t`` read from either side)
- DistMult: ``<a * r, c>``                (symmetric in head and tail)
- ComplEx: ``Re(<a * r', conj(c)>)`` with ``r' = r`` for tails and ``conj(r)`` for heads

Negatives are shared within a chunk of positives (as DGL-KE samples them), so a chunk's
negative scores are one batched matrix product (or L1 ``cdist``) of its queries against its
negatives.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torchrec import EmbeddingCollection, EmbeddingConfig
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
from torchrec.streamable import Pipelineable

MODELS = ("transe_l1", "transe_l2", "distmult", "complex")
LOSSES = ("logsigmoid", "margin")
ENTITY_TABLE = "entity"
ENTITY_FEATURE = "entity"
RELATION_TABLE = "relation"
RELATION_FEATURE = "relation"

# Rows are drawn in blocks of this many, each from its own seeded generator, so a row's initial
# value depends only on (seed, row) and not on how the table is sharded.
INIT_BLOCK_ROWS = 4096


def seeded_uniform_(weights: torch.Tensor, bound: float, seed: int, first_row: int = 0) -> torch.Tensor:
    """Fill rows ``first_row ...`` of a table with U(-bound, bound), independent of sharding.

    ``weights`` may be the whole table or any block of whole rows (a shard); the values of a row
    are the same in either case, so every sharding, and a single process, start identically.
    """
    n = weights.shape[0]
    if n == 0:
        return weights
    first_block, last_block = first_row // INIT_BLOCK_ROWS, (first_row + n - 1) // INIT_BLOCK_ROWS
    out = torch.empty(n, weights.shape[1], dtype=torch.float32)
    for block in range(first_block, last_block + 1):  # blocks, not rows
        gen = torch.Generator().manual_seed(seed * 1_000_003 + block)
        values = torch.empty(INIT_BLOCK_ROWS, weights.shape[1], dtype=torch.float32).uniform_(-bound, bound, generator=gen)
        lo = max(first_row, block * INIT_BLOCK_ROWS)
        hi = min(first_row + n, (block + 1) * INIT_BLOCK_ROWS)
        out[lo - first_row : hi - first_row] = values[lo - block * INIT_BLOCK_ROWS : hi - block * INIT_BLOCK_ROWS]
    with torch.no_grad():
        weights.copy_(out.to(weights.device, weights.dtype))
    return weights


@dataclass(frozen=True)
class KGEConfig:
    """Model and loss, as DGL-KE names them (``gamma``, ``-adv`` temperature, L3 regularization)."""

    model: str = "complex"
    dim: int = 200
    gamma: float = 12.0
    loss: str = "logsigmoid"
    margin: float = 1.0
    adversarial_temperature: float = 0.0
    regularization: float = 0.0

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, got {self.model!r}")
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {self.loss!r}")
        if self.dim < 1 or (self.model == "complex" and self.dim % 2):
            raise ValueError(f"dim must be positive (and even for complex), got {self.dim}")
        if self.adversarial_temperature < 0 or self.regularization < 0:
            raise ValueError("adversarial_temperature and regularization must be >= 0")

    @property
    def init_bound(self) -> float:
        """DGL-KE's embedding init range, (gamma + 2) / dim."""
        return (self.gamma + 2.0) / self.dim


# ------------------------------------------------------------------------------------ scoring
def query(cfg: KGEConfig, anchor: torch.Tensor, relation: torch.Tensor, sign: torch.Tensor) -> torch.Tensor:
    """The query vector of (anchor, relation) for the side ``sign`` corrupts (+1 tails, -1 heads)."""
    if cfg.model.startswith("transe"):
        return anchor + sign * relation
    if cfg.model == "distmult":
        return anchor * relation
    half = cfg.dim // 2
    a_re, a_im = anchor[..., :half], anchor[..., half:]
    r_re, r_im = relation[..., :half], sign * relation[..., half:]
    return torch.cat([a_re * r_re - a_im * r_im, a_re * r_im + a_im * r_re], dim=-1)


def _p(cfg: KGEConfig) -> float:
    return 1.0 if cfg.model == "transe_l1" else 2.0


def score_pairs(cfg: KGEConfig, q: torch.Tensor, candidate: torch.Tensor) -> torch.Tensor:
    """Scores of row-aligned (query, candidate) pairs: ``[..., d] x [..., d] -> [...]``."""
    if cfg.model.startswith("transe"):
        return cfg.gamma - torch.linalg.vector_norm(q - candidate, ord=_p(cfg), dim=-1)
    return (q * candidate).sum(-1)


class _L2Distances(torch.autograd.Function):
    """Euclidean distances of every query to every candidate of its group, ``[g, k, m]``, as
    ``cdist``'s matrix-product form (``|q|^2 + |c|^2 - 2 q.c``) computes them, with the backward
    written out: one batched product each way, where ``cdist``'s autograd goes through its
    padded operands (two concatenations, their slices, a clamp's mask)."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        norms = (q * q).sum(-1).unsqueeze(2) + (c * c).sum(-1).unsqueeze(1)
        d = torch.baddbmm(norms, q, c.transpose(1, 2), alpha=-2.0).clamp_min_(1e-30).sqrt_()
        ctx.save_for_backward(q, c, d)
        return d

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        # d d_ij / d q_i = (q_i - c_j) / d_ij: with v = grad / d, dq = rowsum(v) q - v c (dc alike)
        q, c, d = ctx.saved_tensors
        v = (grad / d).masked_fill_(d <= 1e-15, 0.0)  # a clamped distance passes no gradient
        dq = torch.baddbmm(q * v.sum(2, keepdim=True), v, c, alpha=-1.0)
        dc = torch.baddbmm(c * v.sum(1).unsqueeze(2), v.transpose(1, 2), q, alpha=-1.0)
        return dq, dc


def score_candidates(cfg: KGEConfig, q: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """Scores of every query against every candidate of its group: ``[g, k, d] x [g, m, d] -> [g, k, m]``."""
    if cfg.model == "transe_l2":
        return cfg.gamma - _L2Distances.apply(q, candidates)
    if cfg.model == "transe_l1":
        return cfg.gamma - torch.cdist(q, candidates, p=1.0)
    return torch.bmm(q, candidates.transpose(1, 2))


class _TransEL2BatchScores(torch.autograd.Function):
    """A batch's TransE-L2 scores, positive and negative, from its rows ``[anchors; trues;
    negatives]`` in one node, whose backward writes each part's gradient into its slice of one
    gradient of the rows.

    Scored part by part, the rows are split in three, and the split's backward concatenates the
    parts' gradients: a copy of every row of the batch (3,072 x 400 floats a step in the speed
    workload), and more autograd nodes, each a Python call. Here the batched products of the
    negatives' backward write into the slices directly. The arithmetic is
    :class:`_L2Distances`' for the negatives and ``vector_norm``'s for the positives (a zero
    distance passes no gradient in both).
    """

    @staticmethod
    def forward(ctx: Any, emb: torch.Tensor, rel: torch.Tensor, sign: torch.Tensor, chunk_size: int,
                negatives: int, gamma: float) -> Tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        b, d = rel.shape
        chunks = b // chunk_size
        q = torch.addcmul(emb[:b], sign, rel)
        diff = q - emb[b : 2 * b]
        norm = torch.linalg.vector_norm(diff, dim=-1)
        qc, c = q.view(chunks, chunk_size, d), emb[2 * b :].reshape(chunks, negatives, d)
        norms = (qc * qc).sum(-1).unsqueeze(2) + (c * c).sum(-1).unsqueeze(1)
        distance = torch.baddbmm(norms, qc, c.transpose(1, 2), alpha=-2.0).clamp_min_(1e-30).sqrt_()
        ctx.save_for_backward(qc, c, distance, diff, norm, sign)
        return gamma - norm, (gamma - distance).view(b, negatives)

    @staticmethod
    def backward(ctx: Any, grad_positive: torch.Tensor, grad_negative: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        qc, c, distance, diff, norm, sign = ctx.saved_tensors
        chunks, k, d = qc.shape
        b = chunks * k
        grad = torch.empty(2 * b + c.shape[0] * c.shape[1], d, dtype=qc.dtype, device=qc.device)
        # negatives: score = gamma - dist; with v = -grad / dist, dq = rowsum(v) q - v c, dc = colsum(v) c - v^T q
        v = torch.div(grad_negative.reshape(distance.shape), distance).neg_().masked_fill_(distance <= 1e-15, 0.0)
        gq = grad[:b].view(chunks, k, d)
        torch.baddbmm(qc * v.sum(2, keepdim=True), v, c, alpha=-1.0, out=gq)
        torch.baddbmm(c * v.sum(1).unsqueeze(2), v.transpose(1, 2), qc, alpha=-1.0, out=grad[2 * b :].view(c.shape))
        # positives: score = gamma - |diff|, diff = q - true: the true row takes grad / |diff| * diff
        scale = torch.div(grad_positive, norm).masked_fill_(norm == 0, 0.0).unsqueeze(1)
        grad_true = torch.mul(diff, scale, out=grad[b : 2 * b])
        grad_q = grad[:b].sub_(grad_true)
        return grad, grad_q * sign, None, None, None, None


def batch_scores(
    cfg: KGEConfig, emb: torch.Tensor, rel: torch.Tensor, sign: torch.Tensor, chunk_size: int, negatives: int
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Positive ``[b]`` and negative ``[b, m]`` scores of a batch whose rows ``emb`` are its ``b``
    anchors, its ``b`` true entities and its chunks' negatives (``m`` a chunk of ``chunk_size``
    positives); ``rel``: the ``b`` relations."""
    b = rel.shape[0]
    if cfg.model == "transe_l2":
        return _TransEL2BatchScores.apply(emb, rel, sign, chunk_size, negatives, cfg.gamma)
    anchor, true, negs = emb.split([b, b, emb.shape[0] - 2 * b])
    q = query(cfg, anchor, rel, sign)
    chunks = negs.shape[0] // negatives
    negative = score_candidates(
        cfg, q.reshape(chunks, chunk_size, cfg.dim), negs.reshape(chunks, negatives, cfg.dim)
    ).reshape(b, negatives)
    return score_pairs(cfg, q, true), negative


def score_all(cfg: KGEConfig, q: torch.Tensor, entities: torch.Tensor) -> torch.Tensor:
    """Scores of queries ``[b, d]`` against every entity ``[E, d]``: ``[b, E]`` (evaluation)."""
    return score_candidates(cfg, q.unsqueeze(0), entities.unsqueeze(0)).squeeze(0)


def kge_loss(cfg: KGEConfig, positive: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
    """Mean loss of positives ``[b]`` and their negatives ``[b, m]``."""
    if cfg.loss == "margin":
        return F.relu(cfg.margin - positive.unsqueeze(-1) + negative).mean()
    if cfg.adversarial_temperature > 0:  # self-adversarial weighting (Sun et al. 2019), no gradient
        weights = torch.softmax(negative.detach() * cfg.adversarial_temperature, dim=-1)
        neg_term = -(weights * F.logsigmoid(-negative)).sum(-1).mean()
    else:
        neg_term = -F.logsigmoid(-negative).mean()
    return (-F.logsigmoid(positive).mean() + neg_term) / 2


# ------------------------------------------------------------------------------------ batch
@dataclass
class KGBatch(Pipelineable):
    """One rank's share of a step: ``b`` positives in chunks of ``k``, each chunk with ``m`` negatives.

    ``ids`` has two features of ``n = 2b + b // k * m`` bags each, one id a bag or none. Feature
    ``"entity"`` holds, in this order, the ``b`` anchors, the ``b`` true entities of the corrupted
    side, and the chunks' negatives. Feature ``"relation"`` holds the ``b`` relations in its first
    ``b`` bags and leaves the rest empty (a KJT's features share one number of bags). ``sign`` is
    +1 when the tails are corrupted (anchor = head) and -1 when the heads are.
    """

    ids: KeyedJaggedTensor
    sign: torch.Tensor
    chunk_size: int
    negatives: int

    def to(self, device: torch.device, non_blocking: bool = False) -> "KGBatch":
        return KGBatch(
            ids=self.ids.to(device=device, non_blocking=non_blocking),
            sign=self.sign.to(device=device, non_blocking=non_blocking),
            chunk_size=self.chunk_size,
            negatives=self.negatives,
        )

    def record_stream(self, stream: torch.Stream) -> None:
        self.ids.record_stream(stream)
        self.sign.record_stream(stream)  # type: ignore[arg-type]

    def pin_memory(self) -> "KGBatch":
        return KGBatch(self.ids.pin_memory(), self.sign.pin_memory(), self.chunk_size, self.negatives)


def batch_lengths(positives: int, num_ids: int) -> torch.Tensor:
    """The lengths of a batch's two features: ``num_ids`` entity bags of one id, then ``positives``
    relation bags of one id and ``num_ids - positives`` empty ones."""
    lengths = torch.ones(2 * num_ids, dtype=torch.int32)
    lengths[num_ids + positives :] = 0
    return lengths


def make_batch(
    anchors: torch.Tensor, relations: torch.Tensor, trues: torch.Tensor, negatives: torch.Tensor, corrupt_heads: bool
) -> KGBatch:
    """A :class:`KGBatch` from ids: ``negatives`` is ``[chunks, m]`` and ``anchors`` splits evenly into chunks."""
    chunks, m = negatives.shape
    b = anchors.numel()
    if chunks == 0 or b % chunks:
        raise ValueError(f"{b} positives do not split into {chunks} chunks")
    if relations.numel() != b:
        raise ValueError(f"{relations.numel()} relations for {b} positives")
    ids = torch.cat([anchors, trues, negatives.reshape(-1), relations]).to(torch.int64)
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=[ENTITY_FEATURE, RELATION_FEATURE], values=ids, lengths=batch_lengths(b, ids.numel() - b)
    )
    sign = torch.tensor([-1.0 if corrupt_heads else 1.0])
    return KGBatch(ids=kjt, sign=sign, chunk_size=b // chunks, negatives=m)


def pack_batch(batch: KGBatch) -> torch.Tensor:
    """A batch's ids (entities, then relations) and sign in one byte buffer (8-byte aligned, the sign last).

    A DataLoader worker sends every tensor of what it returns as a shared-memory segment of its
    own, each received through a connection to the worker: one a batch instead of four (the
    KJT's lengths and offsets, the same every batch, are rebuilt on the receiving side)."""
    parts = (batch.ids.values().to(torch.int64), batch.sign.to(torch.float32))
    return torch.cat([p.contiguous().view(-1).view(torch.uint8) for p in parts])


class PackedBatches:
    """Batches of one shape as :func:`pack_batch` packed them: views of the buffer, no copy.

    The KJT's lengths and offsets are made once, page-locked if the buffers are."""

    def __init__(self, positives: int, chunk_size: int, negatives: int) -> None:
        self.num_ids = 2 * positives + positives // chunk_size * negatives
        self.positives, self.chunk_size, self.negatives = positives, chunk_size, negatives
        self._lengths = batch_lengths(positives, self.num_ids)
        self._offsets = torch.zeros(2 * self.num_ids + 1, dtype=torch.int32)
        torch.cumsum(self._lengths, 0, out=self._offsets[1:])

    def unpack(self, packed: torch.Tensor) -> KGBatch:
        if packed.is_pinned() and not self._lengths.is_pinned():
            self._lengths, self._offsets = self._lengths.pin_memory(), self._offsets.pin_memory()
        n, b = self.num_ids, self.positives
        ids_end = 8 * (n + b)
        kjt = KeyedJaggedTensor(
            keys=[ENTITY_FEATURE, RELATION_FEATURE], values=packed[:ids_end].view(torch.int64), lengths=self._lengths,
            offsets=self._offsets, stride=n, length_per_key=[n, b], offset_per_key=[0, n, n + b],
        )  # fmt: skip
        return KGBatch(
            ids=kjt,
            sign=packed[ids_end : ids_end + 4].view(torch.float32),
            chunk_size=self.chunk_size,
            negatives=self.negatives,
        )


# ------------------------------------------------------------------------------------ model
# Each table's init seed, past the run's ``--seed``: the entities draw from ``seed``, the relations from ``seed + 1``.
TABLE_SEED_OFFSETS = {ENTITY_TABLE: 0, RELATION_TABLE: 1}


def kg_tables(
    num_entities: int, num_relations: int, cfg: KGEConfig, seed: int, device: Optional[torch.device] = None
) -> EmbeddingCollection:
    """The entity and relation tables as one TorchRec EmbeddingCollection, each with the
    sharding-independent init (:data:`TABLE_SEED_OFFSETS`)."""

    def table(name: str, feature: str, rows: int) -> EmbeddingConfig:
        table_seed = seed + TABLE_SEED_OFFSETS[name]
        init_fn: Callable[[torch.Tensor], torch.Tensor] = lambda w: seeded_uniform_(w, cfg.init_bound, table_seed)  # noqa: E731
        return EmbeddingConfig(
            name=name,
            embedding_dim=cfg.dim,
            num_embeddings=rows,
            feature_names=[feature],
            weight_init_min=-cfg.init_bound,
            weight_init_max=cfg.init_bound,
            init_fn=init_fn,
        )

    return EmbeddingCollection(
        tables=[table(ENTITY_TABLE, ENTITY_FEATURE, num_entities), table(RELATION_TABLE, RELATION_FEATURE, num_relations)],
        device=device or torch.device("meta"),
    )


class KGEModel(nn.Module):
    """Entity and relation tables (TorchRec, shardable) + KGE loss.

    ``forward(batch)`` returns ``(loss, (loss, positive scores))`` as TorchRec's train pipelines
    expect of a model (they back-propagate the first element and hand back the second).
    """

    def __init__(self, tables: EmbeddingCollection, cfg: KGEConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tables = tables

    def forward(self, batch: KGBatch) -> Tuple[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
        cfg = self.cfg
        rows = self.tables(batch.ids)
        emb, rel = rows[ENTITY_FEATURE].values(), rows[RELATION_FEATURE].values()
        positive, negative = batch_scores(cfg, emb, rel, batch.sign, batch.chunk_size, batch.negatives)
        loss = kge_loss(cfg, positive, negative)
        if cfg.regularization > 0:  # L3 on the rows this step touches (DGL-KE's default norm)
            loss = loss + cfg.regularization * (
                emb.abs().pow(3).sum(-1).mean() + rel.abs().pow(3).sum(-1).mean()
            )
        return loss, (loss.detach(), positive.detach())
