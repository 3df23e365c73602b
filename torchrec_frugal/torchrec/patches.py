"""Shims that teach TorchRec's planner (1.6, 1.8 and 1.9) the "frugal" sharding type, and the
guard of every TorchRec and torch private name the glue relies on.

TorchRec's planner dispatches on the stock sharding-type strings in a few module-level
functions that raise on any other string. Each shim below wraps one of them: for "frugal" it
answers, for every other type it calls the original unchanged. With them, TorchRec's own
``EmbeddingShardingPlanner`` (the one ``DistributedModelParallel`` builds when given no plan)
enumerates, costs, partitions and reports frugal tables; ``FrugalShardingPlanner`` builds on it.
Three more make the swap of the sharder take whoever plans: the enumerator keeps, for a table a
frugal sharder serves, only its frugal option (:mod:`.sharding_choice`), and TorchRec's sharder of
feature-processed collections offers "frugal" when the sharder it wraps is a frugal one.
What each shim answers for "frugal", and why, is the table of patches/README.md.

``apply()`` installs them once (importing ``torchrec_frugal.torchrec`` calls it). ``RELEASES``
records, per supported TorchRec release line, the SHA-256 of each wrapped (or relied-on)
function's source that the shims were checked against, the one argument name that differs
between them, and the hashes of the private functions in ``THIRD_PARTY_PRIVATES``;
tests/torchrec/test_torchrec_patches.py fails when the installed stack changes one. An unsupported
TorchRec gets the newest release's shims and an ``UnsupportedTorchRecWarning``.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import inspect
import re
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Tuple

import torchrec
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.fp_embeddingbag import FeatureProcessedEmbeddingBagCollectionSharder
from torchrec.distributed.planner import enumerators, shard_estimators, stats
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.estimator import estimator as perf_estimator
from torchrec.distributed.planner.estimator.estimator import DataParallelEvaluator
from torchrec.distributed.planner.estimator.types import HardwarePerfConfig, ShardPerfContext
from torchrec.distributed.planner.types import PartitionByType, Perf, Storage
from torchrec.distributed.types import ShardingType

from fbgemm_gpu.split_embedding_configs import EmbOptimType

from ..config import CACHE_RATIO, LOOKAHEAD, FrugalConfig, OptimizerSpec
from ..estimate.cost_model import CostTable, DenseModel, Plan, Primitives, RowDistribution, Workload, frugal_table_terms, table_traffic
from ..estimate.profiles import link_profile
from ..engine.optimizers import state_width
from .checkpoint import row_layout
from .sharding_choice import frugal_first
from .types import FRUGAL, FRUGAL_ROW_WISE, FRUGAL_TYPES, OPTIMIZER_KINDS


@dataclass(frozen=True)
class Release:
    """What the shims and the glue rely on in one TorchRec release line ("major.minor")."""

    storage_sharder_arg: str  # the argument of calculate_shard_storages that carries fused_params
    sha256: Dict[str, str]  # "module.function" (module under torchrec.distributed.planner) -> source SHA-256
    # Dotted path of each HASHED private -> source SHA-256, on the release's stack (requirements:
    # torch 2.13.0 for 1.6 and 1.8, 2.14.1 for 1.9; torch's privates follow torch).
    privates: Dict[str, str]


# Release 1.8.0; 1.9.2 has the very same sources.
_SHA256_1_8 = {
    "enumerators.calculate_shard_sizes_and_offsets": "3e2bf2e8aa811265e18e91ea3aac361c90f43a490e85cf54eb4583d998445fd7",
    "enumerators.get_partition_by_type": "80f60cb23c32543855d44f867e5ccb54a1a8bd39d3bcd7f77e7fb3fd63716deb",
    "shard_estimators.calculate_shard_storages": "df15280c8efacce49c2d487ed5ec369c00eeef647efc6402af7d7802ec785c78",
    "shard_estimators._calculate_shard_io_sizes": "0ea579d1189a62173931d4ab5c50e79da0a4107d842a37061195237d1e5ed9cb",
    "stats._calculate_shard_io_sizes": "0ea579d1189a62173931d4ab5c50e79da0a4107d842a37061195237d1e5ed9cb",
    "stats._get_sharding_type_abbr": "6ae67b70ddfbed11098119d89fa112bcb2f436e9ede2cdc30d4ffd07e18b722d",
    "estimator.get_embedding_perf_sharding_evaluator": "19ce0f0f58a11d885567804e69ff127935b644345330a2f9df286ffdb76e0b93",
    "EmbeddingEnumerator.enumerate": "57c4b27dc5d6cdb7f26e6f7a651d864ce5f6ee990fcb3ea81a3a570688c1ffc7",
    "FeatureProcessedEmbeddingBagCollectionSharder.sharding_types": (
        "3365c0be13d84703d6158c306d51ef4b2a8f02774385ea3e6e29c9bbad9f5437"
    ),
    # Inherited from BaseEmbeddingSharder: the shim defines it on the feature-processed sharder.
    "FeatureProcessedEmbeddingBagCollectionSharder.compute_kernels": (
        "ef9fcaf6af4d5f7fbb07170983c7cb95b112a13d91e02361afa5de185f57e5d3"
    ),
}

# The HASHED privates of 1.8.0; torch's are the same source in torch 2.13.0 and 2.14.1.
_SEBC_INIT = "torchrec.distributed.embeddingbag.ShardedEmbeddingBagCollection._initialize_torch_state"
_SEC_INIT = "torchrec.distributed.embedding.ShardedEmbeddingCollection._initialize_torch_state"
_PRIVATES_1_8 = {
    _SEBC_INIT: "572a09c740aa7da839a9a1899d893740ca4399311ba5011790561e7f92adfd77",
    _SEC_INIT: "432f517c3f102f98aee355f1a5dd9716e8102cb156c2f112d3c5e556e2e89723",
    "torch.nn.Module._register_state_dict_hook": "e58ff985b035ff3ebd187a688ea81a6252e983fc0578a1112ec099a56253fd53",
    "torch.nn.Module._register_load_state_dict_pre_hook": "b05194fb62978cea5a81560b761ee2afd5cf2ac50341b6b8c40caac32bae58d7",
    "torchrec.optim.optimizers.in_backward_optimizer_filter": "cb4e4b53018f9c808df3500a3ab4beb8ab66044f94c5f434ab53da9ca436b752",
    "torch.distributed._shard.sharded_tensor.ShardedTensor._init_from_local_shards_and_global_metadata": (
        "46972e65a59e0b44960424063ff3adbf229ba3b747626965ff82c05aa892109f"
    ),
}

RELEASES: Dict[str, Release] = {
    # 1.6.1: calculate_shard_storages takes the live sharder; the shard-size and io-size functions
    # lack 1.8's input checks (the shims do not depend on them); ShardedEmbeddingCollection's
    # _initialize_torch_state takes no argument.
    "1.6": Release(
        storage_sharder_arg="sharder",
        sha256={
            **_SHA256_1_8,
            "enumerators.calculate_shard_sizes_and_offsets": "acd74c4d56e4a78d34f8789fc575b892a86b3524e678763b05b5f09148933d50",
            "shard_estimators.calculate_shard_storages": "ebeb59218230a76cba166f845756d69edd9959e6197b1c8d33c385957703df4f",
            "shard_estimators._calculate_shard_io_sizes": "602904e6b7d660fb2335a4a476fa80137d38327beaee6a2d68da81f1a39a0299",
            "stats._calculate_shard_io_sizes": "602904e6b7d660fb2335a4a476fa80137d38327beaee6a2d68da81f1a39a0299",
            "EmbeddingEnumerator.enumerate": "01b477aa1f35d2d172b54b725909a6d05122e2aac99599770726caa17e9b0879",
            "FeatureProcessedEmbeddingBagCollectionSharder.sharding_types": (
                "9ec9a45f00534bcbbec08fa8b60349d984cc6d7afadcde17ff86e2b44507e7b2"
            ),
            "FeatureProcessedEmbeddingBagCollectionSharder.compute_kernels": (
                "3f556ae895dd7fe64a3450deeb8242630e246c2318d7a79294e46c799ef3e9d0"
            ),
        },
        privates={
            **_PRIVATES_1_8,
            _SEBC_INIT: "a9aed6ca3e5c6ae2f37382e71d1ae5a45978f4a6fbb1365879a9dfa068bb8ff5",
            _SEC_INIT: "ea1e454afdd85f4549fa24952bfb5aa2bd0237cbce8a68333b04b79494a4496b",
        },
    ),
    "1.8": Release(storage_sharder_arg="sharder_data", sha256=_SHA256_1_8, privates=_PRIVATES_1_8),
    # 1.9.2: the sharded modules' _initialize_torch_state, the enumerator's enumerate and the base
    # sharder's compute_kernels changed; their contracts did not.
    "1.9": Release(
        storage_sharder_arg="sharder_data",
        sha256={
            **_SHA256_1_8,
            "EmbeddingEnumerator.enumerate": "54fd413e43ed4c0357e3c7d635f384cfdf5423511d71a0396a6e37b98dbe0612",
            "FeatureProcessedEmbeddingBagCollectionSharder.compute_kernels": (
                "b1cb579ad1b43f4efa6b66a4b40593d5744199806474e2b5baad6e6cf08a08fb"
            ),
        },
        privates={
            **_PRIVATES_1_8,
            _SEBC_INIT: "af4cfa192431a5293963fe54535c3dd031a3274ff243a19c08de573652d638ae",
            _SEC_INIT: "25fe1be1f4514b92f63bf0e4501fffda55fe6de0ad6ab6a661dba5b13d6b4977",
        },
    ),
}


class UnsupportedTorchRecWarning(RuntimeWarning):
    """The installed TorchRec is none of the releases whose sources the shims were checked against."""


def _version_key(release: str) -> Tuple[int, ...]:
    return tuple(int(x) for x in release.split("."))


def release_of(version: str) -> str:
    """The release line ("1.9") of a TorchRec version string ("1.9.2", "1.10.0.dev20250101")."""
    m = re.match(r"(\d+)\.(\d+)", version)
    return f"{m[1]}.{m[2]}" if m else version


def installed_version() -> str:
    """TorchRec's version; a source build may lack ``torchrec.__version__``."""
    return getattr(torchrec, "__version__", None) or importlib.metadata.version("torchrec")


def select_release(version: str) -> str:
    """The release whose shims serve ``version``: its own, or else the newest supported one.

    TorchRec's planner helpers change little between releases, so the newest shims are the best
    guess for an unknown (usually newer) release; the hash tests then say what changed.
    """
    release = release_of(version)
    return release if release in RELEASES else max(RELEASES, key=_version_key)


def warn_if_unsupported(version: str) -> None:
    """At run time an unknown TorchRec warns rather than fails: the shims most likely still fit."""
    if release_of(version) not in RELEASES:
        warnings.warn(
            f"torchrec_frugal supports TorchRec {', '.join(sorted(RELEASES, key=_version_key))}; "
            f"TorchRec {version} is installed, so the planner shims of {select_release(version)} are used "
            "unchecked (tests/torchrec/test_torchrec_patches.py shows which TorchRec functions changed)",
            UnsupportedTorchRecWarning,
        )


TORCHREC_VERSION = installed_version()
RELEASE = RELEASES[select_release(TORCHREC_VERSION)]


def sha256_key(module: Any, name: str) -> str:
    """Key of ``module.name`` in ``Release.sha256``."""
    return f"{module.__name__.rsplit('.', 1)[-1]}.{name}"


@dataclass(frozen=True)
class Patch:
    """A function of TorchRec (module-level, or a method of a class) replaced by a frugal-aware wrapper."""

    module: Any
    name: str
    make: Callable[[Callable[..., Any]], Callable[..., Any]]

    @property
    def key(self) -> str:
        return sha256_key(self.module, self.name)


def source_sha256(fn: Callable[..., Any]) -> str:
    return hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()


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


class FrugalPerfEvaluator(DataParallelEvaluator):
    """Per-rank cost of a frugal shard in TorchRec's perf model: the cost model's price of one frugal
    table (:func:`torchrec_frugal.estimate.cost_model.frugal_table_terms`, which FrugalShardingPlanner's choice
    sums over a plan), on the bandwidths TorchRec gives the shard (device memory; the host link at
    most the device's), with the shard's cache ratio and ids spread evenly over the table's rows
    (TorchRec's perf model knows no distribution; row-wise Adagrad state). Lookups and host reads
    are the forward; the owners' updates and the flushes due next step the backward; the gradients
    to the owners its communication; the other flushes run beside the step. No all-to-all, no
    all-reduce. Times come out in TorchRec's unit: its bandwidths are per millisecond.
    """

    def compute_perf(self, ctx: ShardPerfContext, config: HardwarePerfConfig) -> Perf:
        world = max(1, ctx.world_size)
        rows = max(1, ctx.hash_size * world)  # a frugal shard is one rank's row block of the table
        ratio = ctx.caching_ratio if ctx.caching_ratio is not None else CACHE_RATIO
        plan = Plan(FRUGAL, cache_ratio=min(1.0, max(0.0, ratio)), lookahead=LOOKAHEAD)
        table = CostTable("shard", rows, ctx.emb_dim, RowDistribution.uniform(rows), pooling=ctx.batch_inputs)
        workload = Workload((table,), DenseModel(0.0, 0, 0), batch_size=1, world_size=world)
        p = Primitives(link_profile(ctx.device_bw, min(ctx.hbm_to_ddr_mem_bw, ctx.device_bw)), world)
        row_bytes = ctx.emb_dim * ctx.table_data_type_size
        x = table_traffic(table, workload, plan, device_is_host=False)
        t = {k: sum(v) for k, v in frugal_table_terms(p, x, world, row_bytes, ctx.table_data_type_size).items()}
        return Perf(
            fwd_compute=t["embedding_lookup"] + t["host_reads"],
            fwd_comms=0.0,
            bwd_compute=t["embedding_update"] + t["flush_inline"],
            bwd_comms=t["gradient_exchange"],
        )


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

HASHED = "hashed"  # a function: its source SHA-256 per release in Release.privates
ASSIGNED = "assigned"  # an instance attribute: a class on the owner's MRO assigns ``self.<name>``
MODULE = "module"  # a private module: it imports and holds ``names``
SHIMMED = "shimmed"  # a planner function a shim wraps: guarded as the shims are (Release.sha256)


@dataclass(frozen=True)
class Private:
    """A private name of TorchRec or torch that the glue relies on, and how the tests guard it."""

    path: str  # "package.module[.Class].name", as the glue uses it
    guard: str  # HASHED, ASSIGNED, MODULE or SHIMMED
    used_by: str  # where the glue relies on it, and for what
    source: str = ""  # HASHED: the function whose source is hashed, when not ``path`` itself
    names: Tuple[str, ...] = ()  # MODULE: what the glue imports from it

    @property
    def hashed(self) -> str:
        """Key of the hashed function in ``Release.privates``."""
        return self.source or self.path


_SEC = _SEC_INIT.rsplit(".", 1)[0]
_SEBC = _SEBC_INIT.rsplit(".", 1)[0]
_PLANNER = "torchrec.distributed.planner.planners.EmbeddingShardingPlanner"

_PRIVATES: List[Private] = [
    Private(_SEBC_INIT, HASHED, "embedding_types: registers the frugal state-dict hooks"),
    Private(_SEC_INIT, HASHED, "embedding_types: as above (no argument in 1.6)"),
    Private(f"{_SEBC}._lookups", ASSIGNED, "embedding_types: frugal_lookups() picks the frugal lookups"),
    Private(f"{_SEC}._lookups", ASSIGNED, "embedding_types: as above"),
    Private("torch.nn.Module._register_state_dict_hook", HASHED, "embedding_types: frugal weights into state_dict"),
    Private("torch.nn.Module._register_load_state_dict_pre_hook", HASHED, "embedding_types: loads through the engines"),
    Private(
        "torchrec.distributed.embeddingbag.EmbeddingBagCollectionSharder._sharded_module_order_overwrite",
        ASSIGNED,
        "embeddingbag: shard() passes it on, as TorchRec's sharder does",
    ),
    Private(
        "torchrec.distributed.embedding.EmbeddingCollectionSharder._use_index_dedup",
        ASSIGNED,
        "embedding: shard() passes it on, as TorchRec's sharder does",
    ),
    Private(
        "torchrec.distributed.fp_embeddingbag.FeatureProcessedEmbeddingBagCollectionSharder._ebc_sharder",
        ASSIGNED,
        "patches: the feature-processed sharder offers frugal when the sharder it wraps does",
    ),
    Private(
        "torch.nn.Parameter._in_backward_optimizers",
        HASHED,
        "embedding_kernel: marks the placeholders fused, so that dense optimizers leave them out",
        source="torchrec.optim.optimizers.in_backward_optimizer_filter",
    ),
    Private(
        "torch.distributed._shard.sharded_tensor.ShardedTensor._init_from_local_shards_and_global_metadata",
        HASHED,
        "checkpoint: a row-block ShardedTensor without a collective",
    ),
    Private(
        "torch.distributed._shard",
        MODULE,
        "checkpoint, optim: the ShardedTensor state TorchRec's state_dict holds",
        names=(
            "metadata.ShardMetadata",
            "sharded_tensor.Shard",
            "sharded_tensor.ShardedTensor",
            "sharded_tensor.ShardedTensorMetadata",
            "sharded_tensor.TensorProperties",
        ),
    ),
    Private(
        "torchrec.distributed.train_pipeline.train_pipelines.TrainPipelineSparseDist._pipelined_modules",
        ASSIGNED,
        "pipeline: the traced modules whose engines get the lookahead",
    ),
    *(
        Private(f"{_PLANNER}.{name}", ASSIGNED, f"planner: FrugalShardingPlanner {why}")
        for name, why in [
            ("_constraints", "sets the constraints before each plan"),
            ("_enumerator", "rebuilds its own enumerator with them"),
            ("_storage_reservation", "reserves memory before sizing caches"),
            ("_topology", "reads the topology"),
            ("_batch_size", "reads the batch size"),
        ]
    ),
    *(
        Private(f"torchrec.distributed.planner.{p.key}", SHIMMED, f"patches: the {p.name} shim")
        for p in PATCHES
        if p.name.startswith("_")
    ),
]
# Every private name of TorchRec or torch the glue (torchrec_frugal/torchrec/) relies on, by path.
THIRD_PARTY_PRIVATES: Dict[str, Private] = {p.path: p for p in _PRIVATES}

_originals: Dict[Tuple[str, str], Callable[..., Any]] = {}


def original(patch: Patch) -> Callable[..., Any]:
    """The TorchRec function ``patch`` wraps (the current one if not applied yet)."""
    return _originals.get((patch.module.__name__, patch.name), getattr(patch.module, patch.name))


def apply() -> None:
    """Install the shims and the perf evaluator; idempotent."""
    if not _originals:
        warn_if_unsupported(TORCHREC_VERSION)
    for p in PATCHES:
        key = (p.module.__name__, p.name)
        if key in _originals:
            continue
        fn = getattr(p.module, p.name)
        _originals[key] = fn
        setattr(p.module, p.name, p.make(fn))
    perf_estimator.TRAINING_EVALUATORS.setdefault(FRUGAL, FrugalPerfEvaluator())
    # Placement prices frugal_row_wise as row_wise: the same blocks and all-to-alls, over nodes
    # (what the engines save inside a node is the cost model's, with a hardware profile).
    perf_estimator.TRAINING_EVALUATORS.setdefault(
        FRUGAL_ROW_WISE, perf_estimator.TRAINING_EVALUATORS[ShardingType.ROW_WISE.value]
    )

