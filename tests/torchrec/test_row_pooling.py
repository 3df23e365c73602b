"""The lookup's pooling and gathering with their backward as a transposed pooling: the same
values and gradients as PyTorch's own ``embedding_bag`` and indexing, for bags of every length
(empty ones included), with and without pooling weights, learned weights included, and the
transposition planned ahead or computed in the backward alike (bit for bit)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from torchrec_frugal.torchrec.row_pooling import gather_rows, pool_rows, transpose_bags

DIM = 8


def bags(seed: int, num_rows: int, num_bags: int, max_len: int):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, max_len + 1, (num_bags,), generator=g)
    inverse = torch.randint(0, num_rows, (int(lengths.sum()),), generator=g)
    offsets = torch.zeros(num_bags + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    rows = torch.randn(num_rows, DIM, generator=g)
    weights = torch.rand(inverse.numel(), generator=g)
    grad = torch.randn(num_bags, DIM, generator=g)
    return rows, inverse, lengths, offsets, weights, grad


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("seed,num_rows,num_bags,max_len", [(0, 50, 40, 3), (1, 7, 64, 6), (2, 300, 10, 0), (3, 1, 5, 2)])
def test_pooled_gradients_equal_embedding_bags(weighted: bool, seed: int, num_rows: int, num_bags: int, max_len: int) -> None:
    rows, inverse, lengths, offsets, weights, grad = bags(seed, num_rows, num_bags, max_len)
    psw = weights if weighted else None
    ref = rows.clone().requires_grad_()
    ref_out = F.embedding_bag(inverse, ref, offsets, mode="sum", per_sample_weights=psw, include_last_offset=True)
    ref_out.backward(grad)
    grads = []
    for planned in (None, transpose_bags(inverse, lengths, num_rows, psw)):
        ours = rows.clone().requires_grad_()
        out = pool_rows(ours, inverse, lengths, offsets, psw, planned)
        assert torch.equal(out, ref_out.detach())
        out.backward(grad)
        torch.testing.assert_close(ours.grad, ref.grad, rtol=1e-6, atol=1e-6)
        grads.append(ours.grad)
    assert torch.equal(grads[0], grads[1])  # planned ahead or transposed in the backward: bit for bit


def test_learned_pooling_weights_get_their_gradient() -> None:
    rows, inverse, lengths, offsets, weights, grad = bags(4, 30, 20, 4)
    ref_rows, ref_w = rows.clone().requires_grad_(), weights.clone().requires_grad_()
    F.embedding_bag(inverse, ref_rows, offsets, mode="sum", per_sample_weights=ref_w, include_last_offset=True).backward(grad)
    ours_rows, ours_w = rows.clone().requires_grad_(), weights.clone().requires_grad_()
    pool_rows(ours_rows, inverse, lengths, offsets, ours_w).backward(grad)
    torch.testing.assert_close(ours_w.grad, ref_w.grad, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ours_rows.grad, ref_rows.grad, rtol=1e-6, atol=1e-6)
    # weights learned, rows frozen: only the weights' gradient
    frozen_w = weights.clone().requires_grad_()
    pool_rows(rows, inverse, lengths, offsets, frozen_w).backward(grad)
    torch.testing.assert_close(frozen_w.grad, ref_w.grad, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("num_rows,num_values", [(20, 100), (5, 0), (100, 3)])
def test_gathered_gradients_equal_indexing(num_rows: int, num_values: int) -> None:
    g = torch.Generator().manual_seed(num_values)
    rows = torch.randn(num_rows, DIM, generator=g)
    inverse = torch.randint(0, num_rows, (num_values,), generator=g)
    grad = torch.randn(num_values, DIM, generator=g)
    ref = rows.clone().requires_grad_()
    ref[inverse].backward(grad)
    grads = []
    for planned in (None, transpose_bags(inverse, None, num_rows, None)):
        ours = rows.clone().requires_grad_()
        out = gather_rows(ours, inverse, planned)
        assert torch.equal(out, rows[inverse])
        out.backward(grad)
        torch.testing.assert_close(ours.grad, ref.grad, rtol=1e-6, atol=1e-6)
        grads.append(ours.grad)
    assert torch.equal(grads[0], grads[1])


def test_transposition_lists_each_rows_bags_in_batch_order() -> None:
    inverse = torch.tensor([2, 0, 2, 1, 2, 0])
    lengths = torch.tensor([2, 0, 3, 1])  # bags 0: values 0-1, 1: none, 2: values 2-4, 3: value 5
    weights = torch.tensor([0.5, 1.0, 2.0, 3.0, 4.0, 5.0])
    t = transpose_bags(inverse, lengths, 4, weights)  # row 3 never read
    assert t.offsets.tolist() == [0, 2, 3, 6, 6]
    assert t.indices.tolist() == [0, 3, 2, 0, 2, 2]  # row 0: values 1, 5; row 1: value 3; row 2: values 0, 2, 4
    assert t.weights is not None and t.weights.tolist() == [1.0, 5.0, 3.0, 0.5, 2.0, 4.0]
    seq = transpose_bags(inverse, None, 3, None)
    assert seq.indices.tolist() == [1, 5, 3, 0, 2, 4] and seq.weights is None
