"""Compiled loops for the host work a step does per row, each beside a numpy twin.

A step's host bookkeeping touches every row of the step several times (deduplicating, looking up
slots, gathering, grouping by owner). Written as numpy calls, each touch is a pass of its own
over arrays of millions of rows; written as one loop, compiled by numba (prebuilt wheels, no
compiler needed), it is one pass. Each kernel here has a numpy twin that computes the same
result bit for bit (``tests/test_kernels.py``); the twin runs where numba is not installed.
"""
