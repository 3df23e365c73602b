"""Per-step cost model of synchronous embedding training on the ranks of one machine or of several.

For a workload (tables, id distributions, batch, dense model, ranks and nodes), a plan (a sharding
per table, cache ratio, lookahead) and a hardware profile (:mod:`torchrec_frugal.estimate.profiles`), it
predicts the time of one training step as a sum of named terms, for Frugal (frugal_row_wise across
nodes) and for TorchRec's table_wise, row_wise, table_row_wise and data_parallel shardings (fused,
or offloaded to host memory), alone or mixed table by table. Every figure it returns is a
prediction; the formulas and the sources of the profiles' constants are in ``docs/cost_model.md``.

By job: :mod:`.workload` (what is priced), :mod:`.traffic` (rows per step), :mod:`.primitives`
(elementary operations), :mod:`.stock` and :mod:`.uvm` (TorchRec's shardings and offloading),
:mod:`.frugal` (Frugal's engine), :mod:`.model` (:class:`CostModel`, the whole step),
:mod:`.bound` (what bounds a predicted step) and :mod:`.search` (plans of least predicted step).
No TorchRec import here: the planner integration (``torchrec_frugal.torchrec``) calls into this.
"""
from .bound import BESIDE, BOUNDS, PATH_PARTS, Bound, bound
from .frugal import TABLE_TERMS, FrugalCost, frugal_table_terms
from .model import DEVICE_TERMS, HOST_TERMS, CostModel
from .primitives import Primitives, assign_tables, llc_shares
from .search import CACHE_RATIO_CHOICES, LOOKAHEAD_CHOICES, cache_ratio_choices, frugal_offered, PLANNER_SHARDINGS, UVM_LOAD_FACTOR_CHOICES, PlanChoice, choose_plan, frugal_kind, planner_shardings, predict_all, recommend_frugal, recommend_stock, shardings_for
from .stock import StockCost
from .traffic import TableTraffic, flush_rate, table_traffic
from .uvm import UvmCost, uvm_cache
from .workload import F32, FRUGAL, FRUGAL_KINDS, FRUGAL_ROW_WISE, FUSED_UVM, FUSED_UVM_CACHING, INDEX_BYTES, LENGTH_BYTES, MEMORY_HEADROOM, PREFETCH, SHARDINGS, STOCK_CHOICES, STOCK_SHARDINGS, TERMS, UVM_ALGORITHMS, UVM_CHOICES, UVM_KERNELS, UVM_LOAD_FACTOR, UVM_SHARDINGS, CostTable, DenseModel, Plan, RowDistribution, StepCost, Workload, split_choice

__all__ = [
    "BESIDE", "BOUNDS", "Bound", "PATH_PARTS", "bound", "CACHE_RATIO_CHOICES", "DEVICE_TERMS", "F32", "FRUGAL", "FRUGAL_KINDS", "FRUGAL_ROW_WISE", "FUSED_UVM",
    "FUSED_UVM_CACHING", "HOST_TERMS", "INDEX_BYTES", "LENGTH_BYTES", "LOOKAHEAD_CHOICES", "MEMORY_HEADROOM",
    "PLANNER_SHARDINGS", "PREFETCH", "SHARDINGS", "STOCK_CHOICES", "STOCK_SHARDINGS", "TERMS", "UVM_ALGORITHMS",
    "UVM_CHOICES", "UVM_KERNELS", "UVM_LOAD_FACTOR", "UVM_LOAD_FACTOR_CHOICES", "UVM_SHARDINGS", "CostModel",
    "CostTable", "DenseModel", "FrugalCost", "Plan", "PlanChoice", "Primitives", "RowDistribution", "StepCost",
    "StockCost", "TableTraffic", "UvmCost", "Workload", "assign_tables", "cache_ratio_choices", "llc_shares", "choose_plan", "flush_rate", "frugal_kind",
    "frugal_offered", "planner_shardings", "predict_all", "recommend_frugal", "recommend_stock", "shardings_for", "split_choice",
    "table_traffic", "uvm_cache", "TABLE_TERMS", "frugal_table_terms",
]  # fmt: skip
