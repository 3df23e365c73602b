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

from .checkpoint import OPTIMIZER_STATE_NAMES, held_rows, rows_sharded_tensor
from .types import FrugalTable

if TYPE_CHECKING:
    from ..engine import FrugalEngine


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

    def block(self, table: str, first: int, count: int) -> Tuple[torch.Tensor, torch.Tensor]: ...

    def write(
        self, parts: Sequence[Tuple[str, torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]]
    ) -> None: ...


class FrugalOptimizerState:
    """One row-wise optimizer state of one table (``<table>.momentum1``), read from host on demand.

    KeyedOptimizer turns it into a ShardedTensor through ``state_dict()`` and loads one through
    ``load_state_dict()``, so checkpoints look like those of FBGEMM's fused optimizer.
    """

    def __init__(self, group: FusedTableGroup, table: str, column: int) -> None:
        self._group = group
        self._table = table
        self._column = column

    def _table_spec(self) -> FrugalTable:
        return self._group.tables[self._group.table_index[self._table]]

    def _num_rows(self) -> int:
        return self._table_spec().table_rows

    def state_dict(self) -> ShardedTensor:
        g = self._group
        g.ensure_flushed()
        first, size = g.own_block(self._table)
        _, state = g.block(self._table, first - self._table_spec().row_offset, size)
        # A view, like the weights': dcp.load into it restores the state in place (see ``block``).
        return rows_sharded_tensor(state[:, self._column], self._num_rows(), g.checkpoint_pg, g.checkpoint_blocks(self._table))

    def load_state_dict(self, value: Union[ShardedTensor, torch.Tensor]) -> None:
        g = self._group
        if isinstance(value, torch.Tensor) and tuple(value.shape) != (self._num_rows(),):
            raise ValueError(
                f"optimizer state {self._table}.{self.name}: expected shape {(self._num_rows(),)}, got {tuple(value.shape)}"
            )
        g.ensure_flushed()
        parts = []
        what = f"optimizer state {self._table}.{self.name}"
        for first, rows in held_rows(value, what, g.checkpoint_pg, g.checkpoint_blocks(self._table)):
            ids = g.engine_ids(self._table, first, rows.shape[0], what)
            _, state = g.read(self._table, ids)
            state[:, self._column] = rows.reshape(-1).to(state.dtype)
            parts.append((self._table, ids, None, state))
        g.write(parts)

    @property
    def name(self) -> str:
        return OPTIMIZER_STATE_NAMES[self._group.engine.optimizer.kind][self._column]


class FrugalFusedOptimizer(FusedOptimizer):
    """KeyedOptimizer of one engine's tables; ``param_groups[0]["lr"]`` drives the engine."""

    def __init__(self, group: FusedTableGroup) -> None:
        self._group = group
        names = OPTIMIZER_STATE_NAMES[group.engine.optimizer.kind]
        params = {f"{t.name}.weight": group.placeholders[t.name] for t in group.tables}
        state: Dict[Any, Any] = {
            group.placeholders[t.name]: {
                f"{t.name}.{name}": FrugalOptimizerState(group, t.name, column) for column, name in enumerate(names)
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

    def step(self, closure: Any = None) -> None:
        self._sync_lr()
