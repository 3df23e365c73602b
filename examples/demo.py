"""`make demo`: the DLRM example on 2 ranks, Frugal against stock TorchRec.

Runs ``examples/dlrm/train.py`` under torchrun twice on the same configuration and data (the
default one: criteo-kaggle shape at scale 0.1, embedding dim 32, batch 1024 per rank), once with
``--sharder frugal`` and once with ``--sharder torchrec --sharding table_wise``, about half a
minute each on a 2-core machine, then prints samples/s, loss, AUC and gate stall side by side.

    python examples/demo.py                 # what `make demo` does
    python examples/demo.py --steps 60      # a quicker look

It lives beside the examples it runs, not in the installed package, which has no ``examples/``.

``run_train`` (run a train.py under torchrun, return its ``--summary`` JSON plus wall time and the
machine's other load) is also what the benchmarks and the example tests run the examples with.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

if __package__ in (None, ""):  # launched as a script: make `torchrec_frugal` of this checkout importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torchrec_frugal.cost_model import Plan
from torchrec_frugal.datasets import CACHE_RATIO, LOOKAHEAD
from torchrec_frugal.test_utils import children_cpu_s, machine_busy_s

TRAIN_REL = Path("examples") / "dlrm" / "train.py"


class TrainRunError(RuntimeError):
    """A train.py run failed; the message ends with the tail of its output."""


def find_train_script(explicit: Optional[str] = None) -> Path:
    """``explicit``, else the examples/dlrm/train.py beside this file. Exits with a clear message if absent."""
    candidate = Path(explicit) if explicit else Path(__file__).resolve().parent / "dlrm" / "train.py"
    if candidate.is_file():
        return candidate.resolve()
    raise SystemExit(f"{TRAIN_REL} not found at {candidate}: pass --train PATH of the DLRM example's train.py.")


def torchrun_command(train_py: Path, args: Sequence[str], nproc: int) -> List[str]:
    """The torchrun command line (as ``python -m torch.distributed.run``, same interpreter as ours)."""
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
        str(train_py), *args,
    ]  # fmt: skip


def _stop(proc: "subprocess.Popen[Any]") -> None:
    """Terminate a torchrun (it forwards SIGTERM to its ranks); kill it after 30 s."""
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_train(
    train_py: Path,
    args: Sequence[str],
    nproc: int = 2,
    threads: Optional[int] = None,
    log_path: Optional[Path] = None,
    echo: Optional[Callable[[str], None]] = None,
    timeout_s: float = 900.0,
) -> Dict[str, Any]:
    """Run ``torchrun --nproc_per_node=nproc train.py *args --summary TMP --no-progress`` and return the
    summary JSON, plus ``wall_s`` (the whole run, start-up included), ``run_cpu_s`` (CPU of the run's
    processes), ``foreign_cpu_share`` (CPU used by *other* processes on the machine during the run, as a
    share of all cores) and ``command``.

    ``threads``: torch threads per rank (train.py's ``--threads``; also OMP_NUM_THREADS).
    ``echo``: called with each line of the run's stdout as it comes (rank 0's log lines).
    ``log_path``: stdout + stderr of the run go here (a temporary file otherwise, removed on success).
    Raises TrainRunError with the end of the output when the run fails or writes no summary.
    """
    train_py = Path(train_py)
    user_args = list(args) + (["--threads", str(threads)] if threads is not None else [])
    env = dict(os.environ, PYTHONWARNINGS="ignore", PYTHONUNBUFFERED="1")
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    with tempfile.TemporaryDirectory(prefix="frugal_run_") as tmp:
        summary_path = Path(tmp) / "summary.json"
        cmd = torchrun_command(train_py, user_args + ["--summary", str(summary_path), "--no-progress"], nproc)
        log = Path(log_path) if log_path else Path(tmp) / "run.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        timed_out = threading.Event()
        busy0, cpu0, t0 = machine_busy_s(), children_cpu_s(), time.perf_counter()
        with open(log, "w") as logf:
            logf.write("$ " + shlex.join(cmd) + "\n")
            logf.flush()
            proc = subprocess.Popen(
                cmd, cwd=train_py.parents[2], env=env, stdout=subprocess.PIPE, stderr=logf, text=True, bufsize=1
            )

            def _expire() -> None:
                timed_out.set()
                proc.terminate()  # torchrun forwards SIGTERM to its ranks

            timer = threading.Timer(timeout_s, _expire)
            timer.daemon = True
            timer.start()
            try:
                assert proc.stdout is not None
                for line in proc.stdout:
                    logf.write(line)
                    if echo is not None:
                        echo(line.rstrip("\n"))
                rc = proc.wait()
            except BaseException:
                _stop(proc)
                raise
            finally:
                timer.cancel()
        wall = time.perf_counter() - t0
        run_cpu = children_cpu_s() - cpu0
        busy = machine_busy_s() - busy0
        if rc != 0 or not summary_path.is_file():
            tail = log.read_text(errors="replace")[-6000:]
            why = f"timed out after {timeout_s:.0f} s" if timed_out.is_set() else f"exit code {rc}"
            where = f" (full log: {log})" if log_path else ""
            raise TrainRunError(f"{why}: {shlex.join(cmd)}{where}\n...{tail}")
        summary = json.loads(summary_path.read_text())
    summary["wall_s"] = wall
    summary["run_cpu_s"] = run_cpu
    summary["foreign_cpu_share"] = max(0.0, busy - run_cpu) / (wall * (os.cpu_count() or 1)) if busy else None
    rel = os.path.relpath(train_py, train_py.parents[2])
    summary["command"] = (f"OMP_NUM_THREADS={threads} " if threads is not None else "") + shlex.join(
        ["torchrun", "--standalone", f"--nproc_per_node={nproc}", rel, *user_args, "--summary", "SUMMARY.json"]
    )
    return summary


def run_train_nodes(
    train_py: Path,
    args: Sequence[str],
    nodes: int = 2,
    nproc: int = 2,
    threads: Optional[int] = None,
    timeout_s: float = 900.0,
) -> Dict[str, Any]:
    """``nodes`` torchrun launches of ``train.py *args`` on this machine, as on ``nodes`` machines:
    ``--nnodes`` with a static rendezvous on 127.0.0.1, ``nproc`` ranks each, and a shared-memory
    directory per node (TORCHREC_FRUGAL_SHM_DIR), which must be empty afterwards. Returns the
    summary JSON plus ``wall_s``; raises TrainRunError with the end of a failed node's output."""
    from torchrec_frugal.test_utils import free_port

    train_py = Path(train_py)
    user_args = list(args) + (["--threads", str(threads)] if threads is not None else [])
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="frugal_nodes_") as tmp:
        summary_path = Path(tmp) / "summary.json"
        procs, logs = [], []
        t0 = time.perf_counter()
        for k in range(nodes):
            shm_dir = Path(tmp) / f"node{k}"
            shm_dir.mkdir()
            cmd = [
                sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}", f"--node-rank={k}",
                f"--nproc_per_node={nproc}", "--master-addr=127.0.0.1", f"--master-port={port}",
                str(train_py), *user_args, "--summary", str(summary_path), "--no-progress",
            ]  # fmt: skip
            env = dict(os.environ, PYTHONWARNINGS="ignore", PYTHONUNBUFFERED="1", TORCHREC_FRUGAL_SHM_DIR=str(shm_dir))
            if threads is not None:
                env["OMP_NUM_THREADS"] = str(threads)
            log = open(Path(tmp) / f"node{k}.log", "w+")
            logs.append(log)
            procs.append(subprocess.Popen(cmd, cwd=train_py.parents[2], env=env, stdout=log, stderr=subprocess.STDOUT))
        failed = None
        try:
            deadline = time.monotonic() + timeout_s
            for k, proc in enumerate(procs):
                try:
                    rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    rc = None
                if rc != 0 and failed is None:
                    failed = (k, "timed out" if rc is None else f"exit code {rc}")
        finally:
            for proc in procs:
                if proc.poll() is None:
                    _stop(proc)
        wall = time.perf_counter() - t0
        if failed is not None or not summary_path.is_file():
            k, why = failed or (0, "no summary")
            logs[k].seek(0)
            raise TrainRunError(f"node {k} of {nodes}: {why}: {shlex.join(map(str, args))}\n...{logs[k].read()[-6000:]}")
        for log in logs:
            log.close()
        left = [str(f.relative_to(tmp)) for k in range(nodes) for f in (Path(tmp) / f"node{k}").iterdir()]
        if left:
            raise TrainRunError(f"the nodes left shared memory behind: {left}")
        summary = json.loads(summary_path.read_text())
    summary["wall_s"] = wall
    rel = os.path.relpath(train_py, train_py.parents[2])
    summary["command"] = (f"OMP_NUM_THREADS={threads} " if threads is not None else "") + " & ".join(
        shlex.join(["torchrun", f"--nnodes={nodes}", f"--node-rank={k}", f"--nproc_per_node={nproc}",
                    "--master-addr=127.0.0.1", "--master-port=PORT", rel, *user_args])
        for k in range(nodes)
    )  # fmt: skip
    return summary


def run_plan(sharding: str, recorded: Optional[Dict[str, Any]], lookahead: int = LOOKAHEAD) -> Plan:
    """The cost model's plan of a DLRM example run: ``sharding`` on every table with train.py's
    cache ratio and ``lookahead``, or for "planned" (FrugalShardingPlanner with ``--hardware``) the
    per-table choice its summary recorded under "plan"."""
    if sharding != "planned":
        return Plan(sharding, cache_ratio=CACHE_RATIO, lookahead=lookahead)
    if not recorded:
        raise ValueError("a planned run needs the plan its summary recorded")
    return Plan.of(recorded["shardings"], recorded["cache_ratio"] or CACHE_RATIO, recorded["lookahead"])


def _fmt_row(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--steps", type=int, default=200, help="training steps per rank of each run (~25-30 s each on 2 cores)")
    p.add_argument("--nproc", type=int, default=2, help="ranks (torchrun --nproc_per_node)")
    p.add_argument("--batch-size", type=int, default=1024, help="per rank")
    p.add_argument("--config", default="criteo-kaggle")
    p.add_argument("--train", default=None, help="path of the DLRM example's train.py (default: examples/dlrm/train.py beside this file)")
    p.add_argument("--quiet", action="store_true", help="do not echo train.py's log lines")
    args = p.parse_args(argv)
    train_py = find_train_script(args.train)
    threads = max(1, (os.cpu_count() or 1) // args.nproc)
    common = ["--config", args.config, "--batch-size", str(args.batch_size), "--steps", str(args.steps),
              "--log-every", str(max(1, args.steps // 4))]  # fmt: skip
    runs = [
        ("frugal", "Frugal (cache 0.05, L=10)", ["--sharder", "frugal"]),
        ("torchrec", "TorchRec table_wise", ["--sharder", "torchrec", "--sharding", "table_wise"]),
    ]
    print(
        f"Frugal demo: examples/dlrm/train.py on {args.nproc} ranks (CPU/gloo unless CUDA is present), "
        f"{args.config} at its default scale, batch {args.batch_size}/rank, {args.steps} steps per run, "
        f"{threads} thread(s) per rank; same data and model in both runs, only --sharder differs.",
        flush=True,
    )
    results: Dict[str, Dict[str, Any]] = {}
    for key, label, extra in runs:
        print(f"\n== {label}: torchrun --nproc_per_node={args.nproc} {TRAIN_REL} {' '.join(extra + common)}", flush=True)
        echo = None if args.quiet else (lambda line: print("   " + line, flush=True))
        try:
            results[key] = run_train(train_py, extra + common, nproc=args.nproc, threads=threads, echo=echo)
        except TrainRunError as e:
            raise SystemExit(f"the {label} run failed: {e}")
        print(f"   ({results[key]['wall_s']:.0f} s wall, start-up included)", flush=True)

    f, t = results["frugal"], results["torchrec"]
    header = ["", "samples/s", "loss", "AUC", "gate stall", "cache hits", "wall s"]
    widths = [26, 10, 7, 7, 10, 10, 7]
    print("\n" + _fmt_row(header, widths))
    print(_fmt_row(["-" * w for w in widths], widths))
    for key, label, _ in runs:
        r = results[key]
        hits = f"{100 * r['frugal']['cache_hit_ratio']:.1f}%" if r.get("frugal") else "-"
        gate = f"{100 * r['gate_stall_fraction']:.1f}%" if r.get("frugal") else "-"
        print(_fmt_row([label, f"{r['samples_per_second']:,.0f}", f"{r['loss']:.4f}", f"{r['auc']:.4f}", gate, hits,
                        f"{r['wall_s']:.0f}"], widths))  # fmt: skip
    ratio = f["samples_per_second"] / t["samples_per_second"]
    print(f"\nFrugal / TorchRec table_wise samples/s: {ratio:.2f}x;  AUC difference {f['auc'] - t['auc']:+.4f}, "
          f"loss difference {f['loss'] - t['loss']:+.4f} (same data; the tables start from different random values)")
    loads = [r["foreign_cpu_share"] for r in results.values() if r.get("foreign_cpu_share") is not None]
    if loads:
        print(f"Other processes used {100 * max(loads):.0f}% of this machine's CPU during the runs "
              f"(one run each, so samples/s is only indicative; benchmarks/bench_dlrm.py alternates and repeats).")


if __name__ == "__main__":
    main()
