"""Hardware profiles of the cost model: typed constants of one machine, stored as JSON.

The profiles shipped here (``cpu``, ``h200``, ``rtx3090``, ``rtx4090``, ``a30``) are data files beside
this module; ``docs/cost_model.md`` gives the source of every constant. A user writes a profile of
their own as a JSON file with the fields of :class:`HardwareProfile` (all required), or measures one
with ``python -m torchrec_frugal.estimate --calibrate PATH``.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import List, Union

from .hardware_profile import DEVICE_KINDS, UVM_MISS_S, HardwareProfile, ProfileError, profile_from_dict

__all__ = ["DEVICE_KINDS", "UVM_MISS_S", "HardwareProfile", "ProfileError", "builtin_profiles", "link_profile",
           "load_profile", "profile_from_dict"]
_DIR = Path(__file__).resolve().parent


def builtin_profiles() -> List[str]:
    """Names of the profiles shipped with the package."""
    return sorted(p.stem for p in _DIR.glob("*.json"))


def load_profile(name_or_path: Union[str, Path]) -> HardwareProfile:
    """A shipped profile by name (``cpu``, ``h200``, ...) or a profile JSON file by path."""
    p = Path(name_or_path)
    if not p.suffix and str(name_or_path) in builtin_profiles():
        p = _DIR / f"{name_or_path}.json"
    if not p.is_file():
        raise ProfileError(f"no profile {str(name_or_path)!r}: not a file, and not one of {builtin_profiles()}")
    try:
        d = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ProfileError(f"{p}: not valid JSON ({e})") from None
    return profile_from_dict(d, str(p))


def link_profile(device_bw: float, host_link_bw: float) -> HardwareProfile:
    """A one-accelerator profile of two bandwidths, in the caller's units (times come out in their
    inverse): device memory for gathers, scatters and streams; the host link for every host read,
    write and copy. Every other cost is zero. What TorchRec's topology tells its perf model, so
    that a frugal shard there is priced by the cost model's own formulas."""
    zero = dict.fromkeys(
        ("dense_flops_per_s", "dense_thread_efficiency", "op_overhead_s", "framework_step_s", "framework_id_s",
         "framework_dist_step_s", "kernel_id_s", "a2a_latency_s", "allreduce_latency_s", "frugal_train_thread_s",
         "planner_step_s", "planner_id_s", "planner_row_s", "exchange_step_s", "exchange_row_s", "lookahead_row_s",
         "sync_latency_s"),
        0.0,
    )  # fmt: skip
    link = dict.fromkeys(
        ("host_memcpy_bw", "host_mem_bw", "host_read_random_bw", "host_write_bw", "h2d_bw", "d2h_bw", "a2a_bw", "allreduce_bw"),
        host_link_bw,
    )  # fmt: skip
    return HardwareProfile(
        name="link", description="device memory and host link bandwidths only", device="cuda", devices=1,
        host_cores=1, device_memory_bytes=math.inf, p2p=True, device_gather_bw=device_bw, device_scatter_bw=device_bw,
        device_mem_bw=device_bw, host_read_sorted=((1.0, host_link_bw),), **zero, **link,
    )  # fmt: skip
