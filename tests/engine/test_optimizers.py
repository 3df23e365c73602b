"""Row optimizers against FBGEMM's fused CPU kernel (sgd, rowwise_adagrad, adagrad) and torch.optim (adam;
FBGEMM's CPU build has no Adam kernel)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from torchrec_frugal.config import OptimizerSpec
from torchrec_frugal.engine.optimizers import apply_update, state_width, update_rows

fbgemm = pytest.importorskip("fbgemm_gpu.split_table_batched_embeddings_ops_training")
from fbgemm_gpu.split_embedding_configs import EmbOptimType as OptimType  # noqa: E402
from fbgemm_gpu.split_table_batched_embeddings_ops_common import (  # noqa: E402
    ComputeDevice,
    EmbeddingLocation,
    PoolingMode,
)

TABLES = [(23, 8), (11, 4)]  # (rows, dim); few rows so that every batch has many duplicates
BATCH = 6


def _batches(steps: int, seed: int):
    """Per step: (indices, offsets, bag_ids, R) for a TBE over TABLES, with duplicate ids in a bag and across bags."""
    rng = np.random.default_rng(seed)
    out = []
    dsum = sum(d for _, d in TABLES)
    for _ in range(steps):
        idx, lens = [], []
        for rows, _ in TABLES:
            hot = rng.integers(0, rows, size=3)  # a few hot rows so duplicates are certain
            for _b in range(BATCH):
                n = int(rng.integers(1, 6))
                ids = np.where(rng.random(n) < 0.6, rng.choice(hot, size=n), rng.integers(0, rows, size=n))
                idx.append(ids)
                lens.append(n)
        indices = torch.from_numpy(np.concatenate(idx).astype(np.int64))
        offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lens)]).astype(np.int64))
        R = torch.from_numpy(rng.standard_normal((BATCH, dsum)).astype(np.float32))
        out.append((indices, offsets, R))
    return out


def _row_grads(indices, offsets, R):
    """Per table: (unique rows, G) with G[row] = sum over occurrences of d loss / d pooled bag (float64)."""
    res = []
    col = 0
    for t, (rows, dim) in enumerate(TABLES):
        G = torch.zeros(rows, dim, dtype=torch.float64)
        seen = torch.zeros(rows, dtype=torch.bool)
        for b in range(BATCH):
            bag = t * BATCH + b
            ids = indices[offsets[bag] : offsets[bag + 1]]
            for i in ids.tolist():
                G[i] += R[b, col : col + dim].double()
                seen[i] = True
        u = torch.nonzero(seen).flatten()
        res.append((u, G[u].float()))
        col += dim
    return res


def _fbgemm_tbe(kind: OptimType, lr: float, eps: float, init):
    emb = fbgemm.SplitTableBatchedEmbeddingBagsCodegen(
        [(rows, dim, EmbeddingLocation.HOST, ComputeDevice.CPU) for rows, dim in TABLES],
        optimizer=kind,
        learning_rate=lr,
        eps=eps,
        pooling_mode=PoolingMode.SUM,
    )
    for w, w0 in zip(emb.split_embedding_weights(), init):
        w.copy_(w0)
    return emb


def _close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-7, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize(
    "kind,fb_kind,lr",
    [
        ("sgd", OptimType.EXACT_SGD, 0.05),
        ("rowwise_adagrad", OptimType.EXACT_ROWWISE_ADAGRAD, 0.1),
        ("adagrad", OptimType.EXACT_ADAGRAD, 0.1),
    ],
)
def test_matches_fbgemm_cpu_kernel(kind, fb_kind, lr):
    eps = 1e-8
    gen = torch.Generator().manual_seed(7)
    init = [torch.rand(rows, dim, generator=gen) * 2 - 1 for rows, dim in TABLES]
    emb = _fbgemm_tbe(fb_kind, lr, eps, init)
    spec = OptimizerSpec(kind=kind, lr=lr, eps=eps)
    ours_w = [w.clone() for w in init]
    ours_s = [torch.zeros(rows, state_width(spec, dim)) for rows, dim in TABLES]

    steps = _batches(6, seed=3)
    total_dups = 0
    for step, (indices, offsets, R) in enumerate(steps):
        if step == 3:  # a learning-rate change takes effect at the next update (OptimizerSpec is mutable)
            spec.lr = lr / 2
            emb.set_learning_rate(lr / 2)
        out = emb(indices, offsets)
        (out * R).sum().backward()

        total_dups += indices.numel() - sum(u.numel() for u, _ in _row_grads(indices, offsets, R))
        for t, (u, G) in enumerate(_row_grads(indices, offsets, R)):
            w = ours_w[t][u]
            s = ours_s[t][u]
            apply_update(spec, w, s, G, step)
            ours_w[t][u] = w
            ours_s[t][u] = s

        for t, fw in enumerate(emb.split_embedding_weights()):
            _close(ours_w[t], fw, f"{kind} weights, table {t}, step {step}")
        if kind != "sgd":  # row-wise: one column [rows]; element-wise: [rows, dim]
            for t, st in enumerate(emb.split_optimizer_states()):
                _close(ours_s[t].reshape(st[0].shape), st[0], f"{kind} momentum, table {t}, step {step}")
    assert total_dups > 20, "the batches must contain duplicate ids"
    # The run must have moved the weights (otherwise the comparison proves nothing).
    assert not torch.allclose(ours_w[0], init[0])


def test_rowwise_adagrad_uses_mean_not_sum():
    """One row, hand-computed: m += mean(G^2); w -= lr * G / (sqrt(m) + eps)."""
    spec = OptimizerSpec(kind="rowwise_adagrad", lr=0.5, eps=1e-8)
    w = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    s = torch.tensor([[0.25]])
    g = torch.tensor([[1.0, -2.0, 0.5, 0.0]])
    apply_update(spec, w, s, g, iteration=0)
    m = 0.25 + (1 + 4 + 0.25 + 0) / 4
    assert s[0, 0].item() == pytest.approx(m, rel=1e-7)
    expect = [x - 0.5 * gi / (math.sqrt(m) + 1e-8) for x, gi in zip([1.0, 2.0, 3.0, 4.0], [1.0, -2.0, 0.5, 0.0])]
    assert w[0].tolist() == pytest.approx(expect, rel=1e-6)


def test_state_width():
    for d in (1, 4, 128):
        assert state_width(OptimizerSpec(kind="sgd"), d) == 0
        assert state_width(OptimizerSpec(kind="rowwise_adagrad"), d) == 1
        assert state_width(OptimizerSpec(kind="adagrad"), d) == d
        assert state_width(OptimizerSpec(kind="adam"), d) == 2 * d


def _adam_by_hand(w, grads, lr, b1, b2, eps, wd, first_step):
    """float64 reference: per-element moments, bias correction t = step + 1, decoupled weight decay."""
    w = list(w)
    d = len(w)
    m, v = [0.0] * d, [0.0] * d
    for k, g in enumerate(grads):
        t = first_step + k + 1
        for i in range(d):
            m[i] = b1 * m[i] + (1 - b1) * g[i]
            v[i] = b2 * v[i] + (1 - b2) * g[i] ** 2
            w[i] *= 1 - lr * wd
            w[i] -= lr * (m[i] / (1 - b1**t)) / (math.sqrt(v[i] / (1 - b2**t)) + eps)
    return w, m, v


@pytest.mark.parametrize("wd", [0.0, 0.1])
@pytest.mark.parametrize("first_step", [0, 5])
def test_adam_by_hand(wd, first_step):
    lr, b1, b2, eps = 0.01, 0.8, 0.95, 1e-6
    spec = OptimizerSpec(kind="adam", lr=lr, beta1=b1, beta2=b2, eps=eps, weight_decay=wd)
    rng = np.random.default_rng(11)
    d = 5
    w0 = rng.standard_normal(d).tolist()
    grads = rng.standard_normal((4, d)).tolist()
    w = torch.tensor([w0], dtype=torch.float32)
    s = torch.zeros(1, state_width(spec, d))
    for k, g in enumerate(grads):
        apply_update(spec, w, s, torch.tensor([g], dtype=torch.float32), first_step + k)
    ew, em, ev = _adam_by_hand(w0, grads, lr, b1, b2, eps, wd, first_step)
    assert w[0].tolist() == pytest.approx(ew, rel=1e-5, abs=1e-7)
    assert s[0, :d].tolist() == pytest.approx(em, rel=1e-5, abs=1e-8)  # m first ...
    assert s[0, d:].tolist() == pytest.approx(ev, rel=1e-5, abs=1e-8)  # ... then v


@pytest.mark.parametrize("wd", [0.0, 0.05])
def test_adam_matches_torch_optim(wd):
    """A row updated at every step from step 0 sees the same t as torch.optim.Adam/AdamW's per-param count."""
    lr, b1, b2, eps = 0.02, 0.9, 0.999, 1e-8
    spec = OptimizerSpec(kind="adam", lr=lr, beta1=b1, beta2=b2, eps=eps, weight_decay=wd)
    gen = torch.Generator().manual_seed(5)
    w0 = torch.randn(3, 6, generator=gen)
    grads = [torch.randn(3, 6, generator=gen) for _ in range(8)]

    p = torch.nn.Parameter(w0.clone())
    opt_cls = torch.optim.Adam if wd == 0.0 else torch.optim.AdamW  # AdamW = decoupled weight decay
    opt = opt_cls([p], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    w = w0.clone()
    s = torch.zeros(3, state_width(spec, 6))
    for step, g in enumerate(grads):
        p.grad = g.clone()
        opt.step()
        apply_update(spec, w, s, g, step)
    torch.testing.assert_close(w, p.detach(), rtol=1e-5, atol=1e-7)
    st = opt.state[p]
    torch.testing.assert_close(s[:, :6], st["exp_avg"], rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(s[:, 6:], st["exp_avg_sq"], rtol=1e-6, atol=1e-10)


@pytest.mark.parametrize("kind", ["sgd", "rowwise_adagrad", "adagrad", "adam"])
def test_update_rows_in_place_equals_gathered_update_bit_for_bit(kind):
    """The in-place update of table rows (row-wise Adagrad's index_add_ among them) leaves every
    row and its state as apply_update on the gathered rows does, bit for bit, and the other rows alone."""
    gen = torch.Generator().manual_seed(3)
    spec = OptimizerSpec(kind=kind, lr=0.05, eps=1e-8)
    d = 37  # not a multiple of the vector width: the tail is rounded as the body
    w0 = torch.randn(500, d, generator=gen)
    s0 = torch.rand(500, state_width(spec, d), generator=gen)
    for step in range(3):
        index = torch.randperm(500, generator=gen)[:200]
        grads = torch.randn(200, d, generator=gen) * 1e-2
        w, s = w0.clone(), s0.clone()
        update_rows(spec, w, s, index, grads, step)
        gw, gs = w0.index_select(0, index), s0.index_select(0, index)
        apply_update(spec, gw, gs, grads, step)
        want_w, want_s = w0.clone(), s0.clone()
        want_w[index], want_s[index] = gw, gs
        assert torch.equal(w, want_w) and torch.equal(s, want_s)
        assert not torch.equal(w, w0)
        w0, s0 = w, s


def test_sgd_leaves_other_rows_and_state_alone():
    spec = OptimizerSpec(kind="sgd", lr=0.1)
    w = torch.ones(2, 3)
    s = torch.zeros(2, 0)
    apply_update(spec, w, s, torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]), iteration=4)
    torch.testing.assert_close(w, torch.tensor([[0.9, 0.8, 0.7], [1.0, 1.0, 1.0]]))


def test_unknown_kind_raises():
    spec = OptimizerSpec(kind="sgd")
    spec.kind = "lamb"  # bypasses validation (the spec is mutable)
    with pytest.raises(ValueError, match="lamb"):
        apply_update(spec, torch.zeros(1, 2), torch.zeros(1, 0), torch.zeros(1, 2), 0)
