"""EXACT_ADAGRAD and ADAM on frugal tables against TorchRec's table_wise (CPU, gloo, 2 ranks).

A DLRM with 4 Zipf-skewed tables trains STEPS steps, each rank on its own batches, with an eval
forward of a held-out batch (no gradients) between steps EVAL_AT - 1 and EVAL_AT, in a plain loop
and in FrugalTrainPipeline (lookahead 3, so the eval forward reads between announced steps):

- EXACT_ADAGRAD (with a weight_decay, which FBGEMM's kernel ignores) against stock table_wise's
  fused kernel: losses, eval losses, tables and ``<table>.momentum1`` [rows, dim]; then a frugal
  checkpoint (dcp.save) loads into the stock model (dcp.load in place) and both train on alike.
- ADAM (defaults; betas, eps and weight_decay set): FBGEMM's CPU build has no Adam kernel (its TBE
  refuses ADAM on CPU), so the reference is stock table_wise with TorchRec's dense kernel and
  :class:`FbgemmAdam`, FBGEMM's CUDA Adam update applied to the rows some rank's batch touched,
  with t counting every forward (FBGEMM's ``iter``, eval forwards included). Compared: losses,
  tables, ``<table>.momentum1`` (exp_avg) and ``<table>.exp_avg_sq``, all [rows, dim].

- ADAM checkpoint, frugal: dcp.load in place restores the tables and both moments (handed out as
  copies, written back), and with ``set_optimizer_step`` the replayed steps repeat the first pass.

FrugalShardingPlanner must plan every table frugal. Each comparison is also made against a run
that differs where it must matter (eval forward not counted; no weight decay), which must differ
by far more than the tolerance.
"""
from __future__ import annotations

import tempfile
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

from rank_pool import Scenarios, pooled
from torchrec_ranks import BATCH, DENSE_IN, DIM, ZipfBatches, initial_table, release
from torchrec_ranks import train as plain_loop

ROWS = [300, 500, 800, 1200]
STEPS = 10
EVAL_AT = 5  # the eval forward runs before step EVAL_AT
LR = 0.05
# As tests/torchrec/test_torchrec_distributed.py: FBGEMM's kernels against the engine's sum in other orders;
# an element-wise Adagrad's first step, lr * g / |g|, turns a gradient's rounding into a larger one.
REL_TOL = 1e-4
KEY = "model.sparse_arch.embedding_bag_collection.embedding_bags"


def fused(opt: str) -> Dict[str, Any]:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    return {
        "adagrad": {"optimizer": EmbOptimType.EXACT_ADAGRAD, "learning_rate": LR, "weight_decay": 0.1},
        "adam": {"optimizer": EmbOptimType.ADAM, "learning_rate": 0.01},
        "adam_betas": {"optimizer": EmbOptimType.ADAM, "learning_rate": 0.01, "beta1": 0.8, "beta2": 0.99, "eps": 1e-6},
        "adam_wd": {
            "optimizer": EmbOptimType.ADAM, "learning_rate": 0.01, "beta1": 0.8, "beta2": 0.99, "eps": 1e-6,
            "weight_decay": 0.5,
        },
    }[opt]


class FbgemmAdam(torch.optim.Optimizer):
    """FBGEMM 1.8's Adam update (its CUDA kernel) on dense table gradients: only rows with a
    gradient (touched by some rank's batch) move, state included; ``forwards`` is FBGEMM's ``iter``,
    which every forward of the table increments (a training step's here, in ``step``)."""

    def __init__(self, params: Any, fused_params: Dict[str, Any]) -> None:
        super().__init__(params, {})
        self.hyper = {k: fused_params.get(k, d) for k, d in
                      [("learning_rate", 0.01), ("beta1", 0.9), ("beta2", 0.999), ("eps", 1e-8), ("weight_decay", 0.0)]}
        self.forwards = 0

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        lr, b1, b2, eps, wd = self.hyper.values()
        self.forwards += 1
        t = self.forwards
        for p in self.param_groups[0]["params"]:
            if p.grad is None:
                continue
            st = self.state[p]
            if not st:
                st["momentum1"], st["exp_avg_sq"] = torch.zeros_like(p), torch.zeros_like(p)
            rows = p.grad.ne(0).any(dim=1).nonzero().flatten()
            g, w = p.grad[rows], p[rows]
            m = st["momentum1"][rows].mul_(b1).add_(g, alpha=1 - b1)
            v = st["exp_avg_sq"][rows].mul_(b2).addcmul_(g, g, value=1 - b2)
            update = (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt() + eps) + wd * w
            p[rows] = w - lr * update
            st["momentum1"][rows], st["exp_avg_sq"][rows] = m, v


def build(sharding: str, opt: str) -> Tuple[nn.Module, Any, Optional[FbgemmAdam]]:
    """A DLRM under "frugal" (FrugalShardingPlanner), "table_wise" (TorchRec's fused kernel) or
    "dense" (table_wise, dense kernel, FbgemmAdam); its CombinedOptimizer and the FbgemmAdam."""
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import Topology
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan, table_wise
    from torchrec.distributed.types import ShardingEnv, ShardingPlan
    from torchrec.models.dlrm import DLRM, DLRMTrain
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    from torchrec_frugal.config import FrugalConfig
    from torchrec_frugal.torchrec import FrugalEmbeddingBagCollectionSharder, FrugalShardingPlanner

    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(name=f"t{t}", embedding_dim=DIM, num_embeddings=r, feature_names=[f"f{t}"])
            for t, r in enumerate(ROWS)
        ],
        device=torch.device("meta"),
    )
    model = DLRMTrain(DLRM(embedding_bag_collection=ebc, dense_in_features=DENSE_IN, dense_arch_layer_sizes=[32, DIM],
                           over_arch_layer_sizes=[32, 1], dense_device=torch.device("cpu")))
    world = dist.get_world_size()
    if sharding == "frugal":
        sharder: Any = FrugalEmbeddingBagCollectionSharder(fused(opt), config=FrugalConfig(lookahead=3, cache_ratio=0.05))
        planner = FrugalShardingPlanner(topology=Topology(world_size=world, compute_device="cpu"), batch_size=BATCH)
        plan = planner.collective_plan(model, [sharder], dist.GroupMember.WORLD)
    else:
        sharder = EmbeddingBagCollectionSharder(fused_params=fused(opt))
        kernel = "fused" if sharding == "table_wise" else "dense"
        module_plan = construct_module_sharding_plan(
            ebc, {f"t{t}": table_wise(rank=t % world, compute_kernel=kernel) for t in range(len(ROWS))},
            sharder=sharder, local_size=world, world_size=world, device_type="cpu",
        )  # fmt: skip
        plan = ShardingPlan({"model.sparse_arch.embedding_bag_collection": module_plan})
    env = ShardingEnv.from_process_group(dist.GroupMember.WORLD)
    dmp = DistributedModelParallel(model, env=env, device=torch.device("cpu"), plan=plan, sharders=[sharder])
    sd = dmp.state_dict()
    for t, rows in enumerate(ROWS):
        sd[f"{KEY}.t{t}.weight"] = initial_table(t, rows)
    dmp.load_state_dict(sd)
    params = dict(in_backward_optimizer_filter(dmp.named_parameters()))
    tables = {k: p for k, p in params.items() if k.startswith(KEY)}
    dense = KeyedOptimizerWrapper({k: p for k, p in params.items() if k not in tables},
                                  lambda ps: torch.optim.SGD(ps, lr=LR))
    ref = FbgemmAdam(list(tables.values()), fused(opt)) if tables else None
    parts = [dmp.fused_optimizer, dense] + ([KeyedOptimizerWrapper(tables, lambda ps: ref)] if ref else [])
    return dmp, CombinedOptimizer(parts), ref


def gathered(value: Any, shape: List[int]) -> Optional[np.ndarray]:
    """A ShardedTensor whole on rank 0 (collective); None elsewhere."""
    full = torch.zeros(shape) if dist.get_rank() == 0 else None
    value.gather(dst=0, out=full)
    return None if full is None else full.numpy().copy()


def state(dmp: nn.Module, optimizer: Any, opt: str, ref: Optional[FbgemmAdam]) -> Dict[str, Optional[np.ndarray]]:
    """Every table and optimizer state, whole on rank 0 (collective): each rank sends the state rows it holds."""
    names = ("momentum1", "exp_avg_sq") if opt.startswith("adam") else ("momentum1",)
    model = dmp.state_dict()
    out = {f"t{t}": gathered(model[f"{KEY}.t{t}.weight"], [r, DIM]) for t, r in enumerate(ROWS)}
    if ref is None:  # a table_wise rank holds the state of its own tables only: gather their shards
        held = optimizer.state_dict()["state"]
        shards = [
            (f"t{t}.{name}", int(sh.metadata.shard_offsets[0]), sh.tensor.numpy().copy())
            for t in range(len(ROWS))
            if f"{KEY}.t{t}.weight" in held
            for name in names
            for sh in held[f"{KEY}.t{t}.weight"][f"t{t}.{name}"].local_shards()
        ]
    else:
        table_of = {id(p): k.split(".")[-2] for k, p in dmp.named_parameters() if k.startswith(KEY)}
        shards = [(f"{table_of[id(p)]}.{n}", 0, s[n].numpy().copy()) for p, s in ref.state.items() for n in names]
    every: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, shards)
    if dist.get_rank() == 0:
        for t, r in enumerate(ROWS):
            for name in names:
                out[f"t{t}.{name}"] = np.zeros((r, DIM), dtype=np.float32)
        for part in every:
            for key, first, rows in part:
                out[key][first : first + rows.shape[0]] = rows.reshape(rows.shape[0], DIM)
    return out


def run(sharding: str, opt: str, pipeline: bool, count_eval: bool = True) -> Dict[str, Any]:
    """STEPS steps with the eval forward before step EVAL_AT; losses, eval loss, final state (rank 0).
    ``count_eval=False`` (FbgemmAdam only): the eval forward left out of Adam's t, a run that must differ."""
    from torchrec_frugal.torchrec import FrugalTrainPipeline

    dmp, optimizer, ref = build(sharding, opt)
    types = {t: ps.sharding_type for mp in dmp.plan.plan.values() for t, ps in mp.items()}
    data = ZipfBatches(dist.get_rank(), ROWS)
    pipe = FrugalTrainPipeline(dmp, optimizer, torch.device("cpu")) if pipeline else None
    batches: Iterator[Any] = data.batches(0, STEPS)
    losses, eval_loss = [], 0.0
    for step in range(STEPS):
        if step == EVAL_AT:
            if pipe is not None:
                pipe.detach()  # as TorchRec's pipelines want for an eval forward; progress() attaches again
            dmp.eval()
            with torch.no_grad():
                eval_loss = dmp(data.batch(10**6))[0].item()
            dmp.train()
            if ref is not None and count_eval:
                ref.forwards += 1
        if pipe is not None:
            losses.append(pipe.progress(batches)[0].item())
            continue
        optimizer.zero_grad()
        loss, _ = dmp(next(batches))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    out = {"losses": np.array(losses), "eval": eval_loss, "state": state(dmp, optimizer, opt, ref), "types": types}
    release(dmp)
    return out


def checkpoint_to_stock(directory: str) -> Dict[str, Any]:
    """EXACT_ADAGRAD: frugal trains, dcp.save; stock table_wise, fresh, dcp.load in place; then both train 3
    more steps. The state each has after the load, and the losses of the 3 steps."""
    import torch.distributed.checkpoint as dcp

    out: Dict[str, Any] = {}
    data = ZipfBatches(dist.get_rank(), ROWS)
    for sharding in ("frugal", "table_wise"):
        dmp, optimizer, _ = build(sharding, "adagrad")
        if sharding == "frugal":
            for batch in data.batches(0, STEPS):
                optimizer.zero_grad()
                dmp(batch)[0].backward()
                optimizer.step()
            dcp.save({"model": dmp.state_dict(), "optim": optimizer.state_dict()}, checkpoint_id=directory)
        else:
            dcp.load({"model": dmp.state_dict(), "optim": optimizer.state_dict()}, checkpoint_id=directory)
        out[f"{sharding}_state"] = state(dmp, optimizer, "adagrad", None)
        losses = []
        for batch in data.batches(STEPS, STEPS + 3):
            optimizer.zero_grad()
            loss, _ = dmp(batch)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        out[f"{sharding}_losses"] = np.array(losses)
        out[f"{sharding}_after"] = state(dmp, optimizer, "adagrad", None)
        release(dmp)
    return out


def adam_load_in_place(directory: str) -> Dict[str, Any]:
    """ADAM, frugal: train EVAL_AT steps, dcp.save, train 3 more, dcp.load in place into the live
    state_dicts, set_optimizer_step(EVAL_AT) (stock's checkpoints do not hold FBGEMM's ``iter``), replay
    the 3 steps. The state at the save, before the load, right after it and after the replay (rank 0),
    and the losses of both passes."""
    import torch.distributed.checkpoint as dcp

    dmp, optimizer, _ = build("frugal", "adam_wd")
    data = ZipfBatches(dist.get_rank(), ROWS)

    def train(start: int, stop: int) -> List[float]:
        return plain_loop(dmp, optimizer, data.batches(start, stop))

    train(0, EVAL_AT)
    dcp.save({"model": dmp.state_dict(), "optim": optimizer.state_dict()}, checkpoint_id=directory)
    out: Dict[str, Any] = {"saved": state(dmp, optimizer, "adam", None)}
    out["first"] = train(EVAL_AT, EVAL_AT + 3)
    out["before"] = state(dmp, optimizer, "adam", None)
    dcp.load({"model": dmp.state_dict(), "optim": optimizer.state_dict()}, checkpoint_id=directory)
    out["loaded"] = state(dmp, optimizer, "adam", None)
    optimizer.set_optimizer_step(EVAL_AT)
    out["replay"] = train(EVAL_AT, EVAL_AT + 3)
    out["after"] = state(dmp, optimizer, "adam", None)
    release(dmp)
    return out


RUNS = {
    "adagrad_frugal": ("frugal", "adagrad", False),
    "adagrad_frugal_pipeline": ("frugal", "adagrad", True),
    "adagrad_stock": ("table_wise", "adagrad", False),
    "adam_frugal": ("frugal", "adam", False),
    "adam_frugal_pipeline": ("frugal", "adam", True),
    "adam_stock": ("dense", "adam", False),
    "adam_stock_eval_uncounted": ("dense", "adam", False, False),
    "adam_wd_frugal_pipeline": ("frugal", "adam_wd", True),
    "adam_wd_stock": ("dense", "adam_wd", False),
    "adam_betas_stock": ("dense", "adam_betas", False),
}


def _run(rank: int, world: int, *args: Any) -> Dict[str, Any]:
    return run(*args)


def _in_a_directory(rank: int, world: int, fn: Callable[[str], Dict[str, Any]]) -> Dict[str, Any]:
    """``fn(directory)`` with one fresh directory for every rank (one machine: every rank saves
    into rank 0's)."""
    with tempfile.TemporaryDirectory() as d:
        objs: List[Any] = [d]
        dist.broadcast_object_list(objs, src=0)
        out = fn(objs[0])
        dist.barrier()
    return out


@pytest.fixture(scope="module")
def world2() -> Iterator[Scenarios]:
    yield from pooled(2, {
        **{name: (_run, args) for name, args in RUNS.items()},
        "checkpoint": (_in_a_directory, (checkpoint_to_stock,)),
        "adam_load": (_in_a_directory, (adam_load_in_place,)),
    })


def max_rel(a: Dict[str, Any], b: Dict[str, Any]) -> Dict[str, float]:
    """Per table and state, max |a - b| over max |b|."""
    return {k: float(np.abs(a[k] - b[k]).max() / np.abs(b[k]).max()) for k in b}


def assert_same(results: Sequence[Mapping[str, Any]], a: str, b: str) -> None:
    for rank, r in enumerate(results):
        np.testing.assert_allclose(r[a]["losses"], r[b]["losses"], rtol=REL_TOL, err_msg=f"rank {rank}: losses")
        np.testing.assert_allclose(r[a]["eval"], r[b]["eval"], rtol=REL_TOL, err_msg=f"rank {rank}: eval loss")
    diff = max_rel(results[0][a]["state"], results[0][b]["state"])
    assert max(diff.values()) <= REL_TOL, f"{a} vs {b}: {diff}"


def assert_differs(results: Sequence[Mapping[str, Any]], a: str, b: str) -> None:
    diff = max_rel(results[0][a]["state"], results[0][b]["state"])
    assert max(diff.values()) > 100 * REL_TOL, f"{a} vs {b} should differ: {diff}"


@pytest.mark.parametrize("opt", ["adagrad", "adam"])
def test_frugal_matches_stock(world2: Scenarios, opt: str) -> None:
    r = world2[0]
    assert set(r[f"{opt}_frugal"]["types"].values()) == {"frugal"}  # the planner plans them frugal
    assert_same(world2, f"{opt}_frugal", f"{opt}_stock")
    assert_same(world2, f"{opt}_frugal_pipeline", f"{opt}_stock")
    # every table moved from its start, every state from zero
    moved = {k: float(np.abs(v - initial_table(int(k[1:]), ROWS[int(k[1:])]).numpy()).max())
             for k, v in r[f"{opt}_frugal"]["state"].items() if "." not in k}
    assert min(moved.values()) > 1e-3, moved
    assert min(np.count_nonzero(v) for k, v in r[f"{opt}_frugal"]["state"].items() if "." in k) > 100


def test_adam_counts_eval_forwards_as_fbgemm(world2: Scenarios) -> None:
    assert_differs(world2, "adam_stock", "adam_stock_eval_uncounted")


def test_adam_weight_decay_and_betas(world2: Scenarios) -> None:
    assert_same(world2, "adam_wd_frugal_pipeline", "adam_wd_stock")
    assert_differs(world2, "adam_wd_stock", "adam_betas_stock")  # the weight decay bites
    assert_differs(world2, "adam_betas_stock", "adam_stock")  # so do the betas and eps


def test_adagrad_checkpoint_loads_into_stock(world2: Scenarios) -> None:
    c = world2[0]["checkpoint"]
    assert max(max_rel(c["table_wise_state"], c["frugal_state"]).values()) == 0.0
    for rank, r in enumerate(world2):
        cr = r["checkpoint"]
        np.testing.assert_allclose(cr["table_wise_losses"], cr["frugal_losses"], rtol=REL_TOL, err_msg=f"rank {rank}")
    diff = max_rel(c["table_wise_after"], c["frugal_after"])
    assert max(diff.values()) <= REL_TOL, diff


def test_adam_checkpoint_loads_in_place(world2: Scenarios) -> None:
    """dcp.load into the live state_dicts restores Adam's two moments (copies, written back) and the
    tables; with set_optimizer_step the replay repeats the steps it replays."""
    a = world2[0]["adam_load"]
    assert min(max_rel(a["before"], a["saved"]).values()) > 100 * REL_TOL  # the load has something to undo
    assert max(max_rel(a["loaded"], a["saved"]).values()) == 0.0
    assert max(max_rel(a["after"], a["before"]).values()) <= REL_TOL
    for rank, r in enumerate(world2):
        np.testing.assert_allclose(r["adam_load"]["replay"], r["adam_load"]["first"], rtol=REL_TOL, err_msg=f"rank {rank}")
