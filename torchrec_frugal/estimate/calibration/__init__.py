"""Calibration: a hardware profile of this machine.

``python -m torchrec_frugal.estimate --calibrate PATH [--base PROFILE]`` runs :func:`calibrate`:
stage 1 measures the machine (:mod:`.microbenchmarks`) and fits the raw timings into a
:class:`HardwareProfile` (:mod:`.profile_fit`). Fields a microbenchmark cannot see (device memory,
peer-to-peer, the training loop's framework time) come from the base profile; stage 2
(:mod:`.training_fit`) fits the training loop's own time to measured runs of it.
"""
from __future__ import annotations

from typing import Callable

from ..profiles import HardwareProfile
from .microbenchmarks import measure
from .profile_fit import fit_profile


def calibrate(path: str, base: HardwareProfile, name: str, device: str = "cpu", log: Callable[[str], None] = print) -> HardwareProfile:
    """Measure this machine, fit a profile over ``base`` and write it to ``path``."""
    profile = fit_profile(measure(device, log=log), base, name)
    profile.save(path)
    log(f"wrote {path}")
    return profile
