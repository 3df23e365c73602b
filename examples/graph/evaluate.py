"""Filtered link-prediction ranking against every entity (the standard KG-embedding protocol).

For each test triple (h, r, t) the model scores every entity as the tail of (h, r, ?) and every
entity as the head of (?, r, t); the true answer's rank among the candidates is recorded, 2N ranks
in all (tail predictions, then head predictions). *Filtered*: candidates that form another known
triple (any split) are correct answers too, so their scores are set to -inf (in a copy) before
ranking, and they are never counted as ties; the true answer's own score is never masked.

Rank convention: the *realistic* rank (pykeen's default), the mean of the optimistic rank
``1 + #{score > true}`` and the pessimistic rank ``1 + #{score >= true, other than the answer}``.
Ties thus cost half a place each: a model scoring everything equal gets ``(E + 1) / 2`` rather than
1 (optimistic, which rewards constant scores) or E (pessimistic). Realistic ranks are multiples of
1/2, so Hits@k counts ``rank <= k``: a two-way tie for first (rank 1.5) is not a Hit@1.

Everything is vectorised torch and device-agnostic: scores may come back on CUDA; masks are moved
to the scores' device.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

import torch

ScoreFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

# Filtered test MRR published for the small KGs, as Lin, Socher and Xiong (EMNLP 2018, "Multi-Hop
# Knowledge Graph Reasoning with Reward Shaping", Table 3) report them for DistMult, ComplEx and
# ConvE. Their splits are the UMLS and Kinship splits of Das et al. (2018), which may differ from
# pykeen's; the span of these numbers is a sanity range, not a replication target.
PUBLISHED_MRR: Dict[str, Dict[str, float]] = {
    "umls": {"distmult": 0.868, "complex": 0.934, "conve": 0.957},
    "kinships": {"distmult": 0.614, "complex": 0.884, "conve": 0.871},
}


def published_range(dataset: str) -> Tuple[float, float]:
    """(lowest, highest) published filtered MRR of ``dataset`` in :data:`PUBLISHED_MRR`."""
    values = PUBLISHED_MRR[dataset].values()
    return min(values), max(values)


class FilteredRanker:
    """Index of known triples answering "which other entities are true answers to this query?".

    Two sorted int64 key arrays: ``h * R + r`` (with the tails of each key alongside, for tail
    prediction) and ``r * E + t`` (with the heads, for head prediction). A batch of queries is
    answered with two ``searchsorted`` calls and ``repeat_interleave``, no loop per query.

    Args:
        known: int64 ``[M, 3]`` (head, relation, tail) triples, typically ``KGData.known``.
            Duplicates are harmless.
        num_entities: E, the number of candidate entities (columns of the score matrices).
        num_relations: R (default: the largest relation id in ``known`` plus one).
    """

    def __init__(self, known: torch.Tensor, num_entities: int, num_relations: Optional[int] = None) -> None:
        if known.dim() != 2 or known.shape[1] != 3:
            raise ValueError(f"known must be [M, 3] (head, relation, tail) triples, got {list(known.shape)}")
        known = known.to(torch.int64)
        m = known.shape[0]
        if num_relations is None:
            num_relations = int(known[:, 1].max()) + 1 if m else 1
        self.num_entities, self.num_relations = int(num_entities), int(num_relations)
        _check_ids("known", known[:, 0], known[:, 1], known[:, 2], self.num_entities, self.num_relations)
        h, r, t = known.unbind(1)
        self._hr_keys, self._hr_tails = _sorted_index(h * self.num_relations + r, t)
        self._rt_keys, self._rt_heads = _sorted_index(r * self.num_entities + t, h)

    @property
    def device(self) -> torch.device:
        return self._hr_keys.device

    def to(self, device: torch.device | str) -> "FilteredRanker":
        """The same index on ``device`` (a new ranker; this one is unchanged)."""
        out = object.__new__(FilteredRanker)
        out.num_entities, out.num_relations = self.num_entities, self.num_relations
        for k in ("_hr_keys", "_hr_tails", "_rt_keys", "_rt_heads"):
            setattr(out, k, getattr(self, k).to(device))
        return out

    def tail_filter(
        self, h: torch.Tensor, r: torch.Tensor, t: Optional[torch.Tensor] = None
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """(row, column) of every known tail of query ``(h[row], r[row], ?)``, except ``t[row]``
        (the query's own answer) when ``t`` is given. int64 ``[K]`` each, on the ranker's device."""
        h, r = h.to(self.device, torch.int64), r.to(self.device, torch.int64)
        _check_ids("tail query", h, r, None, self.num_entities, self.num_relations)
        return _lookup(self._hr_keys, self._hr_tails, h * self.num_relations + r, t)

    def head_filter(
        self, r: torch.Tensor, t: torch.Tensor, h: Optional[torch.Tensor] = None
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """(row, column) of every known head of query ``(?, r[row], t[row])``, except ``h[row]``."""
        r, t = r.to(self.device, torch.int64), t.to(self.device, torch.int64)
        _check_ids("head query", None, r, t, self.num_entities, self.num_relations)
        return _lookup(self._rt_keys, self._rt_heads, r * self.num_entities + t, h)


def _check_ids(
    what: str,
    h: Optional[torch.Tensor],
    r: Optional[torch.Tensor],
    t: Optional[torch.Tensor],
    num_entities: int,
    num_relations: int,
) -> None:
    for col, v, hi in (("head", h, num_entities), ("relation", r, num_relations), ("tail", t, num_entities)):
        if v is None or v.numel() == 0:
            continue
        bad = torch.nonzero((v < 0) | (v >= hi)).flatten()
        if bad.numel():
            i = int(bad[0])
            raise ValueError(f"{what}: {col} id {int(v[i])} at row {i} is out of range [0, {hi})")


def _sorted_index(keys: torch.Tensor, values: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    order = torch.argsort(keys, stable=True)
    return keys[order].contiguous(), values[order].contiguous()


def _lookup(
    keys: torch.Tensor, values: torch.Tensor, query: torch.Tensor, exclude: Optional[torch.Tensor]
) -> Tuple[torch.Tensor, torch.Tensor]:
    # (index_select rather than advanced indexing: the latter is many times slower on CPU)
    lo = torch.searchsorted(keys, query)
    counts = torch.searchsorted(keys, query, right=True) - lo
    rows = torch.repeat_interleave(torch.arange(query.numel(), device=query.device), counts)
    # output slot j of query i reads keys position lo[i] + (j - first slot of i)
    shift = lo - (torch.cumsum(counts, 0) - counts)
    pos = torch.arange(rows.numel(), device=query.device) + torch.repeat_interleave(shift, counts)
    cols = values.index_select(0, pos)
    if exclude is not None:
        keep = torch.nonzero(cols != exclude.to(query.device, torch.int64).index_select(0, rows)).squeeze(1)
        rows, cols = rows.index_select(0, keep), cols.index_select(0, keep)
    return rows, cols


def _realistic_ranks(scores: torch.Tensor, target: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """Ranks of ``scores[i, target[i]]`` in row i, with the ``(rows, cols)`` entries set to -inf
    (in a copy). Masked entries never tie with the answer, even when its own score is -inf."""
    b, e = scores.shape
    true = scores.gather(1, target.unsqueeze(1))
    flat = rows * e + cols
    masked = scores.clone()
    masked.view(-1).index_fill_(0, flat, float("-inf"))
    optimistic = 1 + (masked > true).sum(1, dtype=torch.int32)
    pessimistic = (masked >= true).sum(1, dtype=torch.int32)  # counts the answer itself
    minus_inf = torch.isneginf(true.squeeze(1))
    if bool(minus_inf.any()):  # rare: do not count the masked -inf entries as ties
        live = torch.ones_like(scores, dtype=torch.bool)
        live.view(-1).index_fill_(0, flat, False)
        exact = ((masked >= true) & live).sum(1, dtype=torch.int32)
        pessimistic = torch.where(minus_inf, exact, pessimistic)
    return (optimistic.to(torch.float64) + pessimistic.to(torch.float64)) / 2


def filtered_ranks(
    score_tails: ScoreFn,
    score_heads: ScoreFn,
    test: torch.Tensor,
    ranker: FilteredRanker,
    batch_size: int = 1024,
) -> torch.Tensor:
    """Filtered realistic ranks of the 2N predictions of ``test`` (int64 ``[N, 3]``).

    ``score_tails(h, r)`` returns ``[b, E]`` scores of every entity as tail of ``(h, r)``,
    ``score_heads(r, t)`` ``[b, E]`` scores of every entity as head of ``(r, t)``; higher is more
    plausible. Query ids are passed on ``test``'s device. Scores are computed under ``no_grad``
    and not modified in place. Returns float64 ``[2N]``: N tail ranks then N head ranks, on the
    scores' device. NaN scores raise ``ValueError`` naming the test row.
    """
    if test.dim() != 2 or test.shape[1] != 3:
        raise ValueError(f"test must be [N, 3] (head, relation, tail) triples, got {list(test.shape)}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    test = test.to(torch.int64)
    e = ranker.num_entities
    _check_ids("test", test[:, 0], test[:, 1], test[:, 2], e, ranker.num_relations)
    out = []
    with torch.no_grad():
        for side in ("tail", "head"):
            for start in range(0, test.shape[0], batch_size):
                h, r, t = test[start : start + batch_size].unbind(1)
                if side == "tail":
                    scores, target = score_tails(h, r), t
                    rows, cols = ranker.tail_filter(h, r, t)
                else:
                    scores, target = score_heads(r, t), h
                    rows, cols = ranker.head_filter(r, t, h)
                if scores.shape != (h.shape[0], e):
                    raise ValueError(
                        f"score_{side}s returned {list(scores.shape)} for {h.shape[0]} queries; expected "
                        f"[{h.shape[0]}, {e}] (one score per entity)"
                    )
                nan = torch.isnan(scores.sum(1))  # cheap screen; inf - inf rows are checked exactly
                if bool(nan.any()):
                    nan = torch.isnan(scores).any(1)
                if bool(nan.any()):
                    i = int(torch.nonzero(nan)[0])
                    raise ValueError(
                        f"score_{side}s returned NaN for test row {start + i} "
                        f"{tuple(int(x) for x in test[start + i])} ({int(nan.sum())} rows with NaN in this batch)"
                    )
                dev = scores.device
                out.append(_realistic_ranks(scores, target.to(dev), rows.to(dev), cols.to(dev)))
    if not out:
        return torch.empty(0, dtype=torch.float64)
    return torch.cat(out)


def ranking_metrics(ranks: torch.Tensor) -> Dict[str, float]:
    """``mrr`` (mean reciprocal rank), ``hits_at_{1,3,10}`` (fraction of ranks <= k), ``mean_rank``
    and ``count`` of a 1-D tensor of (realistic) ranks."""
    ranks = ranks.reshape(-1).to(torch.float64)
    if ranks.numel() == 0:
        raise ValueError("no ranks: the test split is empty")
    if bool(torch.isnan(ranks).any()) or bool((ranks < 1).any()):
        raise ValueError(f"ranks must be >= 1 and not NaN, got min {float(ranks.min())}")
    return {
        "mrr": float((1.0 / ranks).mean()),
        "hits_at_1": float((ranks <= 1).to(torch.float64).mean()),
        "hits_at_3": float((ranks <= 3).to(torch.float64).mean()),
        "hits_at_10": float((ranks <= 10).to(torch.float64).mean()),
        "mean_rank": float(ranks.mean()),
        "count": int(ranks.numel()),
    }


__all__ = ["PUBLISHED_MRR", "FilteredRanker", "filtered_ranks", "published_range", "ranking_metrics"]
