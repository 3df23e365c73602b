"""Row optimizers, applied identically to owner-cached rows and host rows.

The same function updates whichever copy of a row its owner holds, so cached and host copies
cannot drift. Semantics follow FBGEMM's fused kernels (checked against FBGEMM 1.8's CPU TBE):
``G`` is the sum of the row's gradients over all ranks at the step.

- sgd (EXACT_SGD):                       w -= lr * G
- rowwise_adagrad (EXACT_ROWWISE_ADAGRAD): m += mean(G * G over the row); w -= lr * G / (sqrt(m) + eps)
- adam (ADAM, per-element moments, bias correction by the global step count t = step + 1):
      m = b1 m + (1 - b1) G;  v = b2 v + (1 - b2) G^2
      w *= 1 - lr * weight_decay;  w -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)

Adam is offered by the engine's own API only: the TorchRec sharder refuses EmbOptimType.ADAM
because this update has not been checked against FBGEMM's Adam kernel (as SGD and row-wise
Adagrad were) and the checkpoint does not map its two moments to TorchRec's state names.

``state_width`` is the one place that knows how many state columns each optimizer keeps: the
engine asks it and hands the width on (host tables, owner store, host-memory check).
"""
from __future__ import annotations

import torch

from .config import OptimizerSpec


def state_width(spec: OptimizerSpec, dim: int) -> int:
    """Floats of optimizer state kept per row (stored beside the weights, flushed with them)."""
    return {"sgd": 0, "rowwise_adagrad": 1, "adam": 2 * dim}[spec.kind]


def apply_update(spec: OptimizerSpec, weights: torch.Tensor, state: torch.Tensor, grads: torch.Tensor, step: int) -> None:
    """Update gathered rows in place: ``weights`` [n, d], ``state`` [n, state_width], ``grads`` [n, d]."""
    if spec.kind == "sgd":
        weights.add_(grads, alpha=-spec.lr)
    elif spec.kind == "rowwise_adagrad":
        m = state[:, 0]
        m.add_(grads.pow(2).mean(dim=1))
        weights.addcdiv_(grads, (m.sqrt() + spec.eps).unsqueeze(1), value=-spec.lr)
    elif spec.kind == "adam":
        d = weights.shape[1]
        m, v = state[:, :d], state[:, d:]
        m.mul_(spec.beta1).add_(grads, alpha=1.0 - spec.beta1)
        v.mul_(spec.beta2).addcmul_(grads, grads, value=1.0 - spec.beta2)
        t = step + 1
        m_hat = m / (1.0 - spec.beta1**t)
        v_hat = v / (1.0 - spec.beta2**t)
        if spec.weight_decay:
            weights.mul_(1.0 - spec.lr * spec.weight_decay)
        weights.addcdiv_(m_hat, v_hat.sqrt_().add_(spec.eps), value=-spec.lr)
    else:
        raise ValueError(f"unknown optimizer kind {spec.kind!r}")
