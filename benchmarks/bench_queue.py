"""Throughput of the two pending-write queues on a step-shaped workload.

Per simulated training step (window L): upsert ``--batch`` fresh rows with
priorities spread over ``[base, base + L + 1]`` and INF, move a quarter of them
to new priorities, drain the due bucket (priority == base) in flusher-sized
chunks, pop one more chunk as a background flusher would, then advance the
window.  The rate is rows touched (upserted + moved + popped) per second of
queue time; input generation is done before timing.  Both kinds replay the
same pre-generated steps from an empty queue each repetition.

    python benchmarks/bench_queue.py [--rows N] [--batch B] [--steps S] [--repeats R] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a script: `benchmarks`, `examples`, and `torchrec_frugal` where no installed one wins
    sys.path.append(str(ROOT))

from torchrec_frugal.priorities import INF, QUEUE_KINDS  # noqa: E402
from torchrec_frugal.engine.flush.priority_queue import make_queue  # noqa: E402

Step = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def make_steps(rows: int, batch: int, steps: int, window: int, seed: int) -> list[Step]:
    """Pre-generate (upsert rows, priorities, moved rows, new priorities) per step."""
    rng = np.random.default_rng(seed)
    out: list[Step] = []
    for s in range(steps):
        base = s + 1
        ids = rng.choice(rows, size=batch, replace=False).astype(np.int64)
        prios = rng.integers(base, base + window + 3, size=batch, dtype=np.int64)
        prios[prios == base + window + 2] = INF
        moved = ids[: batch // 4]
        new_prios = rng.integers(base, base + window + 3, size=moved.size, dtype=np.int64)
        new_prios[new_prios == base + window + 2] = INF
        out.append((ids, prios, moved, new_prios))
    return out


def run_once(kind: str, rows: int, window: int, chunk: int, steps: list[Step]) -> tuple[float, int]:
    """Replay the steps on a fresh queue; return (seconds, rows touched)."""
    q = make_queue(kind, rows, window)
    touched = 0
    t0 = time.perf_counter()
    for s, (ids, prios, moved, new_prios) in enumerate(steps):
        base = s + 1
        q.advance(base)
        q.upsert(ids, prios)
        q.upsert(moved, new_prios)
        touched += ids.size + moved.size
        while q.min_priority() == base:  # the gate: everything due at `base` is written first
            touched += q.pop_min(chunk)[0].size
        touched += q.pop_min(chunk)[0].size  # one background flusher chunk
    return time.perf_counter() - t0, touched


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows in the table")
    ap.add_argument(
        "--batch", type=int, default=16_384, help="rows upserted per step (a quarter then move)"
    )
    ap.add_argument("--steps", type=int, default=100, help="simulated steps per repetition")
    ap.add_argument("--window", type=int, default=10, help="lookahead window L")
    ap.add_argument("--chunk", type=int, default=4096, help="rows per flusher pop")
    ap.add_argument("--repeats", type=int, default=5, help="repetitions per kind (median reported)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="write results here")
    args = ap.parse_args()

    steps = make_steps(args.rows, args.batch, args.steps, args.window, args.seed)
    results: dict[str, dict] = {}
    for kind in QUEUE_KINDS:
        rates, touched = [], 0
        for _ in range(args.repeats):
            seconds, touched = run_once(kind, args.rows, args.window, args.chunk, steps)
            rates.append(touched / seconds)
        results[kind] = {
            "rows_touched_per_repeat": touched,
            "rows_per_s": rates,
            "median_rows_per_s": statistics.median(rates),
        }
    ratio = results["two_level"]["median_rows_per_s"] / results["heap"]["median_rows_per_s"]

    print(
        f"rows={args.rows} batch={args.batch} steps={args.steps} window={args.window} "
        f"chunk={args.chunk} repeats={args.repeats}\n"
    )
    print("| queue | rows touched / repeat | median rows/s | min rows/s | max rows/s |")
    print("|---|---:|---:|---:|---:|")
    for kind, r in results.items():
        print(
            f"| {kind} | {r['rows_touched_per_repeat']:,} | {r['median_rows_per_s']:,.0f} "
            f"| {min(r['rows_per_s']):,.0f} | {max(r['rows_per_s']):,.0f} |"
        )
    print(f"\ntwo_level / heap (median): {ratio:.1f}x")

    if args.json:
        payload = {
            "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "python": platform.python_version(),
            "numpy": np.__version__,
            "results": results,
            "ratio_two_level_over_heap": ratio,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=2) + "\n")


if __name__ == "__main__":
    main()
