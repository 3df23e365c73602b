"""examples/graph/evaluate.py: filtered realistic ranks against a brute-force Python reference."""
from __future__ import annotations

import os
import sys
from typing import List, Set, Tuple

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from examples.graph.evaluate import FilteredRanker, filtered_ranks, ranking_metrics  # noqa: E402

Triple = Tuple[int, int, int]


def random_kg(seed: int, e: int = 12, r: int = 3, m: int = 70, n_test: int = 15):
    """Known triples (distinct, plus some duplicates) and a test subset; integer score tables with
    many ties and some -inf, indexed [h, r, :] for tails and [r, t, :] for heads."""
    g = torch.Generator().manual_seed(seed)
    known = torch.unique(torch.stack([torch.randint(0, e, (m,), generator=g), torch.randint(0, r, (m,), generator=g),
                                      torch.randint(0, e, (m,), generator=g)], 1), dim=0)
    known = known[torch.randperm(len(known), generator=g)]
    test = known[:n_test].clone()
    known = torch.cat([known, known[:5]])  # duplicates must be harmless
    tail_table = torch.randint(0, 4, (e, r, e), generator=g).to(torch.float32)
    head_table = torch.randint(0, 4, (r, e, e), generator=g).to(torch.float32)
    tail_table[torch.rand(e, r, e, generator=g) < 0.1] = float("-inf")
    head_table[torch.rand(r, e, e, generator=g) < 0.1] = float("-inf")
    return known, test, tail_table, head_table


def reference_ranks(known: Set[Triple], test: List[Triple], tail_table, head_table, e: int) -> List[float]:
    """Per test triple: drop other known answers, then (optimistic + pessimistic) / 2."""
    out = []
    for side in ("tail", "head"):
        for h, r, t in test:
            scores = tail_table[h, r].tolist() if side == "tail" else head_table[r, t].tolist()
            ans = t if side == "tail" else h
            true = scores[ans]
            gt = ge = 0
            for c in range(e):
                if c == ans:
                    continue
                if (side == "tail" and (h, r, c) in known) or (side == "head" and (c, r, t) in known):
                    continue
                gt += scores[c] > true
                ge += scores[c] >= true
            out.append(((1 + gt) + (1 + ge)) / 2)
    return out


def run(known, test, tail_table, head_table, e, r, batch_size):
    ranker = FilteredRanker(known, e, r)
    return filtered_ranks(
        lambda h, rr: tail_table[h, rr], lambda rr, t: head_table[rr, t], test, ranker, batch_size=batch_size
    )


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("batch_size", [1, 4, 1024])
def test_filtered_ranks_match_brute_force(seed, batch_size):
    e, r = 12, 3
    known, test, tt, ht = random_kg(seed, e, r)
    ranks = run(known, test, tt, ht, e, r, batch_size)
    ref = reference_ranks(set(map(tuple, known.tolist())), list(map(tuple, test.tolist())), tt, ht, e)
    assert ranks.dtype == torch.float64 and ranks.shape == (2 * len(test),)
    assert ranks.tolist() == ref


def test_unfiltered_ranking_differs():
    e, r = 12, 3
    known, test, tt, ht = random_kg(0, e, r, m=120)
    filtered = run(known, test, tt, ht, e, r, 8)
    unfiltered = run(torch.empty(0, 3, dtype=torch.int64), test, tt, ht, e, r, 8)
    assert unfiltered.tolist() == reference_ranks(set(), list(map(tuple, test.tolist())), tt, ht, e)
    assert not torch.equal(filtered, unfiltered)
    assert bool((filtered <= unfiltered).all())  # filtering only removes competitors


def test_true_answer_is_never_masked():
    # every entity is a known tail of (0, 0, ?): filtered, each test answer ranks alone (rank 1)
    e = 6
    known = torch.tensor([[0, 0, t] for t in range(e)])
    scores = torch.arange(e, dtype=torch.float32).flip(0)  # entity 0 best
    ranks = filtered_ranks(
        lambda h, r: scores.expand(len(h), e), lambda r, t: scores.expand(len(r), e), known, FilteredRanker(known, e, 1)
    )
    assert ranks[:e].tolist() == [1.0] * e
    # heads: the only known head of (?, 0, t) is 0, which scores best
    assert ranks[e:].tolist() == [1.0] * e


def test_realistic_rank_of_ties():
    e = 5
    test = torch.tensor([[0, 0, 2]])
    flat = torch.zeros(1, e)
    ranks = filtered_ranks(lambda h, r: flat, lambda r, t: flat, test, FilteredRanker(test, e, 1))
    assert ranks.tolist() == [3.0, 3.0]  # (1 + 5) / 2: all five tied
    ranking = ranking_metrics(ranks)
    assert ranking["mean_rank"] == 3.0 and ranking["hits_at_1"] == 0.0 and ranking["hits_at_3"] == 1.0


def test_filter_positions():
    known = torch.tensor([[0, 0, 1], [0, 0, 2], [0, 1, 3], [4, 0, 2], [0, 0, 2]])
    ranker = FilteredRanker(known, 5, 2)
    rows, cols = ranker.tail_filter(torch.tensor([0, 1, 0]), torch.tensor([0, 0, 1]), torch.tensor([1, 1, 3]))
    assert sorted(zip(rows.tolist(), cols.tolist())) == [(0, 2), (0, 2)]
    rows, cols = ranker.head_filter(torch.tensor([0, 0]), torch.tensor([2, 1]), torch.tensor([0, 0]))
    assert sorted(zip(rows.tolist(), cols.tolist())) == [(0, 4)]
    rows, cols = ranker.head_filter(torch.tensor([0]), torch.tensor([2]))
    assert sorted(cols.tolist()) == [0, 0, 4]
    with pytest.raises(ValueError, match=r"relation id 2 at row 0 is out of range \[0, 2\)"):
        ranker.tail_filter(torch.tensor([0]), torch.tensor([2]))


def test_nan_and_shape_errors():
    e = 4
    test = torch.tensor([[0, 0, 1], [1, 0, 2]])
    ranker = FilteredRanker(test, e, 1)
    nan = torch.zeros(2, e)
    nan[1, 3] = float("nan")
    ok = lambda a, b: torch.zeros(len(a), e)  # noqa: E731
    with pytest.raises(ValueError, match=r"score_tails returned NaN for test row 1 \(1, 0, 2\)"):
        filtered_ranks(lambda h, r: nan, ok, test, ranker)
    with pytest.raises(ValueError, match=r"score_heads returned \[2, 3\] for 2 queries; expected \[2, 4\]"):
        filtered_ranks(ok, lambda r, t: torch.zeros(2, 3), test, ranker)
    with pytest.raises(ValueError, match=r"test: tail id 9"):
        filtered_ranks(ok, ok, torch.tensor([[0, 0, 9]]), ranker)


def test_scores_are_not_modified():
    known, test, tt, ht = random_kg(3)
    before = tt.clone()
    run(known, test, tt, ht, 12, 3, 4)
    assert torch.equal(tt, before)


def test_ranking_metrics():
    m = ranking_metrics(torch.tensor([1.0, 2.0, 3.5, 10.0, 20.0]))
    assert m["count"] == 5
    assert m["mrr"] == pytest.approx((1 + 1 / 2 + 1 / 3.5 + 1 / 10 + 1 / 20) / 5)
    assert (m["hits_at_1"], m["hits_at_3"], m["hits_at_10"]) == (0.2, 0.4, 0.8)
    assert m["mean_rank"] == pytest.approx(36.5 / 5)
    with pytest.raises(ValueError, match="no ranks"):
        ranking_metrics(torch.empty(0))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_scores_match_cpu():
    known, test, tt, ht = random_kg(1)
    cpu = run(known, test, tt, ht, 12, 3, 4)
    ranker = FilteredRanker(known, 12, 3).to("cuda")
    gpu = filtered_ranks(lambda h, r: tt.cuda()[h.cuda(), r.cuda()], lambda r, t: ht.cuda()[r.cuda(), t.cuda()],
                         test.cuda(), ranker, batch_size=4)
    assert gpu.device.type == "cuda" and torch.equal(gpu.cpu(), cpu)
