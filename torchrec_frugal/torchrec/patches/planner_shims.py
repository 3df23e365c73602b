"""Shims that teach TorchRec's planner (1.6, 1.8 and 1.9) the "frugal" sharding types.

TorchRec's planner dispatches on the stock sharding-type strings in a few module-level
functions that raise on any other string. Each shim below wraps one of them: for "frugal" it
answers, for every other type it calls the original unchanged. With them, TorchRec's own
``EmbeddingShardingPlanner`` (the one ``DistributedModelParallel`` builds when given no plan)
enumerates, costs, partitions and reports frugal tables; ``FrugalShardingPlanner`` builds on it.
Three more make the swap of the sharder take whoever plans: the enumerator keeps, for a table a
frugal sharder serves, only its frugal option (:mod:`..sharding_choice`), and TorchRec's sharder of
feature-processed collections offers "frugal" when the sharder it wraps is a frugal one.
What each shim answers for "frugal", and why, is the table of patches/README.md.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, List, Tuple

from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.fp_embeddingbag import FeatureProcessedEmbeddingBagCollectionSharder
from torchrec.distributed.planner import enumerators, shard_estimators, stats
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.estimator import estimator as perf_estimator
from torchrec.distributed.planner.types import PartitionByType, Storage
from torchrec.distributed.types import ShardingType

from fbgemm_gpu.split_embedding_configs import EmbOptimType

from ...config import OptimizerSpec
from ...engine.optimizers import state_width
from ..checkpoint import row_layout
from ..sharding_choice import frugal_first
from ..types import FRUGAL, FRUGAL_ROW_WISE, FRUGAL_TYPES, OPTIMIZER_KINDS
from .patch import Patch
from .releases import RELEASE


def _calculate_shard_sizes_and_offsets(original: Callable[..., Any]) -> Callable[..., Any]:
    def calculate_shard_sizes_and_offsets(*args: Any, **kwargs: Any) -> Tuple[List[List[int]], List[List[int]]]:
        bound = inspect.signature(original).bind(*args, **kwargs)
        a = bound.arguments
        if a["sharding_type"] == FRUGAL_ROW_WISE:
            # One block per node, each split over the node's ranks: checkpoint.row_layout.
            rows, cols = a["tensor"].shape
            layout = row_layout(rows, a["world_size"], a["local_world_size"])
            return [[size, cols] for _, size in layout], [[off, 0] for off, _ in layout]
        if a["sharding_type"] == FRUGAL:
            # Plain ceil-sized blocks, the layout of torchrec_frugal.torchrec.checkpoint.row_blocks.
            a["sharding_type"] = ShardingType.ROW_WISE.value
            a.pop("num_buckets", None)
            a.pop("device_memory_sizes", None)
        return original(*bound.args, **bound.kwargs)

    return calculate_shard_sizes_and_offsets


def _get_partition_by_type(original: Callable[[str], str]) -> Callable[[str], str]:
    def get_partition_by_type(sharding_type: str) -> str:
        if sharding_type in FRUGAL_TYPES:
            return PartitionByType.UNIFORM.value
        return original(sharding_type)

    return get_partition_by_type


def frugal_row_bytes(embedding_dim: int, element_size: int, fused_params: Dict[str, Any]) -> int:
    """Bytes per row of a frugal table: the weights and the optimizer state stored beside them.

    Planning must not fail on an optimizer frugal tables do not run (the table may end up on a
    stock type): unknown optimizers count one float of state per column.
    """
    kind = OPTIMIZER_KINDS.get(fused_params.get("optimizer", EmbOptimType.EXACT_SGD))
    state = embedding_dim if kind is None else state_width(OptimizerSpec(kind), embedding_dim)
    return embedding_dim * element_size + 4 * state


def _calculate_shard_storages(original: Callable[..., List[Storage]]) -> Callable[..., List[Storage]]:
    def calculate_shard_storages(*args: Any, **kwargs: Any) -> List[Storage]:
        bound = inspect.signature(original).bind(*args, **kwargs)
        if bound.arguments["sharding_type"] not in FRUGAL_TYPES:
            return original(*bound.args, **bound.kwargs)
        bound.apply_defaults()
        a = bound.arguments
        tensor = a["tensor"]
        input_sizes, output_sizes = shard_estimators._calculate_shard_io_sizes(
            sharding_type=a["sharding_type"],
            batch_sizes=a["batch_sizes"],
            world_size=a["world_size"],
            local_world_size=a["local_world_size"],
            input_lengths=a["input_lengths"],
            emb_dim=tensor.shape[1],
            shard_sizes=a["shard_sizes"],
            input_data_type_size=a["input_data_type_size"],
            output_data_type_size=a["output_data_type_size"],
            num_poolings=a["num_poolings"],
            is_pooled=a["is_pooled"],
        )
        # SharderData (1.7+) holds {} where the live sharder (1.6) may hold None.
        fused_params = a[RELEASE.storage_sharder_arg].fused_params or {}
        row_bytes = frugal_row_bytes(tensor.shape[1], tensor.element_size(), fused_params)
        on_device = a["compute_device"] in {"cuda", "mtia"}
        storages = []
        for size, inp, out in zip(a["shard_sizes"], input_sizes, output_sizes):
            host = size[0] * row_bytes
            io = 0 if a["is_inference"] else inp + out
            storages.append(Storage(hbm=io if on_device else 0, ddr=host if on_device else host + io, ssd=0))
        return storages

    return calculate_shard_storages


def _calculate_shard_io_sizes(original: Callable[..., Tuple[List[int], List[int]]]) -> Callable[..., Tuple[List[int], List[int]]]:
    def calculate_shard_io_sizes(*args: Any, **kwargs: Any) -> Tuple[List[int], List[int]]:
        bound = inspect.signature(original).bind(*args, **kwargs)
        if bound.arguments["sharding_type"] == FRUGAL:
            # Each rank reads its own batch and keeps its output: data_parallel's buffers.
            bound.arguments["sharding_type"] = ShardingType.DATA_PARALLEL.value
        elif bound.arguments["sharding_type"] == FRUGAL_ROW_WISE:
            # Ids and pooled sums cross nodes as in row_wise: its buffers.
            bound.arguments["sharding_type"] = ShardingType.ROW_WISE.value
        return original(*bound.args, **bound.kwargs)

    return calculate_shard_io_sizes


def _get_sharding_type_abbr(original: Callable[[str], str]) -> Callable[[str], str]:
    def get_sharding_type_abbr(sharding_type: str) -> str:
        if sharding_type == FRUGAL:
            return "FR"
        if sharding_type == FRUGAL_ROW_WISE:
            return "FRW"
        return original(sharding_type)

    return get_sharding_type_abbr


def _enumerate(original: Callable[..., List[Any]]) -> Callable[..., List[Any]]:
    def enumerate_frugal_first(self: EmbeddingEnumerator, module: Any, sharders: List[Any]) -> List[Any]:
        # The swap takes however the script plans: see sharding_choice.frugal_first.
        return frugal_first(original(self, module, sharders), sharders)

    return enumerate_frugal_first


def _fp_sharding_types(original: Callable[..., List[str]]) -> Callable[..., List[str]]:
    def sharding_types(self: FeatureProcessedEmbeddingBagCollectionSharder, compute_device_type: str) -> List[str]:
        # TorchRec's sharder of feature-processed collections offers its own list, whatever the
        # sharder it wraps: wrapping a frugal one, it offers "frugal" too (not frugal_row_wise:
        # its feature processors see a row-sharded batch only after its stock preprocessing).
        types = original(self, compute_device_type)
        if FRUGAL in self._ebc_sharder.sharding_types(compute_device_type):
            return [FRUGAL] + types
        return types

    return sharding_types


def _fp_compute_kernels(original: Callable[..., List[str]]) -> Callable[..., List[str]]:
    def compute_kernels(
        self: FeatureProcessedEmbeddingBagCollectionSharder, sharding_type: str, compute_device_type: str
    ) -> List[str]:
        if sharding_type in FRUGAL_TYPES:
            return [EmbeddingComputeKernel.FUSED.value]
        return original(self, sharding_type, compute_device_type)

    return compute_kernels


PATCHES: List[Patch] = [
    Patch(enumerators, "calculate_shard_sizes_and_offsets", _calculate_shard_sizes_and_offsets),
    Patch(enumerators, "get_partition_by_type", _get_partition_by_type),
    Patch(shard_estimators, "calculate_shard_storages", _calculate_shard_storages),
    Patch(shard_estimators, "_calculate_shard_io_sizes", _calculate_shard_io_sizes),
    Patch(stats, "_calculate_shard_io_sizes", _calculate_shard_io_sizes),  # imported by name for the report
    Patch(stats, "_get_sharding_type_abbr", _get_sharding_type_abbr),
    Patch(EmbeddingEnumerator, "enumerate", _enumerate),
    Patch(FeatureProcessedEmbeddingBagCollectionSharder, "sharding_types", _fp_sharding_types),
    Patch(FeatureProcessedEmbeddingBagCollectionSharder, "compute_kernels", _fp_compute_kernels),
]

# TorchRec functions the shims rely on without replacing them (their hashes are in RELEASES too).
RELIED_ON: List[Tuple[Any, str]] = [
    # The perf model finds FrugalPerfEvaluator through this lookup in TRAINING_EVALUATORS.
    (perf_estimator, "get_embedding_perf_sharding_evaluator"),
]
