"""TorchRec's perf model of a frugal shard: the cost model's price, registered as the evaluator of
the "frugal" sharding type."""
from __future__ import annotations

from torchrec.distributed.planner.estimator.estimator import DataParallelEvaluator
from torchrec.distributed.planner.estimator.types import HardwarePerfConfig, ShardPerfContext
from torchrec.distributed.planner.types import Perf

from ...config import CACHE_RATIO, LOOKAHEAD
from ...estimate.cost_model import CostTable, DenseModel, Plan, Primitives, RowDistribution, Workload, frugal_table_terms, table_traffic
from ...estimate.profiles import link_profile
from ..types import FRUGAL


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
