"""Train the paper's DLRM configurations with stock TorchRec sharding or with Frugal.

    torchrun --nproc_per_node=2 examples/dlrm/train.py --config criteo-kaggle                        # Frugal
    torchrun --nproc_per_node=2 examples/dlrm/train.py --config criteo-kaggle --sharder torchrec --sharding table_wise
    torchrun --nproc_per_node=2 examples/dlrm/train.py --model paper --config criteo-kaggle --scale 0.05 --sharder frugal

Two models. ``--model dlrm`` (default): TorchRec's DLRM over one table per field plus the dense
features. ``--model paper``: the authors' own DLRM benchmark (their ``perf_rec_model.py``): one
table over one ID space of the dataset's capacity, 21 or 26 ids a sample sum-pooled into one
vector, MLP 32-512-256-1, MSE against random labels, SGD on table and MLP.

``--sharder`` is the only switch between the two: it picks the sharder (torchrec_frugal's
``FrugalEmbeddingBagCollectionSharder``, the default, or TorchRec's ``EmbeddingBagCollectionSharder``),
the planner that goes with it, and the train pipeline that goes with it
(``TrainPipelineSparseDist``, or Frugal's lookahead pipeline). Model, data, optimizers (fused
row-wise Adagrad for the tables, Adagrad or SGD for the dense parameters), metrics and timing
are the same code.

CPU: gloo, one process per rank (``torchrun --nproc_per_node=N``). CUDA: with one GPU per rank, NCCL
for the dense all-reduce (and TorchRec's all-to-alls); more ranks than GPUs (2 or 4 ranks on one GPU)
share the GPUs over gloo. ``--sharder frugal`` needs no FBGEMM CUDA kernel (the CPU build of FBGEMM,
fbgemm-gpu-cpu, will do); ``--sharder torchrec`` on CUDA needs FBGEMM's CUDA build (fbgemm-gpu).

Metrics. ``loss`` is the mean training loss over the last ``--auc-window`` steps of every rank;
``auc`` is the AUC of the predictions made on those steps' batches *before* the batch's update
(progressive validation: every synthetic batch is fresh data). ``samples_per_second`` counts
the steps after ``--warmup``, all ranks together, from a barrier before the first timed step to a
barrier after the last. ``gate_stall_fraction`` is the share of that wall time the ranks spent
waiting at Frugal's gate (0 for stock TorchRec, which has no gate).

Checkpoints (``--checkpoint-dir``, ``--checkpoint-every``, ``--checkpoint-keep``; see
``examples/checkpointing.py``): model, fused and dense optimizer state through
torch.distributed.checkpoint, plus each rank's metric windows. A run started on a directory
holding a complete checkpoint resumes from the newest one (``torchrun --max-restarts=N`` restarts
a job that lost a rank this way) and ends with the tables, loss and AUC of an uninterrupted run;
its throughput figures cover the steps it ran and leave out the time spent saving.
"""
from __future__ import annotations

import argparse
import functools
import gc
import itertools
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

if __package__ in (None, ""):  # launched as a script: make `examples.dlrm` importable (appended: an installed torchrec_frugal wins)
    sys.path.append(str(Path(__file__).resolve().parents[2]))

import torch
import torch.distributed as dist
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
from torchrec.datasets.utils import Batch
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.types import ShardingEnv, ShardingType
from torchrec.models.dlrm import DLRM, DLRMTrain, OverArch, SparseArch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_frugal import FrugalConfig

from examples import checkpointing
from examples.arguments import ArgumentParser
from examples.comm_counter import CommCounter
from examples.common import (
    SHARDERS,
    FrugalStats,
    add_frugal_arguments,
    check_frugal_config,
    check_hardware,
    check_sharding,
    check_steps,
    combined_optimizer,
    gather_cat,
    init_distributed,
    progress_bar,
    require_cuda_fbgemm,
    reseed_tables,
    seeded_init,
    shard_plan,
    train_pipeline,
    write_summary,
)
from examples.dlrm.configs import BATCH_SIZES, CACHE_RATIO, CACHE_RATIOS, DATASETS, LOOKAHEAD, ModelConfig, RunConfig, describe, get_config
from examples.stock_warnings import quiet_stock_warnings
from examples.dlrm.data import (
    SyntheticClickData,
    SyntheticPaperData,
    auc,
    count_ids,
    criteo_npy_batches,
    criteo_tsv_batches,
    npy_files,
    paper_npy_batches,
    paper_npy_files,
    tsv_paths,
)
from torchrec_frugal.datasets import EMBEDDING_OPTIMIZERS, MODEL_KINDS

# What a checkpoint keeps of the metrics, per rank: the loss, logit and label windows and the first window.
METRIC_BUFFERS = ("losses", "logits", "labels", "first_logits", "first_labels")
STOCK_SHARDINGS = (
    ShardingType.TABLE_WISE.value,
    ShardingType.ROW_WISE.value,
    ShardingType.TABLE_ROW_WISE.value,
    ShardingType.DATA_PARALLEL.value,
)
FRUGAL_ROW_WISE = "frugal_row_wise"  # Frugal inside each node, row_wise across nodes (frugal sharder)


# ---------------------------------------------------------------------------- models
class PaperDLRM(nn.Module):
    """The authors' DLRM benchmark model (``SimpleDLRM`` in their ``perf_rec_model.py``): each
    sample's ids of the one table sum-pooled into one vector (the EmbeddingBagCollection's SUM
    pooling), then the MLP ``embedding_dim``-``layer_sizes`` with a ReLU between layers, weights
    N(0, 2 / (fan_in + fan_out)) and biases N(0, 1 / fan_out) as they draw them (from torch's
    seeded generator here).

    One departure: their code also puts a ReLU after the last layer. With that init the last bias
    is N(0, 1), so for about half the seeds that ReLU is 0 on every sample, no gradient reaches the
    table, and two shardings agree whatever they do. Without it the output is the regression's
    prediction and every step trains the table; the work differs by one ReLU over B values."""

    def __init__(
        self, embedding_bag_collection: EmbeddingBagCollection, layer_sizes: Sequence[int], dense_device: Optional[torch.device] = None
    ) -> None:
        super().__init__()
        self.sparse_arch = SparseArch(embedding_bag_collection)
        (config,) = embedding_bag_collection.embedding_bag_configs()
        widths = [config.embedding_dim, *layer_sizes]
        layers: List[nn.Module] = []
        for n, m in zip(widths, widths[1:]):
            linear = nn.Linear(n, m, device=dense_device)
            with torch.no_grad():
                linear.weight.normal_(0.0, (2.0 / (m + n)) ** 0.5)
                linear.bias.normal_(0.0, (1.0 / m) ** 0.5)
            layers += [linear, nn.ReLU()]
        self.mlp = nn.Sequential(*layers[:-1])

    def forward(self, dense_features: torch.Tensor, sparse_features: KeyedJaggedTensor) -> torch.Tensor:
        return self.mlp(self.sparse_arch(sparse_features).flatten(1))  # [B, 1, D] -> [B, D]


def table_inits(cfg: RunConfig, rows: Sequence[int], perturbation: float = 0.0) -> Dict[str, Any]:
    """Each table's ``init_fn``: U(+-1/sqrt(rows)) (TorchRec's default range) drawn from ``cfg.seed``
    and the table's index, the same values whatever the sharder and sharding (:func:`seeded_init`),
    each value times 1 +- ``perturbation`` if given."""
    return {
        t: seeded_init((1.0 / n) ** 0.5, cfg.seed * 1_009 + i + 1, perturbation)
        for i, (t, n) in enumerate(zip(cfg.dataset.table_names(), rows))
    }


def build_model(cfg: RunConfig, rows: Sequence[int], device: torch.device, perturbation: float = 0.0) -> DLRMTrain:
    """DLRMTrain around TorchRec's DLRM (BCE loss) or the authors' benchmark model (MSE loss),
    tables on the meta device with the sharding-independent init of :func:`table_inits`."""
    m = cfg.model
    inits = table_inits(cfg, rows, perturbation)
    tables = [
        EmbeddingBagConfig(name=t, embedding_dim=m.embedding_dim, num_embeddings=n, feature_names=[f], init_fn=inits[t])
        for t, f, n in zip(cfg.dataset.table_names(), cfg.dataset.feature_names, rows)
    ]
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    dense_in = cfg.dataset.dense_width
    if m.kind == "dlrm":
        net: nn.Module = DLRM(
            embedding_bag_collection=ebc,
            dense_in_features=dense_in,
            dense_arch_layer_sizes=list(m.dense_arch_layers),
            over_arch_layer_sizes=list(m.over_arch_layers),
            dense_device=device,
        )
    else:
        net = PaperDLRM(ebc, m.mlp_layers, dense_device=device)
    train = DLRMTrain(net)  # type: ignore[arg-type]  # any (dense, KJT) -> logits module works
    if m.kind == "paper":
        train.loss_fn = nn.MSELoss()  # the authors' loss, against random 0/1 labels
    return train


# ---------------------------------------------------------------------------- sharders
class StockSharder(EmbeddingBagCollectionSharder):
    """TorchRec's sharder, offering row_wise and table_row_wise on CPU too (the stock one offers
    them on CUDA only; they train on CPU over gloo)."""

    def sharding_types(self, compute_device_type: str) -> List[str]:
        types = super().sharding_types(compute_device_type)
        for t in (ShardingType.ROW_WISE.value, ShardingType.TABLE_ROW_WISE.value):
            if t not in types:
                types.append(t)
        return types


def fused_params(cfg: RunConfig) -> Dict[str, Any]:
    """The tables' fused optimizer, as FBGEMM's TBE takes it: exact row-wise Adagrad or exact SGD."""
    if cfg.embedding_optimizer == "sgd":
        return {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": cfg.embedding_lr}
    return {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": cfg.embedding_lr, "eps": 1e-8}


def frugal_sharder(cfg: RunConfig, presample: Dict[str, torch.Tensor], config: FrugalConfig) -> nn.Module:
    """Frugal's sharder of the tables, imported on use: the import installs Frugal's planner shims,
    which stock runs go without."""
    from torchrec_frugal.torchrec import FrugalEmbeddingBagCollectionSharder

    return FrugalEmbeddingBagCollectionSharder(fused_params=fused_params(cfg), config=config, presample_counts=presample)


# ---------------------------------------------------------------------------- data
def data_iterator(
    args: argparse.Namespace, cfg: RunConfig, rows: Sequence[int], rank: int, world: int, start: int = 0
) -> Tuple[Iterator[Batch], Dict[str, torch.Tensor]]:
    """(this rank's training batches ``start`` .. --steps - 1; pre-sample id counts for the caches).

    A run resumed at ``start`` trains on the batches an uninterrupted run trains on from there
    (synthetic batches are functions of (seed, rank, step); real data is read again and skipped),
    and the pre-sample, hence the cached rows, does not depend on ``start``.
    """
    names = cfg.dataset.table_names()
    if args.data == "synthetic":
        source = SyntheticPaperData if cfg.model.kind == "paper" else SyntheticClickData
        gen = source(cfg.dataset, rows, cfg.batch_size, seed=cfg.seed, skew=cfg.skew)
        presample = gen.presample_counts([rank], args.presample_steps) if args.sharder == "frugal" else {}
        pin = torch.cuda.is_available() and args.loader_workers > 0
        return gen.batches(rank, start, args.steps - start, workers=args.loader_workers, pin=pin), presample

    def real() -> Iterator[Batch]:
        if args.data == "paper-npy":
            return paper_npy_batches(args.data_path, cfg.dataset, rows[0], cfg.batch_size, rank, world, seed=cfg.seed)
        if args.data == "criteo-tsv":
            return criteo_tsv_batches(
                tsv_paths(args.data_path), cfg.dataset, rows, cfg.batch_size, rank, world, repeat=True
            )
        return criteo_npy_batches(args.data_path, cfg.dataset, rows, cfg.batch_size, rank, world, repeat=True)

    presample = count_ids(itertools.islice(real(), args.presample_steps), names, rows) if args.sharder == "frugal" else {}
    return itertools.islice(real(), start, args.steps), presample


# ---------------------------------------------------------------------------- training
def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--config", choices=sorted(DATASETS), default="criteo-kaggle", help="the dataset's table shapes (configs.py)")
    p.add_argument("--scale", type=float, default=None, help="row-count scale; none: the config's, which fits 24 GiB")
    p.add_argument("--min-rows", type=int, default=1000, help="tables are not scaled below min(cardinality, this)")
    p.add_argument("--batch-size", type=int, default=1024, help=f"per rank (paper: {BATCH_SIZES})")
    p.add_argument("--cache-ratio", type=float, default=CACHE_RATIO, help=f"frugal: rows cached per rank (paper: {CACHE_RATIOS})")
    p.add_argument("--lookahead", type=int, default=LOOKAHEAD, help="frugal: lookahead window L")
    p.add_argument("--steps", type=int, default=300, help="training steps per rank (bounds the run)")
    p.add_argument("--warmup", type=int, default=None, help="untimed first steps; none: min(20, steps // 5)")
    p.add_argument("--sharder", choices=SHARDERS, default="frugal",
                   help="Frugal's sharder, planner and pipeline, or TorchRec's EmbeddingBagCollectionSharder, planner "
                        "and TrainPipelineSparseDist")  # fmt: skip
    p.add_argument("--sharding", choices=STOCK_SHARDINGS + (FRUGAL_ROW_WISE,), default=None,
                   help="torchrec: sharding of every table (none: table_wise); frugal_row_wise (implies --sharder "
                        "frugal): every table in one row block per node, each served inside its node by Frugal (jobs of "
                        "several nodes)")  # fmt: skip
    p.add_argument("--model", choices=MODEL_KINDS, default="dlrm",
                   help="dlrm: TorchRec's DLRM over one table per field and the dense features; paper: the authors' "
                        "benchmark, one table of the dataset's capacity, its ids sum-pooled, MLP 32-512-256-1, MSE")  # fmt: skip
    p.add_argument("--mlp", default=None, help="paper: the MLP's layer widths after the pooled vector, comma-separated "
                   "(the authors' --with_nn; default 512,256,1, swept 256,1 .. 512,512,512,512,256,1)")  # fmt: skip
    p.add_argument("--embedding-optimizer", choices=EMBEDDING_OPTIMIZERS, default=None,
                   help="tables' fused optimizer (exact); none: rowwise_adagrad for dlrm, sgd for paper")
    p.add_argument("--embedding-lr", type=float, default=None, help="tables; none: 0.05 for dlrm, 0.01 for paper")
    p.add_argument("--dense-lr", type=float, default=None, help="dense parameters; none: 0.005 for dlrm, 0.01 for paper")
    p.add_argument("--dense-optimizer", choices=("adagrad", "sgd"), default=None,
                   help="dense parameters; none: adagrad for dlrm, sgd for paper")
    p.add_argument("--data", choices=("synthetic", "criteo-tsv", "criteo-npy", "paper-npy"), default="synthetic",
                   help="synthetic: skewed ids, no files (dlrm: clicks with planted labels; paper: random labels); "
                        "criteo-*: Criteo files at --data-path (dlrm); paper-npy: the authors' binary files (paper)")  # fmt: skip
    p.add_argument("--data-path", default=None, help="criteo-tsv: a file or directory; criteo-npy: a directory of "
                   "*_{dense,sparse,labels}.npy; paper-npy: the prefix of <prefix>.npy and <prefix>_offsets.npy")  # fmt: skip
    add_frugal_arguments(p)
    p.add_argument("--loader-workers", type=int, default=1,
                   help="synthetic data: worker processes that make batches ahead, off the training thread")
    p.add_argument("--seed", type=int, default=0, help="tables, dense layers and synthetic data")
    p.add_argument(
        "--init-perturbation", type=float, default=0.0,
        help="multiply each initial table value by 1 +- this (a seeded sign): how far the model carries a rounding-sized difference",
    )  # fmt: skip
    p.add_argument("--auc-window", type=int, default=100, help="steps whose predictions the final loss and AUC cover")
    p.add_argument("--log-every", type=int, default=50, help="rank 0 logs samples/s, loss and AUC every N steps (0: never)")
    p.add_argument("--threads", type=int, default=None, help="torch threads per rank; none: cores / local ranks")
    p.add_argument("--summary", default=None, help="write a JSON summary here (rank 0)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--count-comm", action="store_true",
                   help="count the bytes the embedding collectives send between nodes and within a node (summary 'comm')")  # fmt: skip
    checkpointing.add_arguments(p)
    args = p.parse_args(argv)
    check_sharding(p, args, FRUGAL_ROW_WISE)
    check_model(p, args)
    check_data_path(p, args)
    check_hardware(p, args)
    check_steps(p, args)
    checkpointing.check_arguments(p, args)
    check_frugal_config(p, args)
    try:
        run_config(args)
    except ValueError as e:
        p.error(str(e))
    return args


NPY_PREP = "python -m torchrec.datasets.scripts.npy_preproc_criteo --input_dir DIR_OF_TSVS --output_dir {out} --dataset_name {name}"
DATA_HELP = (
    "; or leave out --data to train on synthetic clicks, which need no files. "
    "Criteo's click logs (Kaggle train.txt, 1TB day_0 .. day_23) come from Criteo's site, see examples/dlrm/README.md"
)


def check_model(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--model`` against the options that belong to one model only, and ``--mlp``'s widths."""
    paper_data = args.data in ("synthetic", "paper-npy")
    if args.model == "paper" and not paper_data:
        p.error(f"--data {args.data} holds Criteo's fields, one table each: train it with --model dlrm "
                "(the paper's model reads --data synthetic or paper-npy)")  # fmt: skip
    if args.model == "dlrm" and args.data == "paper-npy":
        p.error("--data paper-npy is the authors' one-table format: train it with --model paper")
    if args.mlp is not None and args.model != "paper":
        p.error(f"--mlp {args.mlp} shapes the paper's model; --model {args.model} has its own layers")
    if args.mlp is not None:
        try:
            widths = tuple(int(w) for w in args.mlp.split(",") if w.strip())
        except ValueError:
            widths = ()
        if not widths or widths[-1] != 1 or min(widths) < 1:
            p.error(f"--mlp {args.mlp}: expected positive layer widths, comma-separated, ending in 1 (e.g. 512,256,1)")
        args.mlp = widths


def check_data_path(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--data-path`` against ``--data``, before any rank starts: a missing or empty path stops
    here, saying what was expected and how to make it."""
    if args.data == "synthetic":
        if args.data_path:
            p.error(f"--data-path {args.data_path} is read only with --data criteo-tsv or criteo-npy (--data is synthetic)")
        return
    if not args.data_path:
        what = {"criteo-tsv": "a Criteo TSV file (e.g. train.txt) or a directory of them",
                "criteo-npy": "a directory of <prefix>_{dense,sparse,labels}.npy files",
                "paper-npy": "the prefix of the authors' <prefix>.npy (ids) and <prefix>_offsets.npy"}[args.data]  # fmt: skip
        p.error(f"--data {args.data} needs --data-path: {what}" + DATA_HELP)
    if args.data == "paper-npy":
        try:
            paper_npy_files(args.data_path)
        except FileNotFoundError as e:
            p.error(f"--data paper-npy --data-path {args.data_path}: no {e}; expected <prefix>.npy (every sample's ids "
                    "in one ID space, one after another) and <prefix>_offsets.npy (each sample's first id, and the end)")  # fmt: skip
        return
    try:
        if args.data == "criteo-tsv":
            tsv_paths(args.data_path)
        else:
            npy_files(args.data_path)
    except FileNotFoundError as e:
        missing = e if os.path.exists(args.data_path) else "no such file or directory"
        if args.data == "criteo-tsv":
            p.error(f"--data criteo-tsv --data-path {args.data_path}: {missing}; expected a Criteo TSV file "
                    "(Kaggle train.txt) or a directory of *.tsv, *.txt or day_* files" + DATA_HELP)
        prep = NPY_PREP.format(out=args.data_path, name="criteo_kaggle")
        p.error(f"--data criteo-npy --data-path {args.data_path}: {missing}; expected a directory of "
                f"<prefix>_dense.npy, <prefix>_sparse.npy and <prefix>_labels.npy (or one <prefix>). Make them from "
                f"Criteo's TSVs with TorchRec's script: {prep} (criteo_1tb for day_* files)" + DATA_HELP)


def run_config(args: argparse.Namespace) -> RunConfig:
    """The run's configuration: the model's defaults (``get_config``) with the options given."""
    model = ModelConfig(kind=args.model, **({"mlp_layers": args.mlp} if args.mlp else {}))
    given = {k: getattr(args, k) for k in ("embedding_optimizer", "embedding_lr", "dense_lr", "dense_optimizer")}
    return get_config(
        args.config,
        model=model,
        scale=args.scale,
        min_rows=args.min_rows,
        batch_size=args.batch_size,
        cache_ratio=args.cache_ratio,
        lookahead=args.lookahead,
        seed=args.seed,
        **{k: v for k, v in given.items() if v is not None},
    )


def model_text(cfg: RunConfig) -> str:
    """``dlrm``, or ``paper (MLP 32-512-256-1, MSE, sgd on the table)``: the run's first line."""
    if cfg.model.kind != "paper":
        return cfg.model.kind
    mlp = "-".join(str(w) for w in (cfg.model.embedding_dim, *cfg.model.mlp_layers))
    return f"paper (MLP {mlp}, MSE, {cfg.embedding_optimizer} on the table)"


def _auc(logits: torch.Tensor, labels: torch.Tensor) -> float:
    return auc(logits.float().cpu().numpy(), labels.cpu().numpy())


def _peak_rss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def train(args: argparse.Namespace) -> Dict[str, Any]:
    """Train on this rank; every rank returns the same summary."""
    rank, world, local_rank, local_world, device, backend = init_distributed()
    if args.sharder == "torchrec":
        require_cuda_fbgemm(device, "--sharder torchrec")
    threads = args.threads or max(1, (os.cpu_count() or 1) // local_world)
    torch.set_num_threads(threads)
    torch.manual_seed(args.seed)
    cfg = run_config(args)
    rows = cfg.rows()
    pg = dist.GroupMember.WORLD
    if rank == 0:
        print(
            f"[dlrm] {describe(cfg, rows)}; model {model_text(cfg)}; {world} ranks ({backend}, {device.type}, "
            f"{threads} threads each); batch {cfg.batch_size}/rank; sharder {args.sharder}",
            flush=True,
        )

    ckpt = checkpointing.Checkpointer(args.checkpoint_dir, args.checkpoint_every, args.checkpoint_keep)
    resume = ckpt.resume_point(args.steps)
    start = resume[0] if resume else 0
    batches, presample = data_iterator(args, cfg, rows, rank, world, start)
    model = build_model(cfg, rows, device, args.init_perturbation)
    t_setup = time.perf_counter()
    planned = shard_plan(
        args,
        model,
        device,
        cfg.dataset.table_names(),
        lambda: StockSharder(fused_params=fused_params(cfg)),
        functools.partial(frugal_sharder, cfg, presample),
        batch_per_rank=cfg.batch_size,
    )
    if rank == 0:
        print(f"[dlrm] plan: {planned.describe()}", flush=True)
    dmp = DistributedModelParallel(
        module=model, device=device, plan=planned.plan, sharders=[planned.sharder], env=ShardingEnv.from_process_group(pg),  # type: ignore[list-item]
        data_parallel_wrapper=ckpt.data_parallel_wrapper(),
    )
    # A frugal engine over one node initializes its whole tables with init_fn; every other sharding
    # hands init_fn a block of rows that need not say where it starts (a frugal_row_wise engine's,
    # a stock row_wise shard's): those tables take the seeded values through the state_dict.
    inits = table_inits(cfg, rows, args.init_perturbation)
    reseed_tables(dmp, {t: inits[t] for t, kind in planned.shardings.items() if kind != "frugal"})
    dense_cls = torch.optim.Adagrad if cfg.dense_optimizer == "adagrad" else torch.optim.SGD
    opt = combined_optimizer(dmp, lambda ps: dense_cls(ps, lr=cfg.dense_lr))
    window = max(1, min(args.auc_window, args.steps))
    # The metric windows: a resumed run restores them, so its summary equals an uninterrupted run's.
    metric_bufs: Dict[str, List[torch.Tensor]] = {k: [] for k in METRIC_BUFFERS}
    if resume:
        local = ckpt.load(resume[1], dmp, opt)
        metric_bufs = {k: [t.to(device) for t in local["metrics"][k]] for k in METRIC_BUFFERS}
        if rank == 0:
            print(f"[checkpoint] resumed from {resume[1]} (step {start} of {args.steps})", flush=True)
    losses, logit_buf, label_buf, first_logits, first_labels = (metric_bufs[k] for k in METRIC_BUFFERS)  # updated in place
    step_losses: List[torch.Tensor] = []  # every step this run trains, for the summary's "step_losses"
    pipeline = train_pipeline(planned, dmp, opt, device)
    stats = FrugalStats(dmp)
    setup_s = time.perf_counter() - t_setup
    bar = progress_bar(rank, args)
    if bar is not None:
        bar.update(start)
    kill_at = checkpointing.kill_step(rank)
    comm = CommCounter(local_world) if args.count_comm else None
    if comm is not None:
        comm.install()

    dist.barrier()
    t_start = t_last = time.perf_counter()
    t_timed: Optional[float] = None
    timed_from = max(args.warmup, start)  # a resumed run times the steps it runs after the warmup
    steps_done = start
    gate_before = exchange_before = 0.0
    phase_before: Dict[str, float] = {}
    intervals: List[Dict[str, float]] = []
    engine_before = 0.0
    dmp.train()
    ckpt_s_before_timing = 0.0
    while steps_done < args.steps:
        if steps_done == timed_from:
            dist.barrier()
            t_timed = time.perf_counter()
            ckpt_s_before_timing = ckpt.seconds
            stats.record()
            gate_before = stats.gate_wait_s
            exchange_before = stats.exchange_wait_s
            phase_before = dict(stats.phase_s)
            if comm is not None:
                comm.reset()
        try:
            loss, logits, labels = pipeline.progress(batches)
        except StopIteration:
            break
        steps_done += 1
        if resume and rank == 0 and steps_done == start + 1:
            print(f"[checkpoint] first step after resuming (step {steps_done}) done at unix time {time.time():.3f}", flush=True)
        stats.record()
        # kept on the device: no per-step host sync on CUDA
        losses.append(loss.detach().float())
        step_losses.append(losses[-1])
        logit_buf.append(logits.detach().float())
        label_buf.append(labels.detach().float())
        if len(logit_buf) > window:
            if len(first_logits) < window:
                first_logits.append(logit_buf[0])
                first_labels.append(label_buf[0])
            logit_buf.pop(0)
            label_buf.pop(0)
            losses.pop(0)
        if bar is not None:
            bar.update(1)
        if rank == 0 and args.log_every and steps_done % args.log_every == 0:
            now = time.perf_counter()
            ran = min(args.log_every, steps_done - start)  # fewer in the first interval after resuming
            sps = ran * cfg.batch_size * world / (now - t_last)
            t_last = now
            engine_s = sum(stats.phase_s.values())
            intervals.append({"step": steps_done, "samples_per_second": sps, "pending_rows": stats.pending_rows,
                              "engine_ms_per_step": (engine_s - engine_before) * 1e3 / ran})
            engine_before = engine_s
            k = min(len(losses), args.log_every)
            msg = f"step {steps_done:>6} | {sps:>9,.0f} samples/s | loss {torch.stack(losses[-k:]).mean():.4f}"
            if cfg.model.kind != "paper":  # the paper's labels are random: nothing for an AUC to show
                msg += f" | auc {_auc(torch.cat(logit_buf[-k:]), torch.cat(label_buf[-k:])):.4f}"
            if stats.engines:
                msg += (
                    f" | gate stall {100 * stats.gate_wait_s / max(now - t_start, 1e-9):.1f}%"
                    f" | cache hits {100 * stats.cache_hit_ratio:.1f}% | flushed {stats.rows_flushed:,} rows"
                    f" | pending {stats.pending_rows:,}"
                )
            (bar.write if bar is not None else print)(msg)
        checkpointing.kill_if_due(rank, steps_done, kill_at)
        if ckpt.due(steps_done, args.steps):
            metrics = {k: [t.cpu() for t in metric_bufs[k]] for k in METRIC_BUFFERS}
            path = ckpt.save(steps_done, dmp, opt, {"metrics": metrics})
            if rank == 0:
                (bar.write if bar is not None else print)(f"[checkpoint] saved {path}")
    dist.barrier()
    t_end = time.perf_counter()
    if bar is not None:
        bar.close()
    if steps_done < args.steps:
        raise RuntimeError(f"the data ran out after {steps_done} of {args.steps} steps")

    # ----- summary (collective)
    if comm is not None:
        comm.uninstall()
    timed_steps = steps_done - timed_from
    ckpt_timed_s = ckpt.seconds - (ckpt_s_before_timing if t_timed is not None else 0.0)
    elapsed = torch.tensor([t_end - (t_timed if t_timed is not None else t_start) - ckpt_timed_s], dtype=torch.float64)
    gate = torch.tensor([stats.gate_wait_s - (gate_before if t_timed is not None else 0.0)], dtype=torch.float64)
    el_all = gather_cat(elapsed, device)
    gate_all = gather_cat(gate, device)
    exchange = torch.tensor([stats.exchange_wait_s - (exchange_before if t_timed is not None else 0.0)], dtype=torch.float64)
    exchange_all = gather_cat(exchange, device)
    elapsed_s = float(el_all.max())
    loss_all = gather_cat(torch.stack(losses).mean().reshape(1), device)
    k = len(logit_buf)
    auc = _auc(gather_cat(torch.cat(logit_buf[-k:]), device), gather_cat(torch.cat(label_buf[-k:]), device))
    first = first_logits if first_logits else logit_buf[: max(1, k // 4)]
    first_lab = first_labels if first_labels else label_buf[: max(1, k // 4)]
    auc_first = _auc(gather_cat(torch.cat(first), device), gather_cat(torch.cat(first_lab), device))
    summary: Dict[str, Any] = {
        "sharder": args.sharder,
        "sharding": args.sharding if args.sharder == "torchrec" or args.sharding == FRUGAL_ROW_WISE else "frugal",
        "config": cfg.dataset.name,
        "model": cfg.model.kind,
        "tables": {t: {"rows": n, "dim": cfg.model.embedding_dim, "ids_per_sample": cfg.dataset.ids_per_sample}
                   for t, n in zip(cfg.dataset.table_names(), rows)},
        "mlp": [cfg.model.embedding_dim, *cfg.model.mlp_layers] if cfg.model.kind == "paper" else None,
        "loss_fn": "mse" if cfg.model.kind == "paper" else "bce_with_logits",
        "embedding_optimizer": cfg.embedding_optimizer,
        "scale": cfg.effective_scale,
        "rows": int(sum(rows)),
        "world_size": world,
        "backend": backend,
        "device": device.type,
        "threads_per_rank": threads,
        "batch_size": cfg.batch_size,
        "cache_ratio": cfg.cache_ratio if args.sharder == "frugal" else None,
        "lookahead": planned.lookahead,  # the planner's, with --hardware
        "data": args.data,
        "steps": steps_done,
        "warmup_steps": args.warmup,
        "timed_steps": timed_steps,
        "timed_s": elapsed_s,
        "samples_per_second": world * cfg.batch_size * timed_steps / elapsed_s if timed_steps else float("nan"),
        "loss": float(loss_all.mean()),
        "auc": auc,
        "auc_first_window": auc_first,
        "auc_window_steps": k,
        "gate_stall_fraction": float((gate_all / el_all).mean()) if stats.engines else 0.0,
        "setup_s": setup_s,
        "peak_rss_mib_per_rank": [float(x) for x in gather_cat(torch.tensor([_peak_rss_mib()], dtype=torch.float64), device)],
        "resumed_from_step": start if resume else None,
        "checkpoint_steps": ckpt.written,
        "checkpoint_s": ckpt.seconds,
        "plan": {"shardings": planned.shardings, "hardware": args.hardware, "lookahead": planned.lookahead,
                 "cache_ratio": planned.cache_ratio} if args.sharder == "frugal" else None,
        "frugal": None,
        "comm": None,
    }
    if comm is not None:
        sent = gather_cat(torch.tensor([comm.between_nodes, comm.within_node], dtype=torch.float64), device).reshape(world, 2)
        summary["comm"] = {  # payloads of the embedding collectives, all ranks together, per timed step
            "bytes_between_nodes_per_step": float(sent[:, 0].sum()) / max(1, timed_steps),
            "bytes_within_node_per_step": float(sent[:, 1].sum()) / max(1, timed_steps),
            "ranks_per_node": local_world,
        }
    if stats.engines:
        agg = gather_cat(
            torch.tensor([stats.lookups, stats.cache_hits, stats.rows_flushed, stats.bytes_flushed], dtype=torch.float64),
            device,
        ).reshape(world, 4).sum(0)
        summary["frugal"] = {
            "cache_hit_ratio": float(agg[1] / agg[0]) if agg[0] else 0.0,
            "rows_flushed": int(agg[2]),
            "bytes_flushed": int(agg[3]),
            "gate_wait_s_per_rank": [float(g) for g in gate_all],
            "exchange_wait_fraction": float((exchange_all / el_all).mean()),
            "queue": args.queue,
            "flush_workers": args.flush_workers,
            "engine_ms_per_step": _phase_ms(stats, phase_before, timed_steps, device),
            "planned_cache_ratio": planned.cache_ratio,
        }
    summary["intervals"] = intervals
    # each step's loss, the mean over ranks, from the first step this run trained ("step_losses_from")
    per_rank = gather_cat(torch.stack(step_losses).double(), device).reshape(world, -1) if step_losses else None
    summary["step_losses"] = [float(x) for x in per_rank.mean(0)] if per_rank is not None else []
    summary["step_losses_from"] = start
    summary["run_config"] = {k: v for k, v in asdict(cfg).items() if k != "dataset"}
    if rank == 0:
        print("[dlrm] " + json.dumps({k: summary[k] for k in ("sharder", "steps", "samples_per_second", "loss", "auc", "gate_stall_fraction")}), flush=True)
        write_summary(args.summary, summary)
    # Release the sharded model (Frugal engines close here) and every pending gloo/NCCL work
    # while the process group and the interpreter are fully alive.
    del pipeline, opt, dmp, model, stats, batches
    gc.collect()
    dist.barrier()
    return summary


def _phase_ms(stats: FrugalStats, before: Dict[str, float], timed_steps: int, device: torch.device) -> Dict[str, float]:
    """The training thread's engine time per timed step by phase (StepMetrics.phase_s), mean over ranks."""
    names = sorted(stats.phase_s)
    mine = torch.tensor([stats.phase_s[k] - before.get(k, 0.0) for k in names], dtype=torch.float64)
    per_rank = gather_cat(mine, device).reshape(-1, len(names)) if names else mine
    return {k: float(per_rank[:, i].mean()) * 1e3 / max(timed_steps, 1) for i, k in enumerate(names)}


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    quiet_stock_warnings()  # TorchRec's own, printed on a stock script too (examples/stock_warnings.py)
    args = parse_args(argv)
    summary = train(args)
    # Only on success: destroying the group while a failed peer is mid-collective can hang
    # (an exception exits the process instead, and torchrun stops the other ranks).
    dist.destroy_process_group()
    return summary


if __name__ == "__main__":
    main()
