"""A frugal sharder's tables are planned frugal, whichever planner plans them.

TorchRec's planner picks, per table, among the sharding types the table's sharder offers, by its
own estimates; a frugal sharder offers the frugal types beside every stock one (a plan may mix
them, and a table frugal cannot take must still be planned). Left to those estimates, swapping in
the sharder would change nothing whenever table_wise looks cheaper to TorchRec's perf model.
:func:`frugal_first` is the rule that makes the swap take: the shim of
``EmbeddingEnumerator.enumerate`` (:mod:`.patches`) applies it to the options TorchRec enumerates,
so ``DistributedModelParallel(plan=None)``, TorchRec's ``EmbeddingShardingPlanner`` and
``FrugalShardingPlanner`` all plan the same way. A table that a user constrains to stock types
only keeps them; a table frugal would refuse is planned among the stock types, with one warning
naming it and the reason.
"""
from __future__ import annotations

import logging
from typing import Dict, List, Optional, Tuple

from torch import nn
from torchrec.distributed.planner.types import ShardingOption
from torchrec.distributed.planner.utils import sharder_name
from torchrec.distributed.types import ModuleSharder

from .fused_params import frugal_refusal
from .types import FRUGAL, FRUGAL_ROW_WISE, FRUGAL_TYPES

logger: logging.Logger = logging.getLogger(__name__)


def frugal_kind(kinds: List[str]) -> Optional[str]:
    """The frugal type a table offered ``kinds`` goes to: frugal_row_wise where it is offered (the
    job spans nodes), else frugal; None if neither is offered."""
    for kind in (FRUGAL_ROW_WISE, FRUGAL):
        if kind in kinds:
            return kind
    return None


def frugal_first(options: List[ShardingOption], sharders: List[ModuleSharder[nn.Module]]) -> List[ShardingOption]:
    """``options`` (TorchRec's enumeration) with each table that offers a frugal type narrowed to it,
    or, if frugal would refuse the table, to its stock types (one warning per table)."""
    by_type = {sharder_name(s.module_type): s for s in sharders}
    tables: Dict[Tuple[str, str], List[ShardingOption]] = {}
    for so in options:
        tables.setdefault((so.path, so.name), []).append(so)
    keep: List[ShardingOption] = []
    for (path, name), table_options in tables.items():
        kinds = list(dict.fromkeys(so.sharding_type for so in table_options))
        kind = frugal_kind(kinds)
        if kind is None or all(k in FRUGAL_TYPES for k in kinds):
            keep.extend(table_options)  # stock only (a constraint or a stock sharder), or frugal only
            continue
        sharder = by_type.get(sharder_name(type(table_options[0].module[1])))
        refused = frugal_refusal(getattr(sharder, "fused_params", None), name, table_options[0].tensor.dtype)
        if refused is None:
            keep.extend(so for so in table_options if so.sharding_type == kind)
        else:
            stock = [k for k in kinds if k not in FRUGAL_TYPES]
            logger.warning("table %r of %r is planned among %s, not frugal: %s", name, path, stock, refused)
            keep.extend(so for so in table_options if so.sharding_type not in FRUGAL_TYPES)
    return keep
