"""A TorchRec DLRM training script with the frugal sharder and pipeline swapped in.

It has the shape of TorchRec's golden training script (``examples/golden_training/train_dlrm.py``
in the TorchRec repository): an in-backward row-wise Adagrad on the embeddings, a sharder with
quantized-comms codecs, ``DistributedModelParallel`` left to plan (no plan given), and a train
pipeline. The lines marked ``# swap`` are the only ones that differ from a stock TorchRec script:
the sharder and the pipeline. ``--sharder torchrec`` runs the stock lines instead.

    torchrun --nproc_per_node 2 examples/swap_dlrm.py
    torchrun --nproc_per_node 2 examples/swap_dlrm.py --sharder torchrec
    python examples/swap_dlrm.py                 # one process: one rank, no torchrun

The data is TorchRec's RandomRecDataset made on the fly (no batch repeats) with random labels: a
model can learn nothing real from it, so the loss settles near ln 2 = 0.693, under either sharder.
It shows that the script runs and which sharding every table got, not accuracy; the DLRM example
(``examples/dlrm/train.py``) trains on Criteo-shaped data.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import List

import torch
from torch import distributed as dist
from torchrec.datasets.criteo import DEFAULT_CAT_NAMES, DEFAULT_INT_NAMES
from torchrec.datasets.random import RandomRecDataset
from torchrec.distributed import TrainPipelineSparseDist
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.fbgemm_qcomm_codec import CommType, QCommsConfig, get_qcomm_codecs_registry
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.models.dlrm import DLRM, DLRMTrain
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import KeyedOptimizerWrapper
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad
from tqdm import tqdm

from torchrec_frugal import FrugalConfig, FrugalEmbeddingBagCollectionSharder, FrugalTrainPipeline  # swap
from torchrec_frugal.host.launch import free_port

if __package__ in (None, ""):  # launched as a script: make `examples` importable
    sys.path.append(str(Path(__file__).resolve().parents[1]))
from examples.arguments import ArgumentParser  # noqa: E402  # errors once, on rank 0
from examples.stock_warnings import quiet_stock_warnings  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--sharder", choices=["frugal", "torchrec"], default="frugal", help="the swapped lines or the stock ones")
    p.add_argument("--batches", type=int, default=200, help="batches to train per rank")
    p.add_argument("--batch-size", type=int, default=256, help="per rank")
    p.add_argument("--num-embeddings", type=int, default=100_000, help="rows of each of the 26 tables")
    p.add_argument("--embedding-dim", type=int, default=64)
    p.add_argument("--learning-rate", type=float, default=0.1)
    p.add_argument("--lookahead", type=int, default=10, help="FrugalConfig.lookahead: batches the pipeline reads ahead")
    p.add_argument("--cache-ratio", type=float, default=0.05, help="FrugalConfig.cache_ratio: rows each rank caches")
    args = p.parse_args()
    for name in ("batches", "batch_size", "num_embeddings", "embedding_dim"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    try:
        FrugalConfig(lookahead=args.lookahead, cache_ratio=args.cache_ratio)
    except ValueError as e:
        p.error(f"--lookahead {args.lookahead} --cache-ratio {args.cache_ratio}: {e}")
    return args


def main() -> None:
    quiet_stock_warnings()  # TorchRec's own, printed on a stock script too (examples/stock_warnings.py)
    args = parse_args()
    if "LOCAL_RANK" not in os.environ:  # plain `python swap_dlrm.py`: one rank
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        # Ranks sharing one GPU need gloo: NCCL takes one GPU per rank.
        backend = "nccl" if int(os.environ["LOCAL_WORLD_SIZE"]) <= torch.cuda.device_count() else "gloo"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend=backend)

    tables = [
        EmbeddingBagConfig(
            name=f"t_{feature}", embedding_dim=args.embedding_dim, num_embeddings=args.num_embeddings, feature_names=[feature]
        )
        for feature in DEFAULT_CAT_NAMES
    ]
    model = DLRMTrain(
        DLRM(
            embedding_bag_collection=EmbeddingBagCollection(tables=tables, device=torch.device("meta")),
            dense_in_features=len(DEFAULT_INT_NAMES),
            dense_arch_layer_sizes=[64, args.embedding_dim],
            over_arch_layer_sizes=[64, 1],
            dense_device=device,
        )
    )
    apply_optimizer_in_backward(RowWiseAdagrad, model.model.sparse_arch.parameters(), {"lr": args.learning_rate})

    codecs = get_qcomm_codecs_registry(
        qcomms_config=QCommsConfig(forward_precision=CommType.FP16, backward_precision=CommType.BF16)
    )
    if args.sharder == "frugal":
        sharder = FrugalEmbeddingBagCollectionSharder(  # swap
            qcomm_codecs_registry=codecs,
            config=FrugalConfig(lookahead=args.lookahead, cache_ratio=args.cache_ratio),
        )
    else:
        sharder = EmbeddingBagCollectionSharder(qcomm_codecs_registry=codecs)
    dmp = DistributedModelParallel(module=model, device=device, sharders=[sharder])

    dense_optimizer = KeyedOptimizerWrapper(
        dict(dmp.named_parameters()), lambda params: torch.optim.Adagrad(params, lr=args.learning_rate)
    )
    if args.sharder == "frugal":
        pipeline = FrugalTrainPipeline(dmp, dense_optimizer, device)  # swap
    else:
        pipeline = TrainPipelineSparseDist(dmp, dense_optimizer, device)

    batches = iter(
        RandomRecDataset(
            keys=DEFAULT_CAT_NAMES,
            batch_size=args.batch_size,
            hash_size=args.num_embeddings,
            ids_per_feature=1,
            num_dense=len(DEFAULT_INT_NAMES),
            manual_seed=dist.get_rank(),
            num_generated_batches=-1,  # made on the fly: no batch repeats
        )
    )
    losses: List[float] = []
    for _ in tqdm(range(args.batches), mininterval=5.0, disable=dist.get_rank() != 0):
        loss, _, _ = pipeline.progress(batches)
        losses.append(loss.item())

    kinds = sorted({ps.sharding_type for module_plan in dmp.plan.plan.values() for ps in module_plan.values()})
    tail = losses[-min(20, len(losses)) :]
    print(
        f"rank {dist.get_rank()} of {dist.get_world_size()} ({device}, {backend}): tables {'/'.join(kinds)}; "
        f"mean loss of the last {len(tail)} batches {sum(tail) / len(tail):.4f} (random labels: ln 2 = {math.log(2):.4f})",
        flush=True,
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
