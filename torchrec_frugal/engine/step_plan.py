"""A step of one engine planned ahead: its rows checked and its lookup split, before the step.

Everything a step's lookup needs that does not depend on the values of the tables can be
computed as soon as the batch is known (L steps ahead, on a planner thread): the unique rows
(checked), which of them this rank's static cache holds and in which slot, the host rows to read
in read order, and every size as a Python int. The static slot map is fixed after set-up, so a
plan holds indices, never values, and stays valid however long it waits; rows in dynamic slots
are read from host, which the gate makes current before the step runs.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .lookup_plan import LookupPlan
from .streams import Marker


@dataclass(frozen=True)
class StepPlan:
    """One engine's plan of one step: what :meth:`FrugalEngine.plan_step` returns."""

    rows: torch.Tensor  # the step's unique fused rows, checked, CPU int64 (owned by the plan)
    lookup: LookupPlan  # where each row comes from (static cache slot, or host)
    packed: torch.Tensor  # lookup.packed on the engine's device
    ready: Marker  # reached once ``packed`` is on the device
    engine: int  # id() of the engine that made it: no other engine takes it

    @property
    def num_rows(self) -> int:
        return self.lookup.n_hit + self.lookup.n_miss
