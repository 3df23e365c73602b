"""What the example training scripts share: process-group set-up, the sharder, its planner and its
train pipeline under ``--sharder``, collective gathers, argument checks, progress and summary
output, and the Frugal engines' statistics."""
from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.distributed.planner.types import HardwareConfig, KernelConfig, ParameterConstraints, TopologyFactory, TrainerConfig
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
from torchrec.distributed.types import ShardingPlan, ShardingType
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter

from torchrec_frugal import FrugalConfig
from torchrec_frugal.host.launch import free_port

SHARDERS = ("torchrec", "frugal")


def topology(world: int, local_world: int, device: torch.device) -> Topology:
    """The planner's view of the ranks; on CUDA each rank gets its share of its GPU's memory.

    Built by ``TopologyFactory.create_topology``, as TorchRec asks (a Topology constructed directly
    logs a warning from TorchRec 1.8); the result equals ``Topology(world_size=..., ...)``'s.
    """
    hbm = None
    if device.type == "cuda":
        per_gpu = -(-local_world // torch.cuda.device_count())  # ranks sharing each GPU
        hbm = torch.cuda.get_device_properties(device).total_memory // per_gpu
    return TopologyFactory.create_topology(
        trainer_config=TrainerConfig(world_size=world, local_world_size=local_world),
        hardware_config=HardwareConfig(hbm_cap_bytes=hbm),
        kernel_config=KernelConfig(compute_device=device.type),
    )


def cuda_backend(local_world: int, gpus: int) -> str:
    """NCCL with one GPU per rank; gloo where ranks share a GPU (NCCL refuses two ranks on one)."""
    return "nccl" if local_world <= gpus else "gloo"


def bind_cores() -> Optional[List[int]]:
    """Bind this process to its share of the cores it may run on: local rank ``r`` of ``n``
    (torchrun's ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``) takes the ``r``-th of ``n`` equal blocks.
    Call it before any thread starts: threads started afterwards (the process group's, the
    engines', torch's) inherit it. Returns the cores, or None where there are fewer cores than
    ranks (nothing is bound).

    Where the ranks share a machine's cores, the scheduler otherwise moves every rank's threads
    over all of them, so one rank's background work preempts another's training thread and the
    ranks reach their collectives at different times (measured in ``docs/performance.md``).
    """
    local_rank, local_world = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    share = len(cores) // max(local_world, 1)
    if share < 1:
        return None
    mine = cores[local_rank * share : (local_rank + 1) * share]
    os.sched_setaffinity(0, mine)
    return mine


def init_distributed() -> Tuple[int, int, int, int, torch.device, str]:
    """(rank, world, local_rank, local_world, device, backend) from torchrun's environment.

    CUDA: rank ``local_rank`` uses GPU ``local_rank % device_count``. With one GPU per rank the
    process group is NCCL; with more local ranks than GPUs (2 or 4 ranks on a one-GPU machine)
    the ranks share GPUs and the group is gloo. CPU: gloo.
    """
    if "RANK" not in os.environ:  # plain `python train.py`: one rank
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if torch.cuda.is_available():
        gpus = torch.cuda.device_count()
        device = torch.device("cuda", local_rank % gpus)
        torch.cuda.set_device(device)
        backend = cuda_backend(local_world, gpus)
        if backend == "gloo" and rank == 0:
            print(
                f"[ranks] {local_world} ranks share {gpus} GPU(s): gloo process group (NCCL refuses two ranks on "
                f"one GPU); on a machine with a GPU per rank, torchrun --nproc_per_node={gpus} runs NCCL",
                flush=True,
            )
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        store = restart_scoped_store(world)
        if store is None:
            dist.init_process_group(backend=backend)
        else:
            dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world)
    return rank, world, local_rank, local_world, device, backend


def restart_scoped_store(world: int) -> Optional[dist.Store]:
    """torchrun's shared store, with a key prefix per restart; None outside torchrun's shared store.

    torchrun (``--max-restarts``) hands every attempt the same TCPStore without a per-attempt key
    prefix, so a restarted gloo group reads the dead attempt's addresses and fails to connect
    (pytorch/pytorch#135712). One machine has one agent, so its restart count names the attempt.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False)
    return dist.PrefixStore(f"/worker/attempt_{attempt}", store)


def require_cuda_fbgemm(device: torch.device, what: str) -> None:
    """Stop with a clear message where ``what`` needs FBGEMM's CUDA kernels and only its CPU build is installed.

    Stock TorchRec shardings run FBGEMM's fused kernels on the device, and frugal_row_wise runs
    TorchRec's row-wise dists (FBGEMM's bucketize and permute ops); "frugal" tables run none, so
    plans of "frugal" tables only train on CUDA with the small CPU build (fbgemm-gpu-cpu).
    """
    import fbgemm_gpu

    if device.type == "cuda" and getattr(fbgemm_gpu, "__variant__", "") == "cpu":
        raise SystemExit(
            f"{what} on CUDA runs FBGEMM's CUDA kernels, but the installed fbgemm_gpu "
            f"{fbgemm_gpu.__version__} is the CPU build (fbgemm-gpu-cpu): install the CUDA build "
            "(fbgemm-gpu) for it, or shard every table \"frugal\" (--sharder frugal on one node), which needs no "
            "FBGEMM CUDA kernel"
        )


def add_frugal_arguments(p: argparse.ArgumentParser) -> None:
    """The options that tune Frugal (``--sharder frugal``) beyond the cache ratio and the lookahead."""
    p.add_argument("--queue", choices=("two_level", "heap"), default="two_level", help="frugal: pending-write queue (heap: ablation)")
    p.add_argument("--flush-workers", type=int, default=None,
                   help="frugal: background flusher threads per rank; none: 1 on CUDA, 0 on CPU")  # fmt: skip
    p.add_argument("--max-deferred-rows", type=int, default=FrugalConfig.max_deferred_rows,
                   help="frugal: rows with no read in the window that may wait before the flushers drain them")  # fmt: skip
    p.add_argument("--presample-steps", type=int, default=50, help="frugal: batches counted to pick the cached rows")
    p.add_argument("--hardware", default=None,
                   help="frugal: plan with the cost model on this hardware profile (a name such as cpu or rtx3090, or a "
                        "JSON file): per table frugal or a stock sharding, and the cache ratio and lookahead, by least "
                        "predicted step time (they replace --cache-ratio and --lookahead)")  # fmt: skip


def frugal_config(args: argparse.Namespace) -> FrugalConfig:
    """Frugal's configuration from the command line (``--cache-ratio``, ``--lookahead`` and :func:`add_frugal_arguments`'s)."""
    return FrugalConfig(
        lookahead=args.lookahead,
        cache_ratio=args.cache_ratio,
        queue=args.queue,
        flush_workers=args.flush_workers,
        max_deferred_rows=args.max_deferred_rows,
    )


def stock_constraints(tables: Sequence[str], sharding: str) -> Dict[str, ParameterConstraints]:
    """Every table of ``tables`` on the stock ``sharding``, with its kernel: dense for data_parallel, fused otherwise."""
    dense = sharding == ShardingType.DATA_PARALLEL.value
    kernel = (EmbeddingComputeKernel.DENSE if dense else EmbeddingComputeKernel.FUSED).value
    return {t: ParameterConstraints(sharding_types=[sharding], compute_kernels=[kernel]) for t in tables}


@dataclass(frozen=True)
class PlannedSharding:
    """What :func:`shard_plan` settled on: the sharder and plan for DistributedModelParallel, and
    the cache ratio and lookahead the frugal tables run with, as planned (with ``--hardware`` the
    planner's choice, not the options'): the run's plan line, its train pipeline and its summary
    report these."""

    sharder: nn.Module
    plan: ShardingPlan
    lookahead: Optional[int]  # the window the engines use; None under the stock sharder
    cache_ratio: Optional[float]  # the smallest a frugal table got; None without a frugal table

    @property
    def shardings(self) -> Dict[str, str]:
        """Each table's sharding type."""
        return plan_shardings(self.plan)

    def describe(self) -> str:
        """``frugal x20, table_wise x6 (cache 0.05, L=10)``, without the counts for one table and
        without the cache and L where no table is frugal: the run's plan line."""
        counts: Dict[str, int] = {}
        for kind in self.shardings.values():
            counts[kind] = counts.get(kind, 0) + 1
        order = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        kinds = ", ".join(f"{k} x{n}" for k, n in order) if len(self.shardings) > 1 else order[0][0]
        if self.cache_ratio is None:
            return kinds
        return f"{kinds} (cache {self.cache_ratio:g}, L={self.lookahead})"


def shard_plan(
    args: argparse.Namespace,
    model: nn.Module,
    device: torch.device,
    tables: Sequence[str],
    stock_sharder: Callable[[], nn.Module],
    frugal_sharder: Callable[[FrugalConfig], nn.Module],
    batch_per_rank: Optional[int] = None,
) -> PlannedSharding:
    """The sharder and plan of ``--sharder`` (collective: rank 0 plans, the others receive the plan).

    torchrec: ``stock_sharder()`` under TorchRec's planner, every table of ``tables`` on ``--sharding``.
    frugal: ``frugal_sharder(config)`` under FrugalShardingPlanner, which sizes the caches (at most
    ``--cache-ratio`` per rank, less if device memory is short); on several nodes (LOCAL_WORLD_SIZE
    below the world size) it puts the tables on frugal_row_wise, as ``--sharding frugal_row_wise``
    asks explicitly. With ``--hardware`` the planner chooses each table's sharding, the cache ratio
    and L by the cost model (L is 0 when no table went frugal: nothing to read ahead for);
    ``batch_per_rank`` is the batch the model prices. ``args`` is left as parsed.
    """
    pg = dist.GroupMember.WORLD
    world = dist.get_world_size(pg)
    topo = topology(world, int(os.environ.get("LOCAL_WORLD_SIZE", world)), device)
    if args.sharder == "frugal":
        from torchrec_frugal.torchrec import FRUGAL, FRUGAL_ROW_WISE, FrugalShardingPlanner

        config = frugal_config(args)
        sharder = frugal_sharder(config)
        hardware = args.hardware
        if hardware is not None and batch_per_rank is None:
            raise ValueError("shard_plan: --hardware needs the batch per rank the cost model prices")
        constraints = None
        if args.sharding == FRUGAL_ROW_WISE:
            if topo.local_world_size == world:
                raise SystemExit(
                    f"--sharding {FRUGAL_ROW_WISE} splits tables over nodes, but all {world} ranks run on one node "
                    "(LOCAL_WORLD_SIZE): launch one torchrun per node (--nnodes), or use --sharder frugal"
                )
            constraints = {t: ParameterConstraints(sharding_types=[FRUGAL_ROW_WISE]) for t in tables}
        planner: Any = FrugalShardingPlanner(
            topology=topo, config=config, hardware=hardware, batch_size=batch_per_rank, constraints=constraints
        )
        plan = planner.collective_plan(model, [sharder], pg)
        stock = sorted({t for t in plan_shardings(plan).values() if t != FRUGAL})
        if stock:  # frugal_row_wise's dists and stock tables run FBGEMM ops on the device
            require_cuda_fbgemm(device, f"this plan ({', '.join(stock)} tables)")
        lookahead = config.lookahead
        if hardware is not None:
            lookahead = planner.lookahead if planner.lookahead is not None else 0
        # the planner's sharder carries its L (the one given stays as it was)
        return PlannedSharding(planner.sharders()[0], plan, lookahead, planned_cache_ratio(plan))
    sharder = stock_sharder()
    planner = EmbeddingShardingPlanner(
        topology=topo,
        constraints=stock_constraints(tables, args.sharding),
        storage_reservation=stock_storage_reservation(model, [sharder]),
    )
    return PlannedSharding(sharder, planner.collective_plan(model, [sharder], pg), None, None)


def stock_storage_reservation(model: nn.Module, sharders: Sequence[nn.Module], percentage: float = 0.15) -> Any:
    """TorchRec's default storage reservation (``HeuristicalStorageReservation(0.15)``: 15% of device
    memory, 6x the dense parameters' bytes, the input KJTs), given the ``dense_tensor_estimate``
    TorchRec asks for, measured here as TorchRec measures it, so that neither of its warnings about
    the estimate (a dry run's over-estimate; our dense parameters are materialized) applies.
    FrugalShardingPlanner's default, torchrec_frugal.torchrec.planner.storage_reservations, does the same; importing it
    here would install Frugal's planner shims, which stock runs go without."""
    import warnings

    from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation
    from torchrec.distributed.types import get_tensor_size_bytes

    types = {s.module_type for s in sharders}  # type: ignore[attr-defined]
    shardable = [m for m in model.modules() if type(m) in types]

    def size(m: nn.Module) -> int:
        return round(sum(6.0 * get_tensor_size_bytes(p) for p in m.parameters()) + sum(get_tensor_size_bytes(b) for b in m.buffers()))

    dense = max(1, size(model) - sum(size(m) for m in shardable))  # TorchRec reads 0 as "none given"
    with warnings.catch_warnings():  # its FutureWarning recommends the dense_tensor_estimate passed here
        warnings.filterwarnings("ignore", message="HeuristicalStorageReservation is known", category=FutureWarning)
        return HeuristicalStorageReservation(percentage, dense_tensor_estimate=dense)


def seeded_init(bound: float, seed: int, perturbation: float = 0.0) -> Callable[[torch.Tensor], torch.Tensor]:
    """A table's ``init_fn``: U(-bound, bound) as a function of (seed, row) only, so every sharding
    starts from the same table. It fills a whole table (what a frugal engine over one node hands
    it) or the local shards of a ShardedTensor, each at its offsets. A plain block of rows other
    than the whole table (a frugal_row_wise engine's, a stock row_wise shard's) does not say where it
    starts: such tables take :func:`reseed_tables` after sharding. ``perturbation``: each value times
    1 +- it, the sign drawn as the values are (a function of seed and row)."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    from examples.graph.models import seeded_uniform_

    def values(out: torch.Tensor, first_row: int = 0) -> torch.Tensor:
        seeded_uniform_(out, bound, seed, first_row=first_row)
        if perturbation:
            signs = torch.sign(seeded_uniform_(torch.empty(out.shape), 1.0, seed + 7_919, first_row=first_row))
            with torch.no_grad():
                out.mul_(1.0 + perturbation * signs.to(out.device))
        return out

    def init(weights: torch.Tensor) -> torch.Tensor:
        if not isinstance(weights, ShardedTensor):
            return values(weights)
        width = int(weights.size(1))
        for shard in weights.local_shards():
            r0, c0 = (int(x) for x in shard.metadata.shard_offsets)
            rows, cols = (int(x) for x in shard.metadata.shard_sizes)
            full = values(torch.empty(rows, width), r0)
            with torch.no_grad():
                shard.tensor.copy_(full[:, c0 : c0 + cols])
        return weights

    return init


def reseed_tables(dmp: nn.Module, inits: Dict[str, Callable[[torch.Tensor], torch.Tensor]]) -> None:
    """Give the tables of ``inits`` (by name) their ``init_fn``'s values through the state_dict
    (collective): each rank fills its shards, and the sharded modules load them (frugal engines
    load through their host tables and caches)."""
    if not inits:
        return
    state = dmp.state_dict()
    values = {}
    for key, value in state.items():
        name = key.rsplit(".", 2)[-2] if key.endswith(".weight") else None
        if name in inits:
            values[key] = inits[name](value)
    dmp.load_state_dict(values, strict=False)


def plan_shardings(plan: ShardingPlan) -> Dict[str, str]:
    """The sharding type of every table in ``plan`` (what a planner chose, for the run's summary)."""
    return {name: ps.sharding_type for module_plan in plan.plan.values() for name, ps in module_plan.items()}  # type: ignore[attr-defined]


def planned_cache_ratio(plan: ShardingPlan) -> Optional[float]:
    """The smallest cache ratio the plan gives a frugal table (None without one): read from the
    plan itself, which rank 0 made and broadcast."""
    from torchrec_frugal.torchrec.types import FRUGAL_TYPES

    ratios = {
        ps.cache_params.load_factor
        for module_plan in plan.plan.values()
        for ps in module_plan.values()  # type: ignore[attr-defined]
        if ps.sharding_type in FRUGAL_TYPES and ps.cache_params is not None
    }
    return min(ratios) if ratios else None


def combined_optimizer(dmp: nn.Module, dense: Callable[[List[torch.Tensor]], torch.optim.Optimizer]) -> CombinedOptimizer:
    """The tables' fused optimizer (it steps in backward) with ``dense(params)`` for every other parameter."""
    dense_opt = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(dmp.named_parameters())), dense)
    return CombinedOptimizer([dmp.fused_optimizer, dense_opt])  # type: ignore[list-item]


def train_pipeline(planned: PlannedSharding, dmp: nn.Module, opt: Any, device: torch.device) -> Any:
    """The train pipeline of the plan's sharder: Frugal's lookahead pipeline reading the planned
    window ahead, or TorchRec's TrainPipelineSparseDist."""
    if planned.lookahead is not None:
        from torchrec_frugal.torchrec import FrugalTrainPipeline

        return FrugalTrainPipeline(dmp, opt, device, lookahead=planned.lookahead)
    return TrainPipelineSparseDist(dmp, opt, device)


def gather_cat(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """All ranks' equal-shaped ``t``, concatenated (collective): gathered on ``device`` under NCCL
    (which takes device tensors only), on CPU under gloo."""
    on = device if dist.get_backend() == "nccl" else torch.device("cpu")
    t = t.to(on)
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return torch.cat(out).cpu()


def check_sharding(p: argparse.ArgumentParser, args: argparse.Namespace, frugal_row_wise: str = "frugal_row_wise") -> None:
    """``--sharding`` against ``--sharder``: ``frugal_row_wise`` is Frugal's (and implies it); a stock
    sharding is TorchRec's sharder's, which Frugal's would ignore: refused, not ignored. Without
    ``--sharding`` TorchRec's sharder puts every table table_wise."""
    if args.sharding == frugal_row_wise:
        if args.sharder == "torchrec":
            p.error(f"--sharding {frugal_row_wise} is Frugal's across nodes: drop --sharder torchrec")
        args.sharder = "frugal"
    elif args.sharding is None:
        args.sharding = ShardingType.TABLE_WISE.value
    elif args.sharder == "frugal":
        p.error(f"--sharding {args.sharding} is a stock TorchRec sharding, which --sharder frugal (the default) does not "
                f"use: add --sharder torchrec for it, or drop --sharding ({frugal_row_wise} is Frugal's across nodes)")


def check_frugal_config(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Frugal's options as :class:`FrugalConfig` validates them, before any rank builds one."""
    if args.sharder != "frugal":
        return
    try:
        frugal_config(args)
    except (TypeError, ValueError) as e:
        p.error(f"{e} (--lookahead, --cache-ratio, --flush-workers, --max-deferred-rows)")


def check_hardware(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--hardware`` plans with FrugalShardingPlanner: refuse it beside TorchRec's own sharder
    rather than ignore it."""
    if args.hardware is not None and args.sharder != "frugal":
        p.error(f"--hardware {args.hardware} plans with FrugalShardingPlanner, which only --sharder frugal uses "
                f"(got --sharder {args.sharder}); add --sharder frugal")


def check_steps(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Validate ``--steps`` and default ``--warmup`` to min(20, steps // 5)."""
    if args.steps < 1:
        p.error("--steps must be >= 1")
    if args.warmup is None:
        args.warmup = min(20, args.steps // 5)
    if not 0 <= args.warmup < args.steps:
        p.error("--warmup must be in [0, steps)")


def progress_bar(rank: int, args: argparse.Namespace) -> Optional[Any]:
    """A tqdm bar over ``--steps`` on rank 0, unless ``--no-progress`` or its output is not a terminal
    (a log file would hold every redraw of the bar, between the log lines)."""
    import sys

    if rank != 0 or args.no_progress or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=args.steps, desc=f"{args.sharder}", unit="step", dynamic_ncols=True, mininterval=1.0)


def write_summary(path: Optional[str], summary: Dict[str, Any]) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w") as f:
            json.dump(summary, f, indent=2)


class FrugalStats:
    """Per-step gate waits, cache hits and flushes of this rank's Frugal engines (empty for stock)."""

    def __init__(self, model: nn.Module) -> None:
        self.engines: List[Any] = []
        self.reset()
        if not any(type(m).__module__.startswith("torchrec_frugal") for m in model.modules()):
            return
        from torchrec_frugal.torchrec import FrugalShardedEmbeddingBagCollection, FrugalShardedEmbeddingCollection

        for m in model.modules():
            if isinstance(m, (FrugalShardedEmbeddingBagCollection, FrugalShardedEmbeddingCollection)):
                self.engines.extend(m.frugal_engines())

    def reset(self) -> None:
        self.gate_wait_s = 0.0
        self.exchange_wait_s = 0.0
        self.lookups = 0
        self.cache_hits = 0
        self.rows_flushed = 0
        self.bytes_flushed = 0
        self.pending_rows = 0
        self.steps = 0
        self.phase_s: Dict[str, float] = {}

    def record(self) -> None:
        """Add the metrics of the steps each engine finished since the last call."""
        for i, e in enumerate(self.engines):
            for m in e.take_metrics():
                self._add(i, m)

    def _add(self, i: int, m: Any) -> None:
        self.gate_wait_s += m.gate_wait_s
        self.exchange_wait_s += m.exchange_wait_s
        self.lookups += m.lookups
        self.cache_hits += m.cache_hits
        self.rows_flushed += m.rows_flushed
        self.bytes_flushed += m.bytes_flushed
        self.pending_rows = m.pending_rows
        self.steps += 1 if i == 0 else 0
        for k, v in m.phase_s.items():
            self.phase_s[k] = self.phase_s.get(k, 0.0) + v

    @property
    def cache_hit_ratio(self) -> float:
        return self.cache_hits / self.lookups if self.lookups else 0.0
