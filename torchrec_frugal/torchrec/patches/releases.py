"""The TorchRec releases the shims and the glue were checked against, and which one serves the
installed TorchRec.

``RELEASES`` records, per supported TorchRec release line, the SHA-256 of each wrapped (or
relied-on) function's source that the shims were checked against, the one argument name that
differs between them, and the hashes of the private functions in
:data:`.third_party_privates.THIRD_PARTY_PRIVATES`; tests/torchrec/test_torchrec_patches.py fails
when the installed stack changes one. An unsupported TorchRec gets the newest release's shims and
an ``UnsupportedTorchRecWarning``.
"""
from __future__ import annotations

import importlib.metadata
import re
import warnings
from dataclasses import dataclass
from typing import Dict, Tuple

import torchrec


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
SEBC_INIT = "torchrec.distributed.embeddingbag.ShardedEmbeddingBagCollection._initialize_torch_state"
SEC_INIT = "torchrec.distributed.embedding.ShardedEmbeddingCollection._initialize_torch_state"
_PRIVATES_1_8 = {
    SEBC_INIT: "572a09c740aa7da839a9a1899d893740ca4399311ba5011790561e7f92adfd77",
    SEC_INIT: "432f517c3f102f98aee355f1a5dd9716e8102cb156c2f112d3c5e556e2e89723",
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
            SEBC_INIT: "a9aed6ca3e5c6ae2f37382e71d1ae5a45978f4a6fbb1365879a9dfa068bb8ff5",
            SEC_INIT: "ea1e454afdd85f4549fa24952bfb5aa2bd0237cbce8a68333b04b79494a4496b",
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
            SEBC_INIT: "af4cfa192431a5293963fe54535c3dd031a3274ff243a19c08de573652d638ae",
            SEC_INIT: "25fe1be1f4514b92f63bf0e4501fffda55fe6de0ad6ab6a661dba5b13d6b4977",
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
