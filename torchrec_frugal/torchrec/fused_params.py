"""What a frugal table does with the ``fused_params`` TorchRec hands its fused kernel.

The counterpart of TorchRec's ``distributed/fused_params.py``. The rule: a key the frugal sharding
takes does what FBGEMM's fused kernel (SplitTableBatchedEmbeddingBagsCodegen) does with it, a key
that only tunes FBGEMM's own kernels, caches or placement is accepted and has no effect, and any
other key is refused, naming the key, its value and the table, when the sharder shards (and when
``FrugalShardingPlanner`` plans): a table is never silently trained otherwise than stock.

Honoured exactly:

- ``optimizer`` (EXACT_SGD, EXACT_ROWWISE_ADAGRAD, EXACT_ADAGRAD, ADAM), ``learning_rate``, ``eps``,
  ``beta1``, ``beta2`` (Adam's; no effect otherwise, as in FBGEMM), ``weight_decay`` (ADAM: decoupled,
  as FBGEMM's kernel applies it; EXACT_ADAGRAD: no effect, its kernel takes none; 0 only otherwise):
  the engine's :class:`~torchrec_frugal.config.OptimizerSpec`, see ``optimizer_spec``.
- ``gradient_clipping`` / ``max_gradient``: FBGEMM clamps the gradient of the kernel's output,
  element by element, to [-max_gradient, max_gradient] before its backward sums it per row
  (``clamp(grad_outputs[0], -max_gradient, max_gradient)`` in the lookup's autograd backward): a
  pooled bag's gradient before the per-id weights and MEAN's 1/L scale, one id's in a sequence.
  The sharding applies it to its lookup's output (:mod:`.frugal_sharding`).
- ``output_dtype`` (FP32, FP16, BF16): the dtype of the pooled or sequence embeddings.
- ``bounds_check_mode`` (every BoundsCheckMode; unset: FBGEMM's WARNING): an id out of range is read
  and trained as row 0 (WARNING, logged; IGNORE), or refuses its batch (FATAL, NONE); see
  :mod:`.bounds_check`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional

import torch
from fbgemm_gpu.split_embedding_configs import SparseType
from torchrec.distributed.types import ParameterSharding
from torchrec.distributed.utils import add_params_from_parameter_sharding, convert_to_fbgemm_types
from torchrec.modules.embedding_configs import DataType, data_type_to_sparse_type

from ..config import OptimizerSpec, check_real
from .bounds_check import bounds_check_mode
from .embedding_kernel import optimizer_spec

FBGEMM_MAX_GRADIENT = 1.0
"""SplitTableBatchedEmbeddingBagsCodegen's ``max_gradient`` when ``gradient_clipping`` is on alone."""

OUTPUT_DTYPES: Dict[SparseType, torch.dtype] = {
    SparseType.FP32: torch.float32,
    SparseType.FP16: torch.float16,
    SparseType.BF16: torch.bfloat16,
}
"""The ``output_dtype`` values frugal tables honour, as torch dtypes."""

HONOURED = (
    "optimizer",
    "learning_rate",
    "eps",
    "beta1",
    "beta2",
    "weight_decay",
    "gradient_clipping",
    "max_gradient",
    "output_dtype",
    "bounds_check_mode",
)
"""Keys whose effect frugal tables reproduce (``weight_decay``: see ``optimizer_spec``)."""

WITHOUT_EFFECT = (
    # FBGEMM's UVM cache and memory placement: frugal tables have their own static caches, sized
    # by the plan's CacheParams.load_factor or FrugalConfig.cache_ratio, and fp32 rows.
    "cache_algorithm",
    "cache_load_factor",
    "cache_sets",
    "cache_reserved_memory",
    "cache_precision",
    "prefetch_pipeline",
    "multipass_prefetch_config",
    "record_cache_metrics",
    "gather_uvm_cache_stats",
    "enforce_hbm",
    "uvm_non_rowwise_momentum",
    "uvm_host_mapped",
    # Kernel choice, grouping, index types and statistics.
    "use_experimental_tbe",
    "use_one_tbe_per_table",
    "embedding_table_index_type",
    "embedding_table_offset_type",
    "stats_reporter_config",
    # Rounds FP16 and INT8 weights only; frugal tables store FP32 (other data types are refused).
    "stochastic_rounding",
    # Hyperparameters of optimizers frugal tables do not run (refused through ``optimizer``).
    "momentum",
    "eta",
)
"""Keys accepted with any value: they tune FBGEMM's kernels, which frugal tables do not run."""

OFF_ONLY = (
    "max_norm",  # FBGEMM renormalizes updated rows above it (row-wise Adagrad, CUDA kernel only)
    "weight_decay_mode",
    "counter_based_regularization",
    "cowclip_regularization",
    "global_weight_decay",
    "ensemble_mode",
    "emainplace_mode",
    "extra_optimizer_config",
    "optimizer_state_dtypes",  # optimizer state in another dtype than fp32
    "enable_raw_embedding_streaming",
    "res_params",
    "tbe_input_multiplexer_config",
    "is_qr_tbe",
)
"""Keys accepted when off (0, None, False, empty, the NONE mode): on, they change what FBGEMM computes
or where the rows go, which frugal tables do not do."""

@dataclass(frozen=True)
class FrugalFusedParams:
    """What a frugal table takes from its fused_params."""

    optimizer: OptimizerSpec
    output_dtype: torch.dtype = torch.float32
    max_gradient: Optional[float] = None  # gradient_clipping's bound; None: no clipping
    bounds_check: str = "WARNING"  # bounds_check_mode, V2_* folded (bounds_check.MODES); FBGEMM's default


def _refuse(table: str, key: str, value: Any, why: str) -> ValueError:
    return ValueError(f"table {table!r}: frugal sharding does not honour fused_params {key!r}={value!r}: {why}")


def frugal_fused_params(fused_params: Mapping[str, Any], table: str) -> FrugalFusedParams:
    """The optimizer, output dtype and gradient clipping of ``table`` from its ``fused_params`` (as
    TorchRec hands them to a fused kernel); raises ValueError, naming the key, its value and the
    table, for a key frugal tables do not honour."""
    for key, value in fused_params.items():
        if key in HONOURED or key in WITHOUT_EFFECT:
            continue
        if key in OFF_ONLY:
            if getattr(value, "value", value):
                raise _refuse(table, key, value, "frugal tables take it only when off; shard this table otherwise")
        else:
            raise _refuse(table, key, value, "not a key frugal tables know (see docs/torchrec.md, fused_params)")
    output_dtype = fused_params.get("output_dtype", SparseType.FP32)
    if isinstance(output_dtype, DataType):
        output_dtype = data_type_to_sparse_type(output_dtype)
    if output_dtype not in OUTPUT_DTYPES:
        accepted = ", ".join(f"SparseType.{s.name}" for s in OUTPUT_DTYPES)
        raise _refuse(table, "output_dtype", output_dtype, f"frugal tables output {accepted}")
    clipping = fused_params.get("gradient_clipping", False)
    if not isinstance(clipping, bool):
        raise _refuse(table, "gradient_clipping", clipping, "must be True or False")
    max_gradient = None
    if clipping:
        max_gradient = fused_params.get("max_gradient", FBGEMM_MAX_GRADIENT)
        try:
            check_real("max_gradient", max_gradient, 0.0, math.inf)
        except ValueError as e:
            raise _refuse(table, "max_gradient", max_gradient, str(e)) from None
        max_gradient = float(max_gradient)
    try:
        bounds_check = bounds_check_mode(fused_params.get("bounds_check_mode"))
    except ValueError as e:
        raise _refuse(table, "bounds_check_mode", fused_params.get("bounds_check_mode"), str(e)) from None
    return FrugalFusedParams(optimizer_spec(fused_params, table), OUTPUT_DTYPES[output_dtype], max_gradient, bounds_check)


def output_params(tables: Mapping[str, FrugalFusedParams]) -> FrugalFusedParams:
    """The fused params of tables whose embeddings leave one lookup together (a module's tables of
    one frugal sharding type), which must agree on output dtype and gradient clipping; raises
    ValueError naming two tables that do not."""
    (first, fused), *others = tables.items()
    for table, other in others:
        if (other.output_dtype, other.max_gradient) != (fused.output_dtype, fused.max_gradient):
            raise ValueError(
                f"table {table!r}: frugal sharding takes one output_dtype and gradient_clipping for a module's "
                f"tables: {other.output_dtype}, max_gradient {other.max_gradient} here, {fused.output_dtype}, "
                f"max_gradient {fused.max_gradient} for table {first!r}"
            )
    return fused


def table_fused_params(fused_params: Optional[Dict[str, Any]], sharding: ParameterSharding) -> Dict[str, Any]:
    """A table's fused_params as TorchRec's sharded modules build them, less those of the table's
    in-backward optimizer (checked when the sharder shards): the sharder's, then the plan's (cache,
    rounding, bounds check, output dtype). What the planner checks."""
    return convert_to_fbgemm_types(add_params_from_parameter_sharding(dict(fused_params or {}), sharding))


def frugal_refusal(fused_params: Optional[Mapping[str, Any]], table: str, dtype: torch.dtype) -> Optional[str]:
    """Why a frugal sharding would refuse ``table`` (a fused_params key it does not honour, weights
    other than FP32), or None: what a planner checks before it plans the table frugal."""
    try:
        frugal_fused_params(dict(fused_params or {}), table)
    except ValueError as e:
        return str(e)
    if dtype != torch.float32:
        return f"table {table!r}: frugal sharding stores FP32 tables, got {dtype}"
    return None
