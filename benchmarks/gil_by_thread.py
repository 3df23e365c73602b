"""How long each thread held the GIL, from a py-spy recording made with ``--gil --threads -f raw``.

A planner thread takes the interpreter from the training thread only while it runs Python, not
while it is inside a torch or numpy kernel that releases the GIL. So the time a background thread
holds the GIL per step bounds what moving its work into another process could give back to the
training thread. Record the DLRM example, then sum:

    py-spy record --gil --threads --subprocesses -f raw -r 250 -o gil.txt -- \\
        python benchmarks/time_dlrm_calls.py --sharder frugal --config criteo-kaggle --scale 0.1 \\
        --steps 60 --threads 1 --no-progress --batch-size 4096
    python benchmarks/gil_by_thread.py gil.txt --rate 250 --steps 60

Threads are named as the run names them (``frugal-planner``, ``frugal-exchange``, ...; numbered
ones are summed by role). ``MainThread`` includes set-up (imports, data, model); the frugal threads
exist only while training, so their figure per step is theirs alone.
"""
from __future__ import annotations

import argparse
import collections
import re
from typing import Counter, Dict, List, Tuple

_THREAD = re.compile(r"thread \(\d+\): ([^;]+)")


def gil_seconds(path: str, rate: float) -> Dict[str, float]:
    """Seconds of GIL held per thread role (samples / rate); threads py-spy saw unnamed are ``?``."""
    samples: Counter[str] = collections.Counter()
    with open(path) as f:
        for line in f:
            stack, count = line.rstrip("\n").rsplit(" ", 1)
            found = _THREAD.search(stack)
            samples[re.sub(r"-\d+$", "", found.group(1)) if found else "?"] += int(count)
    return {name: n / rate for name, n in samples.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("recording", help="py-spy raw output recorded with --gil --threads")
    p.add_argument("--rate", type=float, required=True, help="the recording's samples per second (py-spy -r)")
    p.add_argument("--steps", type=int, required=True, help="training steps the run made")
    args = p.parse_args()
    rows: List[Tuple[str, float]] = sorted(gil_seconds(args.recording, args.rate).items(), key=lambda kv: -kv[1])
    print(f"{'thread':24s} {'GIL held, s':>12s} {'ms per step':>12s}")
    for name, seconds in rows:
        print(f"{name:24s} {seconds:12.2f} {1000 * seconds / args.steps:12.2f}")


if __name__ == "__main__":
    main()
