"""The bookkeeping of scripts/device_check.sh, kept out of bash so that it is tested without a GPU.

    python scripts/device_report.py suite RES NAME RC LOG [--summary JSON] [--expect REGEX] [--allow-skips]
    python scripts/device_report.py info RES NAME TEXT
    python scripts/device_report.py verdict RES

``RES`` is the check's result folder: ``tests.tsv`` (suite and result per line, the table that
``benchmarks/bench_gpu.py --render`` puts into docs/gpu.md) and ``status.tsv`` (suite and pass or
fail). A suite passes only if it exited 0 and, unless ``--allow-skips``, skipped nothing: on the
GPU machine a skipped CUDA test is a test that did not run. ``verdict`` exits 1 if any suite
failed or none was recorded.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_RCS = (124, 137)


def pytest_summary(log: str) -> str:
    """pytest's closing counts (e.g. "5 passed, 1 skipped in 3.2s"), or "" if the log has none."""
    lines = [ln.strip("= ").strip() for ln in log.splitlines() if re.search(r"\d+ (passed|failed|error|errors|skipped)\b", ln)]
    return lines[-1] if lines else ""


def example_summary(summary: Dict[str, Any]) -> str:
    """One line of what an example script's JSON summary says about its run."""
    parts = [f"{summary['world_size']} rank(s), {summary['backend']} on {summary['device']}", f"{summary['steps']} steps"]
    parts.append(f"loss {summary['loss']:.4f}")
    if summary.get("auc") is not None:
        parts.append(f"AUC {summary['auc']:.4f}")
    if summary.get("mrr") is not None:
        parts.append(f"MRR {summary['mrr']:.4f}")
    parts.append(f"{summary['samples_per_second']:,.0f} samples/s")
    return ", ".join(parts)


def suite_result(
    rc: int,
    log: str,
    summary: Optional[Dict[str, Any]],
    allow_skips: bool = False,
    expect: Optional[str] = None,
    summary_expected: bool = False,
) -> Tuple[str, bool]:
    """(result text, passed) of one suite from its exit code and output.

    ``summary``: an example script's JSON summary (None: none was written, a failure if
    ``summary_expected``). ``expect``: a regular expression the output must match (an example
    without a summary, e.g. the README's). A pytest run passes with exit 0 and nothing skipped
    (unless ``allow_skips``).
    """
    counts = pytest_summary(log)
    last = next((ln.strip() for ln in reversed(log.splitlines()) if ln.strip()), "no output")
    problems = []
    if summary is not None:
        text = example_summary(summary)
    elif counts:
        text = counts
    else:
        text = last[:200]
    if rc in TIMEOUT_RCS:
        text = f"timed out ({text})"
    if rc == 0:
        if counts and re.search(r"\d+ skipped", counts) and not allow_skips:
            problems.append("a test that must run here was skipped")
        if expect is not None and re.search(expect, log) is None:
            problems.append("the expected output line is missing")
        if summary_expected and summary is None:
            problems.append("no summary was written")
        elif summary is None and expect is None and not counts:
            problems.append("no test counts and no summary")
    passed = rc == 0 and not problems
    return f"{text}{': ' + '; '.join(problems) if problems else ''} (exit {rc})", passed


def _append(path: Path, *fields: str) -> None:
    """One line of a table file; "|" escaped, as the table becomes a markdown table in docs/gpu.md."""
    with path.open("a") as f:
        f.write("\t".join(x.replace("\t", " ").replace("\n", " ").replace("|", "\\|") for x in fields) + "\n")


def record_suite(res: Path, name: str, result: Tuple[str, bool]) -> bool:
    """Append a suite's :func:`suite_result` to both tables of ``res``; returns whether it passed."""
    text, passed = result
    _append(res / "tests.tsv", name, text)
    _append(res / "status.tsv", name, "pass" if passed else "fail")
    return passed


def verdict(res: Path) -> Tuple[int, List[str]]:
    """(exit code, the failed suites): 1 if any suite failed or none ran."""
    status = res / "status.tsv"
    lines = [ln.split("\t") for ln in status.read_text().splitlines()] if status.exists() else []
    failed = [name for name, state in lines if state != "pass"]
    return (1 if failed or not lines else 0), failed


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("suite", help="record one suite's result")
    p.add_argument("res")
    p.add_argument("name")
    p.add_argument("rc", type=int)
    p.add_argument("log")
    p.add_argument("--summary", default=None, help="an example script's JSON summary (required if given)")
    p.add_argument("--expect", default=None, help="a regular expression the output must match")
    p.add_argument("--allow-skips", action="store_true")
    p = sub.add_parser("info", help="record a line of the table that is not a suite (e.g. the stack)")
    p.add_argument("res")
    p.add_argument("name")
    p.add_argument("text")
    p = sub.add_parser("verdict", help="exit 1 if any suite failed")
    p.add_argument("res")
    args = ap.parse_args(argv)

    if args.cmd == "info":
        _append(Path(args.res) / "tests.tsv", args.name, args.text)
        return 0
    if args.cmd == "suite":
        log = Path(args.log).read_text(errors="replace") if Path(args.log).exists() else ""
        summary = json.loads(Path(args.summary).read_text()) if args.summary and Path(args.summary).exists() else None
        result = suite_result(args.rc, log, summary, args.allow_skips, args.expect, args.summary is not None)
        passed = record_suite(Path(args.res), args.name, result)
        print(f"[{'pass' if passed else 'FAIL'}] {args.name}", flush=True)
        return 0
    code, failed = verdict(Path(args.res))
    if code:
        print("device check FAILED: " + ("; ".join(failed) if failed else "no suite ran"), file=sys.stderr)
    else:
        print("device check passed: every suite")
    return code


if __name__ == "__main__":
    sys.exit(main())
