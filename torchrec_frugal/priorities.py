"""Priorities of pending host writes, as every layer names them.

A row whose host copy has a pending write carries a priority: the earliest future step at which
some rank reads it from host, or ``INF`` when no read is known. ``INF`` is also what an owner's
FLUSHED counter holds when nothing is pending: its host rows are current for ever. The queues
that hold pending rows are ``priority_queue``'s; ``QUEUE_KINDS`` names them for the configuration.
"""
from __future__ import annotations

import numpy as np

INF: int = int(np.iinfo(np.int64).max)
"""Priority of rows with no read inside the lookahead window."""

QUEUE_KINDS = ("two_level", "heap")
"""The pending queues (``FrugalConfig.queue``): the paper's two-level queue, and a binary heap."""
