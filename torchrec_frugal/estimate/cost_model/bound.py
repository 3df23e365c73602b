"""What bounds a predicted step: the part of the critical path, or the thread beside it, whose time
the step waits for, and by how much it outlasts the next one.

A step is its critical path (the training thread's serial chain: device work it launches and waits
for, its own host work, the host link, the collectives) run beside Frugal's threads (planner,
exchange worker, flushers) or TorchRec's cache prefetch; the step lasts as long as the longest of
these lanes (``CostModel.predict``: the excess of a lane beside is ``gate_stall`` or
``prefetch_stall``), plus ``contention`` for shared cores or devices.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple

from .workload import StepCost

PATH_PARTS: Dict[str, Tuple[str, ...]] = {
    "device": ("dense_compute", "embedding_lookup", "embedding_update"),
    "training thread": ("framework", "engine_host"),
    "host link": ("host_reads", "gradient_exchange", "flush_inline", "uvm_reads", "uvm_writes"),
    "collectives": ("dense_allreduce", "input_all_to_all", "output_all_to_all", "table_allreduce"),
}
"""The critical path's terms by the resource that spends them (without peer-to-peer the collectives
also cross the host link; they are named apart because their bandwidth is a profile field of its own)."""
BESIDE: Dict[str, str] = {
    "planner": "planner_thread_ms",
    "exchange worker": "exchange_worker_ms",
    "flushers": "flushers_ms",
    "cache prefetch": "uvm_prefetch_ms",
}
"""Lanes beside the critical path, by their key in ``StepCost.details`` (milliseconds)."""
EXCESS_TERMS = ("gate_stall", "prefetch_stall", "contention")
"""Terms that are no work of their own: the excess of a lane beside the path, and the wait for shared resources."""
CONTENTION = "shared cores or devices"
BOUNDS = (*PATH_PARTS, *BESIDE, CONTENTION)
"""Every name :func:`bound` may return."""


@dataclass(frozen=True)
class Bound:
    """What bounds one predicted step.

    ``name``: one of :data:`BOUNDS`: the critical path's largest part when the path is the longest
    lane, the thread beside it that outlasts the path, or :data:`CONTENTION`. ``seconds``: its time
    a step. ``margin``: seconds by which the bounding lane outlasts the next lane (path against the
    slowest thread beside it, or the reverse; the whole path when nothing runs beside it; the
    contention term itself). ``runner_up``: that next lane ("critical path", a thread's name, or
    "none"); ``path_s``: the critical path; ``parts``: the path's seconds by :data:`PATH_PARTS`;
    ``beside``: seconds of each lane beside the path that this step has.
    """

    name: str
    seconds: float
    margin: float
    runner_up: str
    path_s: float
    step_s: float
    parts: Dict[str, float]
    beside: Dict[str, float]

    @property
    def share(self) -> float:
        """``seconds`` as a share of the step."""
        return self.seconds / self.step_s if self.step_s > 0 else 0.0

    def text(self) -> str:
        """One line, in milliseconds: the bound, its share of the step, and its margin over the next lane."""
        if self.name == CONTENTION:
            return f"{self.name}: +{1e3 * self.margin:.2f} ms beyond the rank's own path"
        head = f"{self.name} {1e3 * self.seconds:.2f} ms ({100 * self.share:.0f}% of the step)"
        if self.name in PATH_PARTS:
            if self.runner_up == "none":
                return head + ", on the critical path; nothing runs beside it"
            return (head + f", on the critical path ({1e3 * self.path_s:.2f} ms), "
                    f"{1e3 * self.margin:.2f} ms longer than the {self.runner_up} beside it")  # fmt: skip
        return head + f", beside the step, {1e3 * self.margin:.2f} ms longer than the {self.runner_up}"

    def to_json(self) -> Dict[str, object]:
        return {"name": self.name, "ms": 1e3 * self.seconds, "margin_ms": 1e3 * self.margin, "runner_up": self.runner_up,
                "share": self.share, "path_ms": 1e3 * self.path_s,
                "parts_ms": {part: 1e3 * seconds for part, seconds in self.parts.items()},
                "beside_ms": {lane: 1e3 * seconds for lane, seconds in self.beside.items()}}  # fmt: skip


def bound(cost: StepCost) -> Bound:
    """What bounds ``cost``'s step (:class:`Bound`). Why: a term's size alone does not say whether
    shrinking it shortens the step; a thread beside the step matters only once it outlasts the path,
    and the path's parts only while it is the longest lane."""
    parts = {name: sum(cost.terms[term] for term in terms) for name, terms in PATH_PARTS.items()}
    path = sum(parts.values())
    beside = {name: 1e-3 * cost.details[key] for name, key in BESIDE.items() if key in cost.details}
    step = cost.step_s
    if cost.terms["contention"] > 0.0:
        return Bound(CONTENTION, cost.terms["contention"], cost.terms["contention"], "critical path", path, step, parts, beside)
    lanes = sorted(beside.items(), key=lambda lane: -lane[1])
    if lanes and lanes[0][1] > path:
        name, seconds = lanes[0]
        runner_up, runner_up_s = max([("critical path", path), *lanes[1:]], key=lambda lane: lane[1])
        return Bound(name, seconds, seconds - runner_up_s, runner_up, path, step, parts, beside)
    name = max(parts, key=lambda part: parts[part])
    if not lanes:
        return Bound(name, parts[name], path, "none", path, step, parts, beside)
    return Bound(name, parts[name], path - lanes[0][1], lanes[0][0], path, step, parts, beside)
