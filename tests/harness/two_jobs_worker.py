"""One rank of a small Frugal job under torchrun (tests/host/test_two_jobs.py starts two such jobs at once).

argv: result path prefix, steps, then the table row counts. The mailboxes start at 2 rows so that
they grow, and keep named segments in the shared-memory directory, while the job runs.
"""
from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from engine_reference import Scenario, run_scenario  # noqa: E402


def main() -> None:
    out, steps, rows = sys.argv[1], int(sys.argv[2]), tuple(int(r) for r in sys.argv[3:])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    sc = Scenario(lookahead=10, cache_ratio=0.05, optimizer="rowwise_adagrad", steps=steps, table_rows=rows, mailbox_rows=2)
    result = run_scenario(rank, world, sc)
    with open(f"{out}.{rank}.json", "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
