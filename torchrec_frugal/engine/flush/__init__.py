"""Proactive flushing: the two-level priority queue and the flushers that drain it."""
