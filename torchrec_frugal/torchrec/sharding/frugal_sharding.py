"""The "frugal" sharding type: data-parallel in structure, tables served by Frugal engines.

The counterpart of TorchRec's ``sharding/dp_sharding.py``. Each rank keeps its own batch (no
input all-to-all), reads its rows through its engine (own cache, or the table in shared host
memory) and pools them locally (no output all-to-all), so the input and output dists are
data-parallel's. Backward hands the gradient of the step's unique rows to the engine, which sums
it over ranks and applies the fused optimizer at each row's owner: the update FBGEMM's fused
kernels apply to a sharded table.

What the fused kernel does to its output by ``fused_params`` the sharding does to its lookup's,
before the output dist: the cast to ``output_dtype``, and ``gradient_clipping``'s clamp of that
output's gradient (:class:`FrugalOutputDist`).
"""
from __future__ import annotations

from typing import Any, Callable, ClassVar, Dict, List, Optional, Tuple, Type, TypeVar

import torch
from torchrec.distributed.comm_ops import get_gradient_division
from torchrec.distributed.embedding_sharding import (
    BaseEmbeddingDist,
    BaseEmbeddingLookup,
    BaseSparseFeaturesDist,
    EmbeddingSharding,
    EmbeddingShardingContext,
    EmbeddingShardingInfo,
)
from torchrec.distributed.embedding_types import (
    BaseGroupedFeatureProcessor,
    EmbeddingComputeKernel,
    ShardedEmbeddingTable,
)
from torchrec.distributed.sharding.dp_sequence_sharding import DpSequenceEmbeddingDist
from torchrec.distributed.sharding.dp_sharding import DpPooledEmbeddingDist, DpSparseFeaturesDist
from torchrec.distributed.sharding.sequence_sharding import SequenceShardingContext
from torchrec.distributed.types import Awaitable, ShardingEnv, ShardMetadata
from torchrec.modules.embedding_configs import DataType
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from ...config import FrugalConfig
from ..embedding_lookup import FrugalEmbeddingLookup
from ..fused_params import frugal_fused_params, output_params
from ..types import FrugalTable

C = TypeVar("C", EmbeddingShardingContext, SequenceShardingContext)


class KernelOutput(torch.autograd.Function):
    """The lookup's output as FBGEMM's fused kernel returns it: cast to ``output_dtype``; backward,
    the gradient clamped element by element to [-max_gradient, max_gradient] (``gradient_clipping``;
    None: no clamp), before the lookup's backward sums it per row.

    TorchRec's output dist divides the gradient by the world size in its dtype (gradient division)
    before FBGEMM's backward clamps it and sums it in fp32. A frugal engine divides its rows'
    summed gradients by its ranks itself; so the gradient is divided here as stock divides it (an
    FP16 gradient rounds), clamped, cast to fp32 and multiplied back, exactly for a power of two.
    Unclamped fp32 over a power of two of ranks, the round trip changes no bit (unless a gradient
    is below 2^-126 times the ranks, where the division rounds): the gradient passes as it is.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, embs: torch.Tensor, output_dtype: torch.dtype, max_gradient: Optional[float], engine_ranks: int
    ) -> torch.Tensor:
        ctx.input_dtype, ctx.max_gradient, ctx.engine_ranks = embs.dtype, max_gradient, engine_ranks
        return embs.to(output_dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[torch.Tensor, None, None, None]:  # type: ignore[override]
        ranks = ctx.engine_ranks if get_gradient_division() else 1
        if ctx.max_gradient is None and grad.dtype == ctx.input_dtype == torch.float32 and ranks & (ranks - 1) == 0:
            return grad, None, None, None
        if ranks > 1:
            grad = grad / ranks
        if ctx.max_gradient is not None:
            grad = grad.clamp(-ctx.max_gradient, ctx.max_gradient)
        grad = grad.to(ctx.input_dtype)
        return (grad * ranks if ranks > 1 else grad), None, None, None


class FrugalOutputDist(BaseEmbeddingDist[C, torch.Tensor, torch.Tensor]):
    """TorchRec's output dist of a frugal sharding, given the lookup's output as the fused kernel
    would return it (:class:`KernelOutput`): in ``output_dtype``, its gradient clamped to
    ``max_gradient`` (if not None)."""

    def __init__(
        self,
        dist: BaseEmbeddingDist[C, torch.Tensor, torch.Tensor],
        output_dtype: torch.dtype,
        max_gradient: Optional[float],
        engine_ranks: int,
    ) -> None:
        super().__init__()
        self._dist = dist
        self._output_dtype = output_dtype
        self._max_gradient = max_gradient
        self._engine_ranks = engine_ranks

    def forward(self, local_embs: torch.Tensor, sharding_ctx: Optional[C] = None) -> Awaitable[torch.Tensor]:
        if local_embs.requires_grad:
            embs = KernelOutput.apply(local_embs, self._output_dtype, self._max_gradient, self._engine_ranks)
        else:
            embs = local_embs.to(self._output_dtype)
        return self._dist(embs, sharding_ctx)


class FrugalEmbeddingSharding(EmbeddingSharding[C, KeyedJaggedTensor, torch.Tensor, torch.Tensor]):
    """Frugal sharding of the tables of one sharded module.

    Like data-parallel sharding, every rank serves all of these tables for its own batch; unlike
    it, no rank holds a replica: the tables live once in host memory, behind the engines. The
    variants below differ only in their output: pooled, or one embedding per id.
    """

    pooled: ClassVar[bool]
    output_dist_type: ClassVar[Type[BaseEmbeddingDist[Any, torch.Tensor, torch.Tensor]]]

    def __init__(
        self,
        sharding_infos: List[EmbeddingShardingInfo],
        env: ShardingEnv,
        device: Optional[torch.device] = None,
        config: Optional[FrugalConfig] = None,
        presample_counts: Optional[Dict[str, torch.Tensor]] = None,
        init_fns: Optional[Dict[str, Callable[[torch.Tensor], Any]]] = None,
    ) -> None:
        super().__init__()
        if env.output_dtensor:
            raise NotImplementedError("frugal sharding writes ShardedTensor state, not DTensor")
        self._env = env
        self._device = device if device is not None else torch.device("cpu")
        self._config = config or FrugalConfig()
        counts = presample_counts or {}
        self._infos = sharding_infos
        self._tables: List[FrugalTable] = []
        self._embedding_names: List[str] = []
        self._embedding_dims: List[int] = []
        # Refused here, at shard time, naming the key and the table, if frugal does not honour it.
        fused_params = {
            i.embedding_config.name: frugal_fused_params(i.fused_params or {}, i.embedding_config.name)
            for i in sharding_infos
        }
        self._output_params = output_params(fused_params)
        for info in sharding_infos:
            cfg = info.embedding_config
            if cfg.data_type != DataType.FP32:
                raise ValueError(f"table {cfg.name!r}: frugal sharding stores FP32 tables, got {cfg.data_type}")
            cache = info.param_sharding.cache_params
            self._tables.append(
                self._engine_table(FrugalTable(
                    name=cfg.name,
                    num_embeddings=cfg.num_embeddings,
                    embedding_dim=cfg.embedding_dim,
                    feature_names=list(cfg.feature_names),
                    pooling=cfg.pooling,
                    init_fn=(init_fns or {}).get(cfg.name, cfg.init_fn),  # type: ignore[arg-type]
                    optimizer=fused_params[cfg.name].optimizer,
                    cache_ratio=(
                        cache.load_factor
                        if cache is not None and cache.load_factor is not None
                        else self._config.cache_ratio
                    ),
                    presample_counts=counts.get(cfg.name),
                    bounds_check=fused_params[cfg.name].bounds_check,
                ))
            )  # fmt: skip
            self._embedding_names.extend(cfg.embedding_names)
            self._embedding_dims.extend([cfg.embedding_dim] * len(cfg.feature_names))

    def _engine_table(self, table: FrugalTable) -> FrugalTable:
        """The part of ``table`` this rank's engine holds: all of it (frugal_row_wise: its node's block)."""
        return table

    def _lookup_groups(self, device: Optional[torch.device]) -> Dict[str, Any]:
        """The lookup's process groups and announce path: one engine over every rank, whose
        checkpoints span those ranks, announced batches taken as they are."""
        return {"pg": self._env.process_group}

    def _engine_ranks(self) -> int:
        """The ranks of an engine, by which it divides the rows' summed gradients: every rank."""
        return self._env.world_size

    def create_input_dist(self, device: Optional[torch.device] = None) -> BaseSparseFeaturesDist[KeyedJaggedTensor]:
        return DpSparseFeaturesDist()

    def create_lookup(
        self,
        device: Optional[torch.device] = None,
        fused_params: Optional[Dict[str, Any]] = None,
        feature_processor: Optional[BaseGroupedFeatureProcessor] = None,
    ) -> BaseEmbeddingLookup:
        if feature_processor is not None:
            raise NotImplementedError(f"{type(self).__name__} does not support feature processors")
        return FrugalEmbeddingLookup(
            self._tables,
            pooled=self.pooled,
            config=self._config,
            device=device if device is not None else self._device,
            **self._lookup_groups(device),
        )

    def create_output_dist(
        self, device: Optional[torch.device] = None
    ) -> BaseEmbeddingDist[C, torch.Tensor, torch.Tensor]:
        dist = self._stock_output_dist(device)
        out = self._output_params
        if out.output_dtype == torch.float32 and out.max_gradient is None:
            return dist
        return FrugalOutputDist(dist, out.output_dtype, out.max_gradient, self._engine_ranks())

    def _stock_output_dist(self, device: Optional[torch.device]) -> BaseEmbeddingDist[C, torch.Tensor, torch.Tensor]:
        """TorchRec's output dist of the lookup's output: data-parallel's, which sends nothing."""
        return self.output_dist_type()

    def feature_names(self) -> List[str]:
        return [f for t in self._tables for f in t.feature_names]

    def embedding_names(self) -> List[str]:
        return list(self._embedding_names)

    def embedding_dims(self) -> List[int]:
        return list(self._embedding_dims)

    def embedding_names_per_rank(self) -> List[List[str]]:
        return [self.embedding_names() for _ in range(self._env.world_size)]

    def embedding_shard_metadata(self) -> List[Optional[ShardMetadata]]:
        return [None] * len(self._embedding_names)

    def embedding_tables(self) -> List[ShardedEmbeddingTable]:
        """The tables, whole on every rank (what TorchRec's index dedup reads)."""
        return [
            ShardedEmbeddingTable(
                num_embeddings=i.embedding_config.num_embeddings,
                embedding_dim=i.embedding_config.embedding_dim,
                name=i.embedding_config.name,
                embedding_names=i.embedding_config.embedding_names,
                data_type=i.embedding_config.data_type,
                feature_names=i.embedding_config.feature_names,
                pooling=i.embedding_config.pooling,
                is_weighted=i.embedding_config.is_weighted,
                local_rows=i.embedding_config.num_embeddings,
                local_cols=i.embedding_config.embedding_dim,
                compute_kernel=EmbeddingComputeKernel.CUSTOMIZED_KERNEL,
            )
            for i in self._infos
        ]


class FrugalPooledEmbeddingSharding(FrugalEmbeddingSharding[EmbeddingShardingContext]):
    """Frugal sharding of EmbeddingBagCollection tables (pooled output, local)."""

    pooled = True
    output_dist_type = DpPooledEmbeddingDist


class FrugalSequenceEmbeddingSharding(FrugalEmbeddingSharding[SequenceShardingContext]):
    """Frugal sharding of EmbeddingCollection tables (one embedding per id, local)."""

    pooled = False
    output_dist_type = DpSequenceEmbeddingDist
