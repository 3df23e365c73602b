"""Benchmarks of torchrec_frugal: scripts run as ``python benchmarks/<name>.py``, and their shared helpers."""
