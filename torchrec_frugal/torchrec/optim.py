"""The fused optimizer of frugal tables, as a KeyedOptimizer (``DistributedModelParallel.fused_optimizer``).

The update itself runs inside backward, in the engine (like FBGEMM's fused kernels); this
optimizer exposes its learning rate through ``param_groups`` and its state for checkpoints.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Protocol, Sequence, Tuple, Union

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torchrec.optim.fused import FusedOptimizer

from .checkpoint import ROWWISE_KINDS, held_rows, rows_sharded_tensor, state_columns
from .types import FrugalTable

if TYPE_CHECKING:
    from ..engine.frugal_engine import FrugalEngine


class FusedTableGroup(Protocol):
    """What the optimizer reads of its tables' group (the kernel's FrugalTableGroup)."""

    tables: List[FrugalTable]
    table_index: Dict[str, int]
    placeholders: Dict[str, nn.Parameter]
    pg: Optional[dist.ProcessGroup]
    checkpoint_pg: Optional[dist.ProcessGroup]
    engine: "FrugalEngine"

    def ensure_flushed(self) -> None: ...

    def checkpoint_blocks(self, table: str) -> List[Tuple[int, int]]: ...

    def own_block(self, table: str) -> Tuple[int, int]: ...

    def engine_ids(self, table: str, first: int, count: int, what: str) -> torch.Tensor: ...

    def read(self, table: str, ids: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]: ...

    def state_block(self, table: str, first: int, count: int, columns: slice) -> torch.Tensor: ...

    def write(
        self, parts: Sequence[Tuple[str, torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]]
    ) -> None: ...


class FrugalOptimizerState:
    """One optimizer state of one table (``<table>.momentum1``), read from host on demand.

    KeyedOptimizer turns it into a ShardedTensor through ``state_dict()`` and loads one through
    ``load_state_dict()``, so checkpoints look like those of FBGEMM's fused optimizer: [rows] for a
    row-wise state (one column of the engine's state), [rows, dim] for an element-wise one.
    """

    def __init__(self, group: FusedTableGroup, table: str, name: str, columns: slice, rowwise: bool) -> None:
        self._group = group
        self._table = table
        self.name = name
        self._columns = columns
        self._rowwise = rowwise

    def _table_spec(self) -> FrugalTable:
        return self._group.tables[self._group.table_index[self._table]]

    def _shape(self) -> Tuple[int, ...]:
        rows = self._table_spec().table_rows
        return (rows,) if self._rowwise else (rows, self._columns.stop - self._columns.start)

    def _of(self, state: torch.Tensor) -> torch.Tensor:
        """This state's view of rows of the engine's state [n, state_width]."""
        return state[:, self._columns.start] if self._rowwise else state[:, self._columns]

    def state_dict(self) -> ShardedTensor:
        g = self._group
        g.ensure_flushed()
        first, size = g.own_block(self._table)
        local = g.state_block(self._table, first - self._table_spec().row_offset, size, self._columns)
        # A view like the weights' (or a copy written back): dcp.load into it restores the state in place.
        local = local[:, 0] if self._rowwise else local
        return rows_sharded_tensor(local, self._shape()[0], g.checkpoint_pg, g.checkpoint_blocks(self._table))

    def load_state_dict(self, value: Union[ShardedTensor, torch.Tensor]) -> None:
        g = self._group
        what = f"optimizer state {self._table}.{self.name}"
        if isinstance(value, torch.Tensor) and tuple(value.shape) != self._shape():
            raise ValueError(f"{what}: expected shape {self._shape()}, got {tuple(value.shape)}")
        g.ensure_flushed()
        parts = []
        for first, rows in held_rows(value, what, g.checkpoint_pg, g.checkpoint_blocks(self._table)):
            ids = g.engine_ids(self._table, first, rows.shape[0], what)
            _, state = g.read(self._table, ids)
            self._of(state).copy_(rows.reshape(self._of(state).shape))
            parts.append((self._table, ids, None, state))
        g.write(parts)


class FrugalFusedOptimizer(FusedOptimizer):
    """KeyedOptimizer of one engine's tables; ``param_groups[0]["lr"]`` drives the engine."""

    def __init__(self, group: FusedTableGroup) -> None:
        self._group = group
        kind = group.engine.optimizer.kind
        columns = state_columns(kind, group.engine.state_width)
        params = {f"{t.name}.weight": group.placeholders[t.name] for t in group.tables}
        state: Dict[Any, Any] = {
            group.placeholders[t.name]: {
                f"{t.name}.{name}": FrugalOptimizerState(group, t.name, name, cols, kind in ROWWISE_KINDS)
                for name, cols in columns.items()
            }
            for t in group.tables
        }
        super().__init__(params, state, [{"params": list(params.values()), "lr": group.engine.optimizer.lr}])

    def _sync_lr(self) -> None:
        # Like FBGEMM's EmbeddingFusedOptimizer: the rate set in param_groups reaches the kernel
        # at the next zero_grad() or step(), and applies from the next backward on.
        self._group.engine.optimizer.lr = float(self.param_groups[0]["lr"])  # type: ignore[index]

    def zero_grad(self, set_to_none: bool = False) -> None:
        self._sync_lr()

    def set_optimizer_step(self, step: int) -> None:
        """As TorchRec's fused optimizer (FBGEMM's ``set_optimizer_step``): the next update runs as
        iteration ``step + 1`` of Adam's bias correction, e.g. on resuming a run that had done ``step``."""
        self._group.engine.set_optimizer_iteration(step)

    def step(self, closure: Any = None) -> None:
        self._sync_lr()
