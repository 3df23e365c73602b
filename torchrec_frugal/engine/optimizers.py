"""Row optimizers, applied identically to owner-cached rows and host rows.

The same function updates whichever copy of a row its owner holds, so cached and host copies
cannot drift. Semantics follow FBGEMM 1.8's fused kernels (``fbgemm_gpu/codegen/genscript/optimizers.py``):
``G`` is the sum of the row's gradients over all ranks at the step, and only the rows of the step
are updated (their state too).

- sgd (EXACT_SGD):                         w -= lr * G
- rowwise_adagrad (EXACT_ROWWISE_ADAGRAD): m += sum(G * G over the row) / d; w -= G * (lr / (sqrt(m) + eps)),
      the row's multiplier computed once, as FBGEMM's kernels do
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

:func:`update_rows` applies the same update to rows of a table in place (an owner's store or its
host rows); :func:`apply_update` to rows already gathered; :func:`rowwise_adagrad_begin` and
:func:`rowwise_adagrad_finish` row-wise Adagrad to an owner's rows in CPU memory, each row read
and written where it lives.

``state_width`` is the one place that knows how many state columns each optimizer keeps: the
engine asks it and hands the width on (host tables, owner store, host-memory check).
"""
from __future__ import annotations

from typing import Tuple

import numpy as np
import torch

from ..config import OptimizerSpec
from ..kernels.rowwise_adagrad import adagrad_rows, adagrad_state


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
        m.add_(_mean_square(grads))
        weights.sub_(grads * _multiplier(spec, m))
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


def _mean_square(grads: torch.Tensor) -> torch.Tensor:
    """Each row's sum of squares over its d columns, divided by d (FBGEMM's ``g_avg_square``)."""
    return torch.linalg.vecdot(grads, grads).div_(grads.shape[1])


def _multiplier(spec: OptimizerSpec, m: torch.Tensor) -> torch.Tensor:
    """Row-wise Adagrad's step per unit of gradient, ``lr / (sqrt(m) + eps)``, as a column [n, 1]:
    one division a row instead of one an element."""
    denominator = m.sqrt().add_(spec.eps)
    return torch.full_like(denominator, spec.lr).div_(denominator).unsqueeze(1)


def update_rows(
    spec: OptimizerSpec, weights: torch.Tensor, state: torch.Tensor, index: torch.Tensor, grads: torch.Tensor, iteration: int
) -> None:
    """Update the unique rows ``index`` of ``weights`` [N, d] and ``state`` [N, state_width] in place
    with their ``grads`` [n, d], as :func:`apply_update` would.

    Row-wise Adagrad on the CPU adds each row's step into the table (``index_add_``): one pass
    over the rows where a gather, the update and a scatter take three, bit for bit the same
    weights (``w + -(g * k)`` is ``w - g * k`` exactly). Elsewhere (an accelerator's kernels may
    fuse other operations) the rows are gathered, updated by :func:`apply_update` and written back.
    """
    if spec.kind == "rowwise_adagrad" and weights.device.type == "cpu":
        m = state.index_select(0, index)[:, 0]
        m.add_(_mean_square(grads))
        weights.index_add_(0, index, grads * _multiplier(spec, m).neg_())
        state.index_copy_(0, index, m.unsqueeze(1))
        return
    w = weights.index_select(0, index)
    st = state.index_select(0, index)
    apply_update(spec, w, st, grads, iteration)
    weights.index_copy_(0, index, w)
    if state.shape[1]:
        state.index_copy_(0, index, st)


def rowwise_adagrad_begin(
    rows: np.ndarray, grads: torch.Tensor, slot_of: np.ndarray, store_s: torch.Tensor, host_s: torch.Tensor
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row-wise Adagrad of the unique ``rows`` [n] with their ``grads`` [n, d] where the rows live in
    CPU memory, in store slots or in host, each updated where it is; the first half: each row's
    slot ``slot_of[row]`` (< 0: none), its new state ``m`` (its state in ``store_s`` [slots, 1], or
    in ``host_s`` [rows, 1] where it has no slot, plus its mean square) and the rows with no slot.

    Bit for bit :func:`apply_update`'s arithmetic with :func:`rowwise_adagrad_finish`: compiled
    passes read and write the rows (:mod:`~torchrec_frugal.kernels.rowwise_adagrad`), the sums
    of squares and square roots are torch's (whose float32 rounding the kernels do not reproduce).
    """
    n = rows.shape[0]
    slots = np.empty(n, dtype=np.int64)
    m = np.empty(n, dtype=np.float32)
    uncached = np.empty(n, dtype=np.int64)
    square_sum = torch.linalg.vecdot(grads, grads).numpy()  # :func:`_mean_square`'s, divided by the kernel
    u = adagrad_state(rows, slot_of, square_sum, grads.shape[1], store_s.numpy(), host_s.numpy(), slots, m, uncached)
    return slots, m, uncached[:u]


def rowwise_adagrad_finish(
    spec: OptimizerSpec, rows: np.ndarray, slots: np.ndarray, new_slots: np.ndarray, m: np.ndarray,
    grads: torch.Tensor, store_w: torch.Tensor, store_s: torch.Tensor, host_w: torch.Tensor, host_s: torch.Tensor,
) -> np.ndarray:  # fmt: skip
    """The second half of :func:`rowwise_adagrad_begin`: each row's weights and state written where
    it lives: store slot ``slots[i]`` where that is >= 0, else host in place, or, where
    ``new_slots`` holds a slot for each row with none (in order), that slot, from the row's host
    value. Returns the rows updated in the store, in order."""
    held = np.empty(rows.shape[0], dtype=np.int64)
    root = torch.from_numpy(m).sqrt().numpy()
    h = adagrad_rows(rows, slots, new_slots, m, root, grads.numpy(), spec.lr, spec.eps, store_w.numpy(),
                     store_s.numpy(), host_w.numpy(), host_s.numpy(), held, np.zeros(1, dtype=np.float32))  # fmt: skip
    return held[:h]
