"""Row optimizers, applied identically to owner-cached rows and host rows.

The same function updates whichever copy of a row its owner holds, so cached and host copies
cannot drift. Semantics follow FBGEMM 1.8's fused kernels (``fbgemm_gpu/codegen/genscript/optimizers.py``):
``G`` is the sum of the row's gradients over all ranks at the step, and only the rows of the step
are updated (their state too).

- sgd (EXACT_SGD):                         w -= lr * G
- rowwise_adagrad (EXACT_ROWWISE_ADAGRAD): m += mean(G * G over the row); w -= lr * G / (sqrt(m) + eps)
- adagrad (EXACT_ADAGRAD, per-element sum of squares; FBGEMM's kernel takes no weight decay):
      m += G * G;  w -= lr * G / (sqrt(m) + eps)
- adam (ADAM, per-element moments, bias correction by FBGEMM's iteration count t, decoupled weight decay):
      m = b1 m + (1 - b1) G;  v = b2 v + (1 - b2) G^2
      w -= lr * ((m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + weight_decay * w)

FBGEMM's CPU build has no Adam kernel (its TBE refuses ADAM on CPU); the Adam update is its CUDA
kernel's, in the same order of operations. Its ``t`` counts every forward of the table's kernel
(``iter``, incremented in forward, also without gradients), so ``apply_update`` takes the
iteration, not the step: the engine passes the steps so far plus the reads outside its steps
(:meth:`~torchrec_frugal.engine.frugal_engine.FrugalEngine.lookup`).

``state_width`` is the one place that knows how many state columns each optimizer keeps: the
engine asks it and hands the width on (host tables, owner store, host-memory check).
"""
from __future__ import annotations

import torch

from ..config import OptimizerSpec


def state_width(spec: OptimizerSpec, dim: int) -> int:
    """Floats of optimizer state kept per row (stored beside the weights, flushed with them)."""
    return {"sgd": 0, "rowwise_adagrad": 1, "adagrad": dim, "adam": 2 * dim}[spec.kind]


def apply_update(spec: OptimizerSpec, weights: torch.Tensor, state: torch.Tensor, grads: torch.Tensor, iteration: int) -> None:
    """Update gathered rows in place: ``weights`` [n, d], ``state`` [n, state_width], ``grads`` [n, d];
    ``iteration``: forwards of the table before this one (Adam's t is ``iteration + 1``)."""
    if spec.kind == "sgd":
        weights.add_(grads, alpha=-spec.lr)
    elif spec.kind == "rowwise_adagrad":
        m = state[:, 0]
        m.add_(grads.pow(2).mean(dim=1))
        weights.addcdiv_(grads, (m.sqrt() + spec.eps).unsqueeze(1), value=-spec.lr)
    elif spec.kind == "adagrad":
        state.addcmul_(grads, grads)
        weights.addcdiv_(grads, state.sqrt().add_(spec.eps), value=-spec.lr)
    elif spec.kind == "adam":
        d = weights.shape[1]
        m, v = state[:, :d], state[:, d:]
        m.mul_(spec.beta1).add_(grads, alpha=1.0 - spec.beta1)
        v.mul_(spec.beta2).addcmul_(grads, grads, value=1.0 - spec.beta2)
        t = iteration + 1
        step = (m / (1.0 - spec.beta1**t)).div_((v / (1.0 - spec.beta2**t)).sqrt_().add_(spec.eps))
        if spec.weight_decay:
            step.add_(weights, alpha=spec.weight_decay)
        weights.add_(step, alpha=-spec.lr)
    else:
        raise ValueError(f"unknown optimizer kind {spec.kind!r}")
