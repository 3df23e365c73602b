"""`make demo`: the DLRM example on 2 ranks, Frugal against stock TorchRec: speed and exactness.

Runs ``examples/dlrm/train.py`` under torchrun on one configuration and data (the default one:
criteo-kaggle shape at scale 0.1, embedding dim 32, batch 1024 per rank), alternately with
``--sharder frugal`` and ``--sharder torchrec --sharding table_wise`` (frugal, stock, frugal, stock:
``--repeats`` of each), then prints the median samples/s of each, after how busy the rest of the
machine was, and how far their per-step losses differ. Both sharders start from the same tables
(train.py draws every table from its seed, whatever the sharding) and see the same batches, so an
exact Frugal trains the very model stock TorchRec trains: the losses differ only by float summation
order. Two controls on the same steps say what that looks like: stock ``row_wise``, which sums each
row's gradients in table_wise's order, and stock table_wise from initial tables 1e-7 (relative)
apart, a rounding-sized start; the last table_wise run of the speed comparison is that one (same
work), so the controls cost one run. About 3 minutes on a 2-core machine.

    python examples/demo.py                 # what `make demo` does
    python examples/demo.py --steps 40      # a quicker look

A CPU run shows the exactness and the plugin's overhead; it cannot show the speed-up Frugal targets,
on consumer GPUs whose all-to-alls are bounced through host memory over PCIe, which the cost model
predicts (docs/paper_setting.md).

It lives beside the examples it runs, not in the installed package, which has no ``examples/``.

``run_train`` (run a train.py under torchrun, return its ``--summary`` JSON plus wall time and the
machine's other load) is also what the benchmarks and the example tests run the examples with;
``compare``, ``loss_agreement`` and ``report`` are the demo's comparison.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

if __package__ in (None, ""):  # launched as a script: `examples`, and `torchrec_frugal` where no installed one wins
    sys.path.append(str(Path(__file__).resolve().parents[1]))

from torchrec_frugal.estimate.cost_model import Plan
from torchrec_frugal.config import CACHE_RATIO, LOOKAHEAD
from torchrec_frugal.estimate.timing import children_cpu_s, machine_busy_s

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
    from torchrec_frugal.host.launch import free_port

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
    return Plan.of(recorded["shardings"], CACHE_RATIO if recorded["cache_ratio"] is None else recorded["cache_ratio"],
                   recorded["lookahead"])


CPU_NOTE = (
    "A CPU run shows exactness and the plugin's overhead; it cannot show the PCIe-bound speed-up Frugal "
    "targets on consumer GPUs without peer-to-peer, which the cost model predicts (docs/paper_setting.md)."
)
SHARDERS = {
    "frugal": ("Frugal (cache 0.05, L=10)", ["--sharder", "frugal"]),
    "torchrec": ("TorchRec table_wise", ["--sharder", "torchrec", "--sharding", "table_wise"]),
}
"""The speed comparison: each is run ``repeats`` times, alternately."""
PERTURBATION = "1e-7"
CONTROLS = {
    "row_wise": ("TorchRec row_wise (control)", ["--sharder", "torchrec", "--sharding", "row_wise"]),
    "perturbed": (f"TorchRec table_wise, tables {PERTURBATION} apart (control)",
                  ["--sharder", "torchrec", "--sharding", "table_wise", "--init-perturbation", PERTURBATION]),
}
"""The exactness controls, each compared step by step with stock table_wise: another stock sharding
(row_wise), and stock table_wise itself from initial tables ``PERTURBATION`` (relative) apart,
which shows how far this model carries a rounding-sized difference. Why both: a loss difference
alone does not say whether it is rounding; these say what rounding looks like on the same steps."""


def loss_agreement(
    frugal: Sequence[Dict[str, Any]], stock: Sequence[Dict[str, Any]], tolerance: float = 1e-5
) -> Dict[str, Any]:
    """How far the per-step losses (train.py's summary ``step_losses``) of the ``frugal`` runs are
    from those of the ``stock`` runs, over every step of every (frugal, stock) pair: ``max_abs``
    (max |loss_frugal - loss_stock|), ``max_rel`` (the same over |loss_stock|), ``worst_step`` (the
    index of the step of ``max_abs``), ``agree_steps`` (the steps before the first whose relative
    difference exceeds ``tolerance`` in any pair), ``steps`` and ``pairs``. ValueError if a run has no per-step
    losses or the runs trained different steps."""
    if not frugal or not stock:
        raise ValueError("loss_agreement needs at least one run of each sharder")
    first = frugal[0]
    for r in (*frugal, *stock):
        if not r.get("step_losses"):
            raise ValueError(f"a {r.get('sharder')} run's summary has no step_losses")
        if (len(r["step_losses"]), r.get("step_losses_from", 0)) != (len(first["step_losses"]), first.get("step_losses_from", 0)):
            raise ValueError("the runs trained different steps: their losses do not compare step by step")
    max_abs, max_rel, worst = 0.0, 0.0, 0
    agree = len(first["step_losses"])
    for f in frugal:
        for t in stock:
            for i, (a, b) in enumerate(zip(f["step_losses"], t["step_losses"])):
                d = abs(a - b)
                if d > max_abs:
                    max_abs, worst = d, i
                rel = d / abs(b) if b else (0.0 if d == 0 else float("inf"))
                max_rel = max(max_rel, rel)
                if rel > tolerance:
                    agree = min(agree, i)
    return {"max_abs": max_abs, "max_rel": max_rel, "worst_step": worst, "agree_steps": agree,
            "tolerance": tolerance, "steps": len(first["step_losses"]), "pairs": len(frugal) * len(stock)}  # fmt: skip


def _median(xs: Sequence[float]) -> float:
    ys = sorted(xs)
    n = len(ys)
    return ys[n // 2] if n % 2 else 0.5 * (ys[n // 2 - 1] + ys[n // 2])


def run_order(repeats: int, controls: Sequence[str] = ()) -> List[str]:
    """The runs of :func:`compare` in order, as keys of :data:`SHARDERS` and :data:`CONTROLS`: frugal
    and stock table_wise alternate, ``repeats`` of each; the row_wise control follows the first pair.
    The perturbed control does a table_wise run's work, so with two or more repeats it is the last
    table_wise run (a control that costs no run), else it runs last."""
    unknown = set(controls) - set(CONTROLS)
    if unknown:
        raise ValueError(f"unknown control(s) {sorted(unknown)}; choose from {sorted(CONTROLS)}")
    order: List[str] = []
    for i in range(repeats):
        order += list(SHARDERS)
        if i == 0 and "row_wise" in controls:
            order.append("row_wise")
    if "perturbed" in controls:
        if repeats >= 2:
            order[max(i for i, k in enumerate(order) if k == "torchrec")] = "perturbed"
        else:
            order.append("perturbed")
    return order


def compare(
    train_py: Path,
    args: Sequence[str],
    nproc: int = 2,
    threads: Optional[int] = None,
    repeats: int = 2,
    echo: Optional[Callable[[str], None]] = None,
    say: Callable[[str], None] = lambda line: None,
    timeout_s: float = 900.0,
    controls: Sequence[str] = (),
) -> Dict[str, Any]:
    """Run train.py ``*args`` with each sharder of :data:`SHARDERS`, alternately (frugal, stock,
    frugal, stock, ...; ``repeats`` runs of each), and the ``controls`` (keys of :data:`CONTROLS`) in
    :func:`run_order`, and return ``runs`` (sharder -> its summaries in run order; a perturbed
    control that stands in for a table_wise run counts there, marked ``"demo_run": "perturbed"``),
    ``samples_per_second`` (sharder -> the median), ``agreement`` (:func:`loss_agreement` of the
    frugal runs against the unperturbed stock ones), ``controls`` (control -> its summary),
    ``control_agreement`` (control -> its :func:`loss_agreement` against those stock runs) and
    ``rerun_max_abs`` (reruns of one sharder from equal tables against each other; None if none).
    ``say`` gets a line as each run starts and ends; ``echo`` each line of a run's stdout.
    TrainRunError if a run fails."""
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    order = run_order(repeats, controls)
    variants = {**SHARDERS, **CONTROLS}
    runs: Dict[str, List[Dict[str, Any]]] = {k: [] for k in SHARDERS}
    control_runs: Dict[str, Dict[str, Any]] = {}
    speed_perturbed = repeats >= 2
    for n, key in enumerate(order, 1):
        label, extra = variants[key]
        say(f"== run {n} of {len(order)}, {label}: torchrun --nproc_per_node={nproc} {TRAIN_REL} {' '.join([*extra, *args])}")
        r = run_train(train_py, [*extra, *args], nproc=nproc, threads=threads, echo=echo, timeout_s=timeout_s)
        say(f"   {r['samples_per_second']:,.0f} samples/s ({r['wall_s']:.0f} s wall, start-up included)")
        r["demo_run"] = key
        if key in SHARDERS:
            runs[key].append(r)
        else:
            control_runs[key] = r
            if key == "perturbed" and speed_perturbed:
                runs["torchrec"].append(r)
    reference = [r for r in runs["torchrec"] if r["demo_run"] == "torchrec"]
    reruns = [rs for rs in ([r for r in runs["frugal"]], reference) if len(rs) > 1]
    return {
        "runs": runs,
        "samples_per_second": {k: _median([r["samples_per_second"] for r in rs]) for k, rs in runs.items()},
        "agreement": loss_agreement(runs["frugal"], reference),
        "controls": control_runs,
        "control_agreement": {k: loss_agreement([r], reference) for k, r in control_runs.items()},
        "rerun_max_abs": max(loss_agreement(rs[:1], rs[1:])["max_abs"] for rs in reruns) if reruns else None,
    }


WIDTH = 100
"""Columns of the report's prose and tables."""


def _fmt_row(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()


def _first_apart(agree: Dict[str, Any]) -> str:
    """The first step whose losses differ by more than the tolerance, or "never"."""
    return "never" if agree["agree_steps"] >= agree["steps"] else f"step {agree['agree_steps']}"


def load_text(runs: Sequence[Dict[str, Any]]) -> str:
    """How busy the rest of the machine was during ``runs``, said before any speed figure: a ratio
    read on a loaded machine is only indicative."""
    loads = [r["foreign_cpu_share"] for r in runs if r.get("foreign_cpu_share") is not None]
    if not loads:
        return "the machine's other load was not measured"
    worst = max(loads)
    if worst > 0.1:
        return (f"other processes used up to {100 * worst:.0f}% of this machine's CPU during the runs, "
                "so the ratio is only indicative (benchmarks/bench_dlrm.py repeats more)")  # fmt: skip
    return f"the machine was otherwise idle (other processes used at most {100 * worst:.0f}% of its CPU)"


def report(result: Dict[str, Any]) -> List[str]:
    """The demo's closing lines: a table of the runs (median samples/s and each run's, final loss
    and AUC of the last run, gate stall, cache hits); the speed ratio, after how loaded the machine
    was; the per-step loss differences against stock table_wise of Frugal and of each control, and
    what they say; then what a CPU run can and cannot show."""
    runs, median, agree = result["runs"], result["samples_per_second"], result["agreement"]
    controls = result.get("controls", {})
    header = ["", "samples/s", "(each run)", "loss", "AUC", "gate stall", "cache hits"]
    widths = [26, 10, 18, 7, 7, 10, 10]
    lines = [_fmt_row(header, widths), _fmt_row(["-" * w for w in widths], widths)]
    rows = [(SHARDERS[k][0], runs[k], median[k]) for k in SHARDERS]
    if "row_wise" in controls:
        rows.append(("TorchRec row_wise", [controls["row_wise"]], controls["row_wise"]["samples_per_second"]))
    marked = False
    for label, rs, med in rows:
        last = next((r for r in reversed(rs) if r.get("demo_run") != "perturbed"), rs[-1])  # loss, AUC: from equal tables
        hits = f"{100 * last['frugal']['cache_hit_ratio']:.1f}%" if last.get("frugal") else "-"
        gate = f"{100 * last['gate_stall_fraction']:.1f}%" if last.get("frugal") else "-"
        each = " ".join(f"{r['samples_per_second']:,.0f}" + ("*" if r.get("demo_run") == "perturbed" else "") for r in rs)
        marked = marked or "*" in each
        lines.append(_fmt_row([label, f"{med:,.0f}", each, f"{last['loss']:.4f}", f"{last['auc']:.4f}", gate, hits], widths))
    if marked:
        lines.append(f"* from tables {PERTURBATION} apart (the rounding control below): the same work as the other "
                     "table_wise runs")  # fmt: skip
    n = len(runs["frugal"])
    speed_runs = [r for rs in runs.values() for r in rs]
    lines.append("")
    lines += textwrap.wrap(f"Speed: {load_text(speed_runs)}. Frugal / TorchRec table_wise: "
                           f"{median['frugal'] / median['torchrec']:.2f}x samples/s (medians of {n} alternated "
                           f"run{'s' if n > 1 else ''} each).", WIDTH)  # fmt: skip
    lines.append("")
    lines.append(f"Exactness: per-step loss against stock table_wise's over {agree['steps']} steps (same batches):")
    tol = f"{agree['tolerance']:g}".replace("e-0", "e-")
    pw = [39, 16, 12, 26]
    lines.append(_fmt_row(["", "max |difference|", "max relative", f"first step > {tol} relative"], pw))
    pairs = [("Frugal", agree)]
    ca = result.get("control_agreement", {})
    if "row_wise" in ca:
        pairs.append(("row_wise (control)", ca["row_wise"]))
    if "perturbed" in ca:
        pairs.append((f"table_wise, tables {PERTURBATION} apart (control)", ca["perturbed"]))
    rerun = result.get("rerun_max_abs")
    for label, a in pairs:
        lines.append(_fmt_row([label, f"{a['max_abs']:.2g}", f"{a['max_rel']:.2g}", _first_apart(a)], pw))
    lines.append("")
    lines += _exactness_words(agree, ca, rerun)
    if any(r.get("device") == "cpu" for r in speed_runs):
        lines += [""] + textwrap.wrap(CPU_NOTE, WIDTH)
    return lines


def _exactness_words(agree: Dict[str, Any], ca: Dict[str, Dict[str, Any]], rerun: Optional[float]) -> List[str]:
    """What the exactness table says, from its numbers: whether row_wise matched table_wise bit for
    bit, and how Frugal's drift compares with the rounding control's."""
    words = ["Frugal sums each row's gradients in another order than stock (per rank, then across ranks); "
             "the same gradients summed in another order round differently, and this model carries such a "
             "difference far."]  # fmt: skip
    if "row_wise" in ca:
        rw = ca["row_wise"]["max_abs"]
        words.append("Stock row_wise sums them in table_wise's order: "
                     + ("its losses match bit for bit." if rw == 0 else f"its losses differ by up to {rw:.2g}."))
    if "perturbed" in ca:
        p = ca["perturbed"]["max_abs"]
        f = agree["max_abs"]
        if f <= p:
            words.append(f"Stock table_wise from tables {PERTURBATION} apart parts from itself by {p:.2g}: Frugal's "
                         f"{f:.2g} is no more than that rounding-sized start gives.")  # fmt: skip
        else:
            words.append(f"Stock table_wise from tables {PERTURBATION} apart parts from itself by {p:.2g}; Frugal's "
                         f"{f:.2g} is {f / p:.1f}x that (docs/performance.md, Loss agreement).")  # fmt: skip
    if rerun is not None:
        words.append("Reruns of one sharding from equal tables " + ("match bit for bit." if rerun == 0 else f"differ by {rerun:.2g}."))
    return textwrap.wrap(" ".join(words), WIDTH)


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--steps", type=int, default=100, help="training steps per rank of each run")
    p.add_argument("--repeats", type=int, default=2, help="runs of each sharder, alternated")
    p.add_argument("--nproc", type=int, default=2, help="ranks (torchrun --nproc_per_node)")
    p.add_argument("--batch-size", type=int, default=1024, help="per rank")
    p.add_argument("--config", default="criteo-kaggle", help="train.py --config")
    p.add_argument("--scale", type=float, default=None, help="train.py --scale; none: the config's")
    p.add_argument("--no-controls", action="store_true", help="skip the exactness controls (row_wise, perturbed tables)")
    p.add_argument("--train", default=None, help="path of the DLRM example's train.py; none: examples/dlrm/train.py beside this file")
    p.add_argument("--quiet", action="store_true", help="do not echo train.py's log lines")
    args = p.parse_args(argv)
    if args.steps < 2 or args.repeats < 1:
        p.error("--steps must be >= 2 and --repeats >= 1")
    train_py = find_train_script(args.train)
    threads = max(1, (os.cpu_count() or 1) // args.nproc)
    common = ["--config", args.config, "--batch-size", str(args.batch_size), "--steps", str(args.steps),
              "--log-every", str(max(1, args.steps // 4))]  # fmt: skip
    if args.scale is not None:
        common += ["--scale", str(args.scale)]
    controls = () if args.no_controls else tuple(CONTROLS)
    order = run_order(args.repeats, controls)
    intro = (
        f"Frugal demo: examples/dlrm/train.py on {args.nproc} ranks (CPU/gloo unless CUDA is present), "
        f"{args.config} at {'scale ' + str(args.scale) if args.scale is not None else 'its default scale'}, "
        f"batch {args.batch_size}/rank, {args.steps} steps per run, {threads} thread(s) per rank; "
        f"{len(order)} runs: frugal and stock table_wise alternate, {args.repeats} run{'s' if args.repeats > 1 else ''} each"
        + ("; controls for exactness: stock row_wise, and stock table_wise from tables "
           f"{PERTURBATION} apart" if controls else "")
        + "; same data, initial tables and model, only the sharding differs."
    )
    print("\n".join(textwrap.wrap(intro, WIDTH)), flush=True)
    t0 = time.perf_counter()
    echo = None if args.quiet else (lambda line: print("   " + line, flush=True))
    try:
        result = compare(train_py, common, nproc=args.nproc, threads=threads, repeats=args.repeats, echo=echo,
                         say=lambda line: print(line, flush=True), controls=controls)  # fmt: skip
    except TrainRunError as e:
        raise SystemExit(f"a run failed: {e}")
    print("")
    for line in report(result):
        print(line)
    print(f"({time.perf_counter() - t0:.0f} s in all)", flush=True)


if __name__ == "__main__":
    main()
