"""The planner shims of torchrec_frugal.torchrec.patches, and the TorchRec and torch privates
the glue relies on (patches.third_party_privates.THIRD_PARTY_PRIVATES).

Each shim must still wrap the TorchRec function it was written against in the installed TorchRec
release (the tests below fail when TorchRec changes one, or when the release is not supported:
review the shim, then record the hash in patches.releases.RELEASES), answer for the "frugal" type, and
hand every other sharding type to TorchRec unchanged. Each private must still be there, and a
private function still have the source recorded for the release.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import textwrap
import warnings
from typing import Any, Dict, Optional

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torchrec.distributed.planner import enumerators, shard_estimators, stats
from torchrec.distributed.planner.estimator import estimator as perf_estimator
from torchrec.distributed.planner.types import PartitionByType
from torchrec.distributed.planner.utils import build_sharder_data

from torchrec_frugal.torchrec import FrugalEmbeddingBagCollectionSharder, patches
from torchrec_frugal.torchrec.patches import perf_evaluator, planner_shims, releases, third_party_privates
from torchrec_frugal.torchrec.patches.patch import Patch, sha256_key, source_sha256
from torchrec_frugal.torchrec.checkpoint import row_blocks
from torchrec_frugal.torchrec.types import FRUGAL

STOCK = ["data_parallel", "table_wise", "row_wise", "column_wise", "table_column_wise", "table_row_wise", "grid_shard"]


def _patch(module: Any, name: str) -> Patch:
    return next(p for p in planner_shims.PATCHES if p.module is module and p.name == name)


def test_installed_torchrec_is_a_supported_release() -> None:
    assert releases.release_of(releases.TORCHREC_VERSION) in releases.RELEASES, (
        f"TorchRec {releases.TORCHREC_VERSION} is not among the supported releases {sorted(releases.RELEASES)}: "
        "check each shim against its sources, then add the release to releases.RELEASES"
    )


@pytest.mark.parametrize("patch", planner_shims.PATCHES, ids=lambda p: p.key)
def test_wrapped_torchrec_function_is_unchanged(patch: Patch) -> None:
    assert source_sha256(patches.original(patch)) == releases.RELEASE.sha256[patch.key], (
        f"TorchRec {releases.TORCHREC_VERSION} changed {patch.module.__name__}.{patch.name}: review the shim "
        "in torchrec_frugal/torchrec/patches/planner_shims.py, then record the new hash in releases.RELEASES"
    )


@pytest.mark.parametrize("module,name", planner_shims.RELIED_ON, ids=lambda x: getattr(x, "__name__", str(x))[:40])
def test_torchrec_function_relied_on_is_unchanged(module: Any, name: str) -> None:
    assert source_sha256(getattr(module, name)) == releases.RELEASE.sha256[sha256_key(module, name)], (
        f"TorchRec {releases.TORCHREC_VERSION} changed {module.__name__}.{name}"
    )


@pytest.mark.parametrize("release", sorted(releases.RELEASES))
def test_every_release_records_every_wrapped_function(release: str) -> None:
    keys = {p.key for p in planner_shims.PATCHES} | {sha256_key(m, n) for m, n in planner_shims.RELIED_ON}
    assert set(releases.RELEASES[release].sha256) == keys


@pytest.mark.parametrize(
    "version,release", [("1.6.1", "1.6"), ("1.8.0", "1.8"), ("1.9.2", "1.9"), ("1.9.0.dev20250101+cpu", "1.9")]
)
def test_supported_versions_get_their_release_s_shims_silently(version: str, release: str) -> None:
    assert releases.select_release(version) == release
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        releases.warn_if_unsupported(version)


@pytest.mark.parametrize("version", ["1.7.0", "1.10.0", "2.0.0a0", "unknown"])
def test_an_unsupported_torchrec_warns_and_gets_the_newest_shims(version: str) -> None:
    assert releases.select_release(version) == "1.9"
    with pytest.warns(releases.UnsupportedTorchRecWarning, match=rf"TorchRec 1\.6, 1\.8, 1\.9; TorchRec {version} is"):
        releases.warn_if_unsupported(version)


def test_apply_installs_each_shim_once() -> None:
    patches.apply()
    installed = {(p.module.__name__, p.name): getattr(p.module, p.name) for p in planner_shims.PATCHES}
    patches.apply()
    for p in planner_shims.PATCHES:
        assert getattr(p.module, p.name) is installed[(p.module.__name__, p.name)]
        assert getattr(p.module, p.name) is not patches.original(p)
    assert isinstance(perf_estimator.get_embedding_perf_sharding_evaluator(FRUGAL), perf_evaluator.FrugalPerfEvaluator)


def test_shard_sizes_frugal_are_row_blocks() -> None:
    t = torch.empty(10, 8, device="meta")
    sizes, offsets = enumerators.calculate_shard_sizes_and_offsets(
        t, 4, 4, FRUGAL, device_memory_sizes=[1, 2, 3, 4], num_buckets=5
    )
    assert [(o[0], s[0]) for s, o in zip(sizes, offsets)] == row_blocks(10, 4) == [(0, 3), (3, 3), (6, 3), (9, 1)]
    assert all(s[1] == 8 and o[1] == 0 for s, o in zip(sizes, offsets))


@pytest.mark.parametrize("sharding_type", STOCK)
def test_stock_types_reach_torchrec_unchanged(sharding_type: str) -> None:
    t = torch.empty(12, 8, device="meta")
    orig = patches.original(_patch(enumerators, "calculate_shard_sizes_and_offsets"))
    assert enumerators.calculate_shard_sizes_and_offsets(t, 4, 2, sharding_type, 4) == orig(t, 4, 2, sharding_type, 4)
    part = patches.original(_patch(enumerators, "get_partition_by_type"))
    assert enumerators.get_partition_by_type(sharding_type) == part(sharding_type)
    abbr = patches.original(_patch(stats, "_get_sharding_type_abbr"))
    assert stats._get_sharding_type_abbr(sharding_type) == abbr(sharding_type)


def test_unknown_types_still_raise() -> None:
    with pytest.raises(ValueError, match="nope"):
        enumerators.get_partition_by_type("nope")
    with pytest.raises(ValueError, match="nope"):
        stats._get_sharding_type_abbr("nope")
    with pytest.raises(ValueError, match="nope"):
        enumerators.calculate_shard_sizes_and_offsets(torch.empty(4, 4), 2, 2, "nope")


def test_partition_and_abbreviation_of_frugal() -> None:
    assert enumerators.get_partition_by_type(FRUGAL) == PartitionByType.UNIFORM.value
    assert stats._get_sharding_type_abbr(FRUGAL) == "FR"


def _io(sharding_type: str) -> Any:
    return shard_estimators._calculate_shard_io_sizes(
        sharding_type=sharding_type,
        batch_sizes=[64],
        world_size=4,
        local_world_size=4,
        input_lengths=[2.0],
        emb_dim=16,
        shard_sizes=[[25, 16]] * 4,
        input_data_type_size=8,
        output_data_type_size=4,
        num_poolings=[1.0],
        is_pooled=True,
    )


def test_io_sizes_of_frugal_are_data_parallel_ones() -> None:
    assert _io(FRUGAL) == _io("data_parallel")
    assert stats._calculate_shard_io_sizes is not patches.original(_patch(stats, "_calculate_shard_io_sizes"))


def _sharder_arg(sharder: FrugalEmbeddingBagCollectionSharder) -> Dict[str, Any]:
    """calculate_shard_storages takes the sharder itself before TorchRec 1.7, its SharderData since."""
    arg = releases.RELEASE.storage_sharder_arg
    return {arg: sharder if arg == "sharder" else build_sharder_data(sharder)}


def _storage_kwargs(sharding_type: str, compute_device: str, fused: Dict[str, Any]) -> Dict[str, Any]:
    sharder = FrugalEmbeddingBagCollectionSharder(fused_params=fused)
    return dict(
        **_sharder_arg(sharder),
        sharding_type=sharding_type,
        tensor=torch.empty(100, 16, device="meta"),
        compute_device=compute_device,
        compute_kernel="fused",
        shard_sizes=[[25, 16]] * 4,
        batch_sizes=[64],
        world_size=4,
        local_world_size=4,
        input_lengths=[2.0],
        num_poolings=[1.0],
        caching_ratio=0.2,
        is_pooled=True,
        input_data_type_size=8,
        output_data_type_size=4,
    )


def _storages(sharding_type: str, compute_device: str, fused: Dict[str, Any]) -> Any:
    return shard_estimators.calculate_shard_storages(**_storage_kwargs(sharding_type, compute_device, fused))


@pytest.mark.parametrize("opt,state_floats", [(EmbOptimType.EXACT_SGD, 0), (EmbOptimType.EXACT_ROWWISE_ADAGRAD, 1)])
def test_storage_of_frugal_is_the_host_block_plus_own_buffers(opt: EmbOptimType, state_floats: int) -> None:
    inputs, outputs = _io("data_parallel")
    block = 25 * (16 * 4 + 4 * state_floats)
    for s, i, o in zip(_storages(FRUGAL, "cuda", {"optimizer": opt}), inputs, outputs):
        assert (s.hbm, s.ddr, s.ssd) == (i + o, block, 0)
    for s, i, o in zip(_storages(FRUGAL, "cpu", {"optimizer": opt}), inputs, outputs):
        assert (s.hbm, s.ddr, s.ssd) == (0, block + i + o, 0)


def test_storage_of_stock_types_is_torchrec_s() -> None:
    orig = patches.original(_patch(shard_estimators, "calculate_shard_storages"))
    kwargs = _storage_kwargs("row_wise", "cuda", {})
    assert shard_estimators.calculate_shard_storages(**kwargs) == orig(**kwargs)


# ---------------------------------------------------------------------- TorchRec and torch privates
def _resolve(path: str) -> Any:
    """The object at a dotted path: the longest importable module, then attributes."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            obj = getattr(obj, part)
        return obj
    raise ImportError(path)


def _assigns(cls: type, attr: str) -> bool:
    """Whether ``cls``'s own source assigns ``self.<attr>``."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return False
    return any(
        isinstance(n, ast.Attribute)
        and isinstance(n.ctx, ast.Store)
        and n.attr == attr
        and isinstance(n.value, ast.Name)
        and n.value.id == "self"
        for n in ast.walk(tree)
    )


def _private_problem(p: third_party_privates.Private, release: releases.Release) -> Optional[str]:
    """What no longer holds of a private the glue relies on (None: it still holds)."""
    name = p.path.rsplit(".", 1)[-1]
    try:
        if p.guard == third_party_privates.HASHED:
            fn = _resolve(p.hashed)
            if name not in inspect.getsource(fn):
                return f"{p.hashed} no longer names {name}"
            if source_sha256(fn) != release.privates.get(p.hashed):
                return f"the source of {p.hashed} changed"
        elif p.guard == third_party_privates.ASSIGNED:
            owner = _resolve(p.path.rsplit(".", 1)[0])
            if not any(_assigns(c, name) for c in owner.__mro__):
                return f"no class of {owner.__name__}'s MRO assigns self.{name}"
        elif p.guard == third_party_privates.MODULE:
            for n in p.names:
                _resolve(f"{p.path}.{n}")
        elif p.guard == third_party_privates.SHIMMED:
            if not any(f"torchrec.distributed.planner.{s.key}" == p.path for s in planner_shims.PATCHES):
                return "no shim wraps it"
        else:
            return f"unknown guard {p.guard!r}"
    except (ImportError, AttributeError) as e:
        return f"gone ({e})"
    return None


@pytest.mark.parametrize("private", third_party_privates.THIRD_PARTY_PRIVATES.values(), ids=lambda p: ".".join(p.path.split(".")[-2:]))
def test_private_relied_on_is_unchanged(private: third_party_privates.Private) -> None:
    problem = _private_problem(private, releases.RELEASE)
    assert problem is None, (
        f"TorchRec {releases.TORCHREC_VERSION} (torch {torch.__version__}): {private.path}, which the glue relies on "
        f"({private.used_by}): {problem}. Review that use, then record the release in releases.RELEASES"
    )


@pytest.mark.parametrize("release", sorted(releases.RELEASES))
def test_every_release_records_every_hashed_private(release: str) -> None:
    hashed = {p.hashed for p in third_party_privates.THIRD_PARTY_PRIVATES.values() if p.guard == third_party_privates.HASHED}
    assert set(releases.RELEASES[release].privates) == hashed


@pytest.mark.parametrize(
    "private",
    [
        third_party_privates.Private("torch.nn.Module._no_such_function", third_party_privates.HASHED, "nothing"),
        third_party_privates.Private("torch.nn.Module.state_dict", third_party_privates.HASHED, "a source hash not recorded"),
        third_party_privates.Private("torch.nn.Module._no_such_attribute", third_party_privates.ASSIGNED, "nothing"),
        third_party_privates.Private("torch.distributed._shard", third_party_privates.MODULE, "nothing", names=("sharded_tensor.NoSuchName",)),
        third_party_privates.Private("torchrec.distributed.planner.stats._no_such_shim", third_party_privates.SHIMMED, "nothing"),
    ],
    ids=lambda p: p.guard,
)
def test_the_private_guard_fails_when_a_private_changes(private: third_party_privates.Private) -> None:
    assert _private_problem(private, releases.RELEASE) is not None
