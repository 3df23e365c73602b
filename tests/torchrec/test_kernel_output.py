"""The lookup's output as the fused kernel returns it: the gradient stock's backward would see."""
from __future__ import annotations

import pytest
import torch

from torchrec_frugal.torchrec.sharding.frugal_sharding import KernelOutput


def _grad(embs: torch.Tensor, out_grad: torch.Tensor, dtype: torch.dtype, max_gradient, ranks: int) -> torch.Tensor:
    embs = embs.clone().requires_grad_(True)
    KernelOutput.apply(embs, dtype, max_gradient, ranks).backward(out_grad)
    assert embs.grad is not None
    return embs.grad


@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 8])
def test_fp32_unclamped_gradient_is_divided_and_multiplied_back_bit_for_bit(ranks: int) -> None:
    """Over a power of two of ranks the gradient passes as it is: what the round trip gives."""
    gen = torch.Generator().manual_seed(0)
    g = torch.randn(64, 16, generator=gen) * torch.logspace(-30, 30, 16)
    got = _grad(torch.zeros(64, 16), g, torch.float32, None, ranks)
    assert torch.equal(got, (g / ranks) * ranks if ranks > 1 else g)
    if ranks == 3:  # not a power of two: the round trip rounds, as stock's division does
        assert not torch.equal(got, g)


def test_clamped_and_fp16_gradients_take_the_round_trip() -> None:
    g = torch.tensor([[3.0, -0.5, 0.25]])
    assert torch.equal(_grad(torch.zeros(1, 3), g, torch.float32, 1.0, 2), torch.tensor([[2.0, -0.5, 0.25]]))
    g16 = torch.tensor([[1e-4, 3.0]], dtype=torch.float16)
    got = _grad(torch.zeros(1, 2), g16, torch.float16, None, 2)
    assert got.dtype == torch.float32 and torch.equal(got, (g16 / 2).to(torch.float32) * 2)
