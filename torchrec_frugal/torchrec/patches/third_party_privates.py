"""Every private name of TorchRec or torch that the glue (torchrec_frugal/torchrec/) relies on, with
where it is used and how tests/torchrec/test_torchrec_patches.py guards it: a private function by
its source hash per release (:attr:`.releases.Release.privates`), a private attribute by a class
that still assigns it, a private module by the names imported from it, a shimmed planner function
as the shims are."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Tuple

from .planner_shims import PATCHES
from .releases import SEBC_INIT, SEC_INIT

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


_SEC = SEC_INIT.rsplit(".", 1)[0]
_SEBC = SEBC_INIT.rsplit(".", 1)[0]
_PLANNER = "torchrec.distributed.planner.planners.EmbeddingShardingPlanner"

_PRIVATES: List[Private] = [
    Private(SEBC_INIT, HASHED, "embedding_types: registers the frugal state-dict hooks"),
    Private(SEC_INIT, HASHED, "embedding_types: as above (no argument in 1.6)"),
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
        "patches.planner_shims: the feature-processed sharder offers frugal when the sharder it wraps does",
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
        Private(f"torchrec.distributed.planner.{p.key}", SHIMMED, f"patches.planner_shims: the {p.name} shim")
        for p in PATCHES
        if p.name.startswith("_")
    ),
]
# Every private name of TorchRec or torch the glue (torchrec_frugal/torchrec/) relies on, by path.
THIRD_PARTY_PRIVATES: Dict[str, Private] = {p.path: p for p in _PRIVATES}
