"""Stage 1's arithmetic: a :class:`HardwareProfile` from the raw timings of :mod:`.microbenchmarks`.
Separate from the measuring so that it is tested on synthetic timings."""
from __future__ import annotations

from typing import Any, Dict, Mapping, Sequence, Tuple

import numpy as np

from ..profiles import HardwareProfile, profile_from_dict
from .least_squares import fit_line
from .microbenchmarks import ROW_BYTES


def fit_dense(points: Sequence[Tuple[float, float, float]]) -> Tuple[float, float]:
    """(flops_per_s, op_overhead_s) from (flops, ops, seconds) points with the same ops:
    seconds = flops / rate + ops x overhead."""
    intercept, slope = fit_line([p[0] for p in points], [p[2] for p in points])
    if slope <= 0:
        raise ValueError("dense timings do not grow with the FLOPs: cannot fit a rate")
    return 1.0 / slope, max(0.0, intercept) / points[0][1]


def fit_collective(points: Sequence[Tuple[float, float]], calls_latency: float) -> Tuple[float, float]:
    """(bytes_per_s, latency_s) from (bytes, seconds) points: seconds = calls_latency x latency + bytes / bw."""
    intercept, slope = fit_line([p[0] for p in points], [p[1] for p in points])
    if slope <= 0:
        raise ValueError("collective timings do not grow with the bytes: cannot fit a bandwidth")
    return 1.0 / slope, max(0.0, intercept) / calls_latency


def thread_efficiency(one_thread_s: float, threads: int, many_threads_s: float) -> float:
    """Speed-up of each extra thread: t1 / tN = 1 + (N - 1) x efficiency, clipped to [0, 1]."""
    if threads < 2:
        return 0.0
    return float(np.clip((one_thread_s / many_threads_s - 1.0) / (threads - 1), 0.0, 1.0))


def fit_profile(m: Dict[str, Any], base: HardwareProfile, name: str) -> HardwareProfile:
    """A profile from raw measurements ``m`` (what :func:`.microbenchmarks.measure` returns), other fields from ``base``."""
    rate, overhead = fit_dense([(p["flops"], p["ops"], p["s"]) for p in m["dense"]])
    a2a_bw, a2a_lat = fit_collective([(p["bytes"], p["s"]) for p in m["all_to_all"]], calls_latency=1.0)
    # a ring all-reduce of 2 ranks: 2 steps, each sending half the buffer
    ar_bw, ar_lat = fit_collective([(p["bytes"], p["s"]) for p in m["all_reduce"]], calls_latency=2.0)
    bw = lambda k: m[k]["bytes"] / m[k]["s"]  # noqa: E731
    fields: Dict[str, Any] = dict(
        base.to_json(),
        name=name,
        description=f"calibrated on {m['machine']}",
        host_cores=m["cores"],
        dense_flops_per_s=rate,
        op_overhead_s=overhead,
        dense_thread_efficiency=thread_efficiency(m["dense_threads"]["one_s"], m["dense_threads"]["threads"], m["dense_threads"]["many_s"])
        if base.device == "cpu" else 0.0,
        kernel_id_s=m["per_id"]["s"] / m["per_id"]["ids"],
        host_memcpy_bw=bw("memcpy"),
        host_mem_bw=max(bw("memcpy"), bw("memcpy_parallel")),
        device_gather_bw=bw("device_gather"),
        device_scatter_bw=bw("device_scatter"),
        device_mem_bw=bw("device_stream"),
        host_read_random_bw=bw("host_read_random"),
        host_read_sorted=[[p["rows"], p["rows"] * ROW_BYTES / p["s"]] for p in m["host_read_sorted"]],
        host_write_bw=bw("host_write"),
        a2a_bw=a2a_bw,
        a2a_latency_s=a2a_lat,
        allreduce_bw=ar_bw,
        allreduce_latency_s=ar_lat,
        **fit_exchange(m["engine"]),
        extra={"measurements": m, "base": base.name},
    )
    if "h2d" in m:
        fields.update(h2d_bw=bw("h2d"), d2h_bw=bw("d2h"))
    if "host_memory_bytes" in m:  # older measurements lack it: keep base's
        fields.update(host_memory_bytes=m["host_memory_bytes"])
    if base.device == "cpu":
        # Nodes of CPU ranks on one machine (the simulated nodes of the tests) talk over gloo on
        # loopback, as its ranks do: the 2 measured ranks' sends together. A real network cannot be
        # measured from one machine: a GPU calibration keeps ``base``'s figures.
        fields.update(network_bw=2.0 * a2a_bw, network_latency_s=a2a_lat)
    return profile_from_dict(fields, f"calibration of {name}")


def fit_exchange(points: Sequence[Mapping[str, float]]) -> Dict[str, float]:
    """exchange_step_s, exchange_row_s (from the points with L = 0) and lookahead_row_s (what L > 0
    adds a row) from :func:`.microbenchmarks.measure_engine`'s (lookahead, rows, seconds) points."""
    by_l = {L: [p for p in points if p["lookahead"] == L] for L in {p["lookahead"] for p in points}}
    step_s, row_s = fit_line([p["rows"] for p in by_l[0]], [p["s"] for p in by_l[0]])
    la = [L for L in by_l if L > 0]
    la_row_s = 0.0
    if la:
        la_row_s = max(0.0, fit_line([p["rows"] for p in by_l[la[0]]], [p["s"] for p in by_l[la[0]]])[1] - row_s)
    return {"exchange_step_s": max(0.0, step_s), "exchange_row_s": max(0.0, row_s), "lookahead_row_s": la_row_s}
