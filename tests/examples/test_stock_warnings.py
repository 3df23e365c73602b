"""examples/stock_warnings.py hides the warnings stock TorchRec and torch print on any script like
the examples, and nothing else."""
from __future__ import annotations

import logging
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from examples.stock_warnings import LOGGED, WARNED, quiet_stock_warnings  # noqa: E402


def test_the_listed_warnings_are_hidden_and_others_are_not(caplog) -> None:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_stock_warnings()
        quiet_stock_warnings()  # twice: one filter a logger
        warnings.warn("HeuristicalStorageReservation is known to cause issues, particularly ...", FutureWarning)
        warnings.warn("`broadcast_buffers` is deprecated. Use `forward_sync_buffers` instead.", FutureWarning)
        warnings.warn("`_get_pg_default_device` will be deprecated, it only stays for ...", UserWarning)
        warnings.warn("Multiple backends are registered with this ProcessGroup. We cannot ...", UserWarning)
        warnings.warn("Please use DTensor instead and we are deprecating ShardedTensor.", FutureWarning)
    assert [str(w.message) for w in seen] == ["Please use DTensor instead and we are deprecating ShardedTensor."]
    assert len(WARNED) == 4
    caplog.set_level(logging.WARNING)
    for name, start in LOGGED:
        logger = logging.getLogger(name)
        assert sum(type(f).__name__ == "_DropStarting" for f in logger.filters) == 1
        logger.warning(start + " and the rest of TorchRec's message")
        logger.warning("another warning of %s", name)
    assert [r.getMessage() for r in caplog.records] == [f"another warning of {name}" for name, _ in LOGGED]
