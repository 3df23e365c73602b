"""KGE scores, losses, the sharding-independent init and the rank-independent sampler."""
from __future__ import annotations

import gc
import multiprocessing
import pickle

import pytest
import torch
import torch.nn.functional as F

from examples.graph.models import (
    ENTITY_FEATURE,
    ENTITY_TABLE,
    MODELS,
    RELATION_FEATURE,
    RELATION_TABLE,
    KGBatch,
    KGEConfig,
    batch_scores,
    kg_tables,
    kge_loss,
    make_batch,
    query,
    score_all,
    score_candidates,
    score_pairs,
    seeded_uniform_,
)
from examples.graph.sampler import ChunkedNegativeSampler

TAIL, HEAD = torch.ones(()), -torch.ones(())


def reference_score(cfg: KGEConfig, h: torch.Tensor, r: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """The textbook definitions, written independently of the query form."""
    if cfg.model == "transe_l1":
        return cfg.gamma - (h + r - t).abs().sum(-1)
    if cfg.model == "transe_l2":
        return cfg.gamma - (h + r - t).pow(2).sum(-1).sqrt()
    if cfg.model == "distmult":
        return (h * r * t).sum(-1)
    half = cfg.dim // 2
    c = lambda x: torch.complex(x[..., :half].double(), x[..., half:].double())  # noqa: E731
    return (c(h) * c(r) * c(t).conj()).sum(-1).real.float()


@pytest.mark.parametrize("model", MODELS)
def test_scores_match_definitions_from_both_sides(model: str) -> None:
    cfg = KGEConfig(model=model, dim=8, gamma=3.0)
    g = torch.Generator().manual_seed(0)
    h, r, t = (torch.randn(5, 8, generator=g) for _ in range(3))
    want = reference_score(cfg, h, r, t)
    torch.testing.assert_close(score_pairs(cfg, query(cfg, h, r, TAIL), t), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(score_pairs(cfg, query(cfg, t, r, HEAD), h), want, rtol=1e-5, atol=1e-5)
    # chunked candidates and the evaluation's all-entity scores agree with the pairwise form
    cands = torch.randn(7, 8, generator=g)
    q = query(cfg, h, r, TAIL)
    grid = score_candidates(cfg, q.reshape(1, 5, 8), cands.reshape(1, 7, 8)).reshape(5, 7)
    want_grid = reference_score(cfg, h[:, None], r[:, None], cands[None])
    torch.testing.assert_close(grid, want_grid, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(score_all(cfg, q, cands), want_grid, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("model", ["transe_l1", "transe_l2"])
def test_chunked_distances_differentiate_as_the_definitions(model: str) -> None:
    """TransE's chunked scores (L2's backward written out) have the gradients of the textbook
    scores on both operands, and gradcheck passes in double precision."""
    cfg = KGEConfig(model=model, dim=6, gamma=3.0)
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 3, 6, generator=g, dtype=torch.float64, requires_grad=True)
    c = torch.randn(2, 4, 6, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, 3, 4, generator=g, dtype=torch.float64)
    (score_candidates(cfg, q, c) * w).sum().backward()
    got = (q.grad, c.grad)
    q2, c2 = q.detach().clone().requires_grad_(), c.detach().clone().requires_grad_()
    zero = torch.zeros(6, dtype=torch.float64)
    (reference_score(cfg, q2[:, :, None], zero, c2[:, None]).double() * w).sum().backward()
    torch.testing.assert_close(got, (q2.grad, c2.grad))
    assert torch.autograd.gradcheck(lambda a, b: score_candidates(cfg, a, b), (q.detach().requires_grad_(), c.detach().requires_grad_()))


@pytest.mark.parametrize("sign", [TAIL, HEAD])
def test_batch_scores_are_the_parts_scores(sign: torch.Tensor) -> None:
    """TransE-L2's one-node batch scores give the values and the gradients (of the rows and the
    relations) of the scores taken part by part, and pass gradcheck in double precision."""
    cfg = KGEConfig(model="transe_l2", dim=6, gamma=3.0)
    b, k, m = 6, 3, 4
    g = torch.Generator().manual_seed(3)
    emb = torch.randn(2 * b + b // k * m, 6, generator=g, dtype=torch.float64)
    emb[b] = emb[0] + sign.double() * 0.5  # a positive at distance zero: no gradient through it
    rel = torch.full((b, 6), 0.5, dtype=torch.float64)
    rel[1:] = torch.randn(b - 1, 6, generator=g, dtype=torch.float64)
    w_pos, w_neg = torch.randn(b, generator=g, dtype=torch.float64), torch.randn(b, m, generator=g, dtype=torch.float64)

    def parts(e: torch.Tensor, r: torch.Tensor) -> tuple:
        q = query(cfg, e[:b], r, sign.double())
        negative = score_candidates(cfg, q.reshape(-1, k, 6), e[2 * b :].reshape(-1, m, 6)).reshape(b, m)
        return score_pairs(cfg, q, e[b : 2 * b]), negative

    grads = []
    for scores in (lambda e, r: batch_scores(cfg, e, r, sign.double(), k, m), parts):
        e, r = emb.clone().requires_grad_(), rel.clone().requires_grad_()
        positive, negative = scores(e, r)
        ((positive * w_pos).sum() + (negative * w_neg).sum()).backward()
        grads.append((positive.detach(), negative.detach(), e.grad, r.grad))
    torch.testing.assert_close(grads[0], grads[1])
    assert grads[0][2][b].abs().sum() == 0 < grads[0][2][0].abs().sum()  # the zero distance passes none
    emb[b] += 0.1  # gradcheck's finite differences need a distance away from zero
    assert torch.autograd.gradcheck(
        lambda e, r: batch_scores(cfg, e, r, sign.double(), k, m), (emb.requires_grad_(), rel.requires_grad_())
    )


def test_head_and_tail_forms_differ_for_asymmetric_models() -> None:
    """The sign matters: reading a TransE/ComplEx triple from the wrong side gives other scores."""
    g = torch.Generator().manual_seed(1)
    h, r, t = (torch.randn(4, 8, generator=g) for _ in range(3))
    for model in ("transe_l2", "complex"):
        cfg = KGEConfig(model=model, dim=8)
        wrong = score_pairs(cfg, query(cfg, t, r, TAIL), h)
        assert not torch.allclose(wrong, reference_score(cfg, h, r, t), atol=1e-3)


def test_losses() -> None:
    pos = torch.tensor([2.0, -1.0])
    neg = torch.tensor([[0.5, 3.0, -2.0], [1.0, 0.0, -1.0]])
    cfg = KGEConfig(loss="margin", margin=1.5)
    want = torch.clamp(1.5 - pos[:, None] + neg, min=0).mean()
    torch.testing.assert_close(kge_loss(cfg, pos, neg), want)
    cfg = KGEConfig(loss="logsigmoid")
    want = (-F.logsigmoid(pos).mean() - F.logsigmoid(-neg).mean()) / 2
    torch.testing.assert_close(kge_loss(cfg, pos, neg), want)
    cfg = KGEConfig(loss="logsigmoid", adversarial_temperature=1.0)
    w = torch.softmax(neg, dim=-1)
    want = (-F.logsigmoid(pos).mean() - (w * F.logsigmoid(-neg)).sum(-1).mean()) / 2
    torch.testing.assert_close(kge_loss(cfg, pos, neg), want)


def test_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="model"):
        KGEConfig(model="rotate")
    with pytest.raises(ValueError, match="even"):
        KGEConfig(model="complex", dim=7)
    with pytest.raises(ValueError, match="loss"):
        KGEConfig(loss="bce")


def test_seeded_init_does_not_depend_on_sharding() -> None:
    full = seeded_uniform_(torch.empty(10_000, 6), 0.5, seed=3)
    assert full.abs().max() <= 0.5 and full.std() > 0.2
    for lo, hi in [(0, 1), (4095, 4097), (5000, 10_000), (123, 8200)]:
        block = seeded_uniform_(torch.empty(hi - lo, 6), 0.5, seed=3, first_row=lo)
        assert torch.equal(block, full[lo:hi])
    assert not torch.equal(seeded_uniform_(torch.empty(10_000, 6), 0.5, seed=4), full)


def _ids(batch) -> torch.Tensor:  # type: ignore[no-untyped-def]
    return batch.ids[ENTITY_FEATURE].values()


def _relations(batch) -> torch.Tensor:  # type: ignore[no-untyped-def]
    return batch.ids[RELATION_FEATURE].values()


def test_sampler_is_independent_of_world_size() -> None:
    g = torch.Generator().manual_seed(0)
    train = torch.stack([torch.randint(0, 50, (300,), generator=g), torch.randint(0, 4, (300,), generator=g), torch.randint(0, 50, (300,), generator=g)], 1)
    one = ChunkedNegativeSampler(train, 50, batch_size=64, chunk_size=8, negatives=5, world_size=1, seed=1)
    two = ChunkedNegativeSampler(train, 50, batch_size=64, chunk_size=8, negatives=5, world_size=2, seed=1)
    for step in (0, 1, 4, 9):
        b1 = one.rank_batch(step, 0)
        parts = [two.rank_batch(step, r) for r in range(2)]
        n = 64
        ids1 = _ids(b1)
        anchors = torch.cat([_ids(p)[:32] for p in parts])
        trues = torch.cat([_ids(p)[32:64] for p in parts])
        negs = torch.cat([_ids(p)[64:] for p in parts])
        assert torch.equal(ids1[:n], anchors) and torch.equal(ids1[n : 2 * n], trues) and torch.equal(ids1[2 * n :], negs)
        assert torch.equal(_relations(b1), torch.cat([_relations(p) for p in parts]))
        assert float(b1.sign) == (-1.0 if step % 2 else 1.0) == float(parts[1].sign)
        assert b1.chunk_size == parts[0].chunk_size == 8 and negs.numel() == 8 * 5
    # an epoch visits every training triple once
    epoch = torch.cat([one.global_positions(s) for s in range(5)])[:300]
    assert torch.equal(epoch.sort().values, torch.arange(300))


def test_sampler_positions_are_the_epochs_permutations_in_order() -> None:
    """Step s trains positions s*B .. (s+1)*B - 1 of the epochs' permutations laid end to end:
    a slice within an epoch, pieces of two across an epoch's end (300 triples, 64 a step)."""
    train = torch.zeros(300, 3, dtype=torch.int64)
    sampler = ChunkedNegativeSampler(train, 5, batch_size=64, chunk_size=8, negatives=2, world_size=2, seed=3)
    laid = torch.cat([sampler.permutation(e) for e in range(3)])
    for step in (0, 3, 4, 5, 9):  # 4 crosses epoch 0's end, 9 epoch 1's
        assert torch.equal(sampler.global_positions(step), laid[64 * step : 64 * (step + 1)])


def test_sampler_rejects_uneven_split() -> None:
    train = torch.zeros(10, 3, dtype=torch.int64)
    with pytest.raises(ValueError, match="multiple of 16"):
        ChunkedNegativeSampler(train, 5, batch_size=24, chunk_size=8, negatives=2, world_size=2)


def assert_same_batch(a: KGBatch, b: KGBatch) -> None:
    assert a.ids.keys() == b.ids.keys() and a.ids.stride() == b.ids.stride()
    assert a.ids.length_per_key() == b.ids.length_per_key() and a.ids.offset_per_key() == b.ids.offset_per_key()
    for x, y in (
        (a.ids.values(), b.ids.values()),
        (a.ids.lengths(), b.ids.lengths()),
        (a.ids.offsets(), b.ids.offsets()),
        (a.sign, b.sign),
    ):
        assert x.dtype == y.dtype and torch.equal(x, y)
    assert (a.chunk_size, a.negatives) == (b.chunk_size, b.negatives)


def test_loader_workers_make_the_training_threads_batches() -> None:
    """DataLoader workers (the example's --loader-workers) make the batches the training thread
    makes, in order, from a start offset (a resumed run) and across an epoch's end; they draw no
    number from the global RNG, need only a picklable sampler, and end with the iterator."""
    g = torch.Generator().manual_seed(0)
    train = torch.stack([torch.randint(0, 50, (300,), generator=g), torch.randint(0, 4, (300,), generator=g), torch.randint(0, 50, (300,), generator=g)], 1)
    sampler = ChunkedNegativeSampler(train, 50, batch_size=64, chunk_size=8, negatives=5, world_size=2, seed=1)
    inline = list(sampler.batches(1, 7, start=3))  # steps 3..9: epochs 0, 1 and 2 (300 triples, 64 a step)
    children = set(multiprocessing.active_children())
    rng = torch.random.get_rng_state()
    made = list(sampler.batches(1, 7, start=3, workers=2))
    assert torch.equal(torch.random.get_rng_state(), rng)
    assert set(multiprocessing.active_children()) == children
    assert len(made) == len(inline) == 7
    copy = pickle.loads(pickle.dumps(sampler))  # what a spawned or forkserver worker gets
    for step, (a, b) in enumerate(zip(inline, made), start=3):
        assert_same_batch(a, b)
        assert_same_batch(a, copy.rank_batch(step, 1))
    assert float(made[0].sign) == -1.0 and float(made[1].sign) == 1.0  # step 3 corrupts heads
    for b in made:  # each sent as one buffer: the ids and the sign are views of it
        assert b.ids.values().untyped_storage().data_ptr() == b.sign.untyped_storage().data_ptr()
    partial = sampler.batches(1, 7, start=3, workers=1)
    assert_same_batch(next(partial), inline[0])
    del partial  # as train.py ends: its workers stop
    gc.collect()
    assert set(multiprocessing.active_children()) == children


def test_a_batch_holds_its_relations_in_the_first_bags_of_their_feature() -> None:
    """The relation feature's first b bags hold the positives' relations, one each, the rest are
    empty: the tables' lookup returns the b relation rows in the positives' order."""
    anchors, relations, trues = torch.tensor([3, 4, 5, 6]), torch.tensor([2, 0, 2, 1]), torch.tensor([7, 8, 9, 1])
    negatives = torch.tensor([[10, 11, 12], [13, 14, 15]])
    batch = make_batch(anchors, relations, trues, negatives, corrupt_heads=True)
    n = 4 + 4 + 6
    assert batch.ids.keys() == [ENTITY_FEATURE, RELATION_FEATURE] and batch.ids.stride() == n
    assert torch.equal(_ids(batch), torch.cat([anchors, trues, negatives.reshape(-1)]))
    assert torch.equal(_relations(batch), relations)
    assert batch.ids[RELATION_FEATURE].lengths().tolist() == [1] * 4 + [0] * (n - 4)
    assert (batch.chunk_size, batch.negatives, float(batch.sign)) == (2, 3, -1.0)
    with pytest.raises(ValueError, match="3 relations for 4 positives"):
        make_batch(anchors, relations[:3], trues, negatives, corrupt_heads=False)
    cfg = KGEConfig(model="transe_l2", dim=4)
    tables = kg_tables(20, 3, cfg, seed=5, device=torch.device("cpu"))
    rows = tables(batch.ids)
    relation_weight = tables.embeddings[RELATION_TABLE].weight
    assert torch.equal(rows[RELATION_FEATURE].values(), relation_weight[relations])
    assert torch.equal(relation_weight, seeded_uniform_(torch.empty(3, 4), cfg.init_bound, seed=6))
    assert torch.equal(tables.embeddings[ENTITY_TABLE].weight, seeded_uniform_(torch.empty(20, 4), cfg.init_bound, seed=5))


def test_presample_counts_both_tables() -> None:
    g = torch.Generator().manual_seed(0)
    train = torch.stack([torch.randint(0, 50, (300,), generator=g), torch.randint(0, 9, (300,), generator=g), torch.randint(0, 50, (300,), generator=g)], 1)
    sampler = ChunkedNegativeSampler(train, 50, batch_size=64, chunk_size=8, negatives=5, world_size=2, seed=1)
    counts = sampler.presample_counts(1, 3, num_relations=9)
    batches = [sampler.rank_batch(step, 1) for step in range(3)]
    assert torch.equal(counts[ENTITY_TABLE], torch.bincount(torch.cat([_ids(b) for b in batches]), minlength=50))
    assert torch.equal(counts[RELATION_TABLE], torch.bincount(torch.cat([_relations(b) for b in batches]), minlength=9))
