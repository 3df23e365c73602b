"""What the glue changes in TorchRec, and the guard of what it relies on.

- :mod:`.planner_shims`: wrappers that teach TorchRec's planner the "frugal" sharding types
  (patches/README.md lists what each answers, and why);
- :mod:`.perf_evaluator`: TorchRec's perf model of a frugal shard;
- :mod:`.patch`: what a shim is, keyed and hashed;
- :mod:`.releases`: the TorchRec releases the shims were checked against (their source hashes);
- :mod:`.third_party_privates`: every TorchRec and torch private name the glue relies on.

``apply()`` installs the shims and the perf evaluator once (importing ``torchrec_frugal.torchrec``
calls it).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Tuple

from torchrec.distributed.planner.estimator import estimator as perf_estimator
from torchrec.distributed.types import ShardingType

from ..types import FRUGAL, FRUGAL_ROW_WISE
from .patch import Patch
from .perf_evaluator import FrugalPerfEvaluator
from .planner_shims import PATCHES
from .releases import TORCHREC_VERSION, warn_if_unsupported

_originals: Dict[Tuple[str, str], Callable[..., Any]] = {}


def original(patch: Patch) -> Callable[..., Any]:
    """The TorchRec function ``patch`` wraps (the current one if not applied yet)."""
    return _originals.get((patch.module.__name__, patch.name), getattr(patch.module, patch.name))


def apply() -> None:
    """Install the shims and the perf evaluator; idempotent."""
    if not _originals:
        warn_if_unsupported(TORCHREC_VERSION)
    for p in PATCHES:
        key = (p.module.__name__, p.name)
        if key in _originals:
            continue
        fn = getattr(p.module, p.name)
        _originals[key] = fn
        setattr(p.module, p.name, p.make(fn))
    perf_estimator.TRAINING_EVALUATORS.setdefault(FRUGAL, FrugalPerfEvaluator())
    # Placement prices frugal_row_wise as row_wise: the same blocks and all-to-alls, over nodes
    # (what the engines save inside a node is the cost model's, with a hardware profile).
    perf_estimator.TRAINING_EVALUATORS.setdefault(
        FRUGAL_ROW_WISE, perf_estimator.TRAINING_EVALUATORS[ShardingType.ROW_WISE.value]
    )
