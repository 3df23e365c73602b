"""One rank of a fault-injection run: trains through the engine; the victim SIGKILLs itself."""
from __future__ import annotations

import os
import signal
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from torchrec_frugal import FrugalConfig, FrugalEngine, OptimizerSpec, TableSpec  # noqa: E402
from torchrec_frugal.synthetic_ids import ZipfWorkload  # noqa: E402


def main() -> None:
    rank, world, port, victim, kill_step = (int(a) for a in sys.argv[1:6])
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    rows = (5000, 2000)
    wl = ZipfWorkload(rows, 64, seed=1)
    eng = FrugalEngine(
        [TableSpec(f"t{i}", n, 8) for i, n in enumerate(rows)],
        OptimizerSpec("rowwise_adagrad", lr=0.1),
        FrugalConfig(lookahead=4, cache_ratio=0.05, timeout_s=60),
        presample_counts=wl.counts(rank, 10),
    )
    off = eng.table_offsets
    for step in range(100_000):
        batch = torch.cat([ids + off[t] for t, ids in enumerate(wl.batch(rank, step))])
        if rank == victim and step == kill_step:
            print(f"rank {rank} kills itself at step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        eng.begin_step(batch)
        vals = eng.lookup(batch)
        uniq, inv = torch.unique(batch, return_inverse=True)
        grads = torch.zeros(uniq.shape[0], 8).index_add_(0, inv, 0.1 * vals + 0.01)
        eng.apply_gradients(uniq, grads)
        if step == 20:
            print(f"rank {rank} running", flush=True)


if __name__ == "__main__":
    main()
