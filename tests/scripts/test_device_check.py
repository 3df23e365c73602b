"""scripts/device_check.sh and what it relies on, without a GPU: its refusal where CUDA is missing,
the wheel fetch, the suite bookkeeping and the report it renders into docs/gpu.md.

The scripts run from a copy of scripts/ (and docs/) in a temporary folder, so that nothing here
writes into the working tree.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Dict, Tuple

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
PINS = [
    "torchrec==1.6.1",
    "fbgemm-gpu-cpu==1.6.0",
    "tensordict==0.11.0",
    "pyvers==0.2.3",
    "iopath==0.1.9",
    "portalocker==4.4.2",
    "cloudpickle==3.1.3",
    "orjson==3.13.0",
    "importlib_metadata==10.2.0",
]


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


report = _load(REPO / "scripts" / "device_report.py", "device_report")


def _copy_repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    shutil.copytree(REPO / "scripts", root / "scripts")
    shutil.copytree(REPO / "docs", root / "docs")
    return root


def _executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _run(cmd: list, env: Dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env={**os.environ, **env}, cwd=cwd, capture_output=True, text=True, timeout=120)


# ---------------------------------------------------------------------------------------------- the check
def _check_with_smi(tmp_path: Path, smi: str, env: Dict[str, str]) -> Tuple[subprocess.CompletedProcess, str, bool]:
    """Run device_check.sh from a copy of the repository with ``smi`` as nvidia-smi: (result, its
    output, whether docs/gpu.md is unchanged)."""
    root = _copy_repo(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _executable(bin_dir / "nvidia-smi", smi)
    before = (root / "docs" / "gpu.md").read_text()
    r = _run(["bash", str(root / "scripts" / "device_check.sh")],
             {"OUT": str(tmp_path / "out"), "PATH": f"{bin_dir}:{os.environ['PATH']}", **env}, root)  # fmt: skip
    out = r.stdout + r.stderr  # the check sends everything to its log and the terminal
    return r, out, (root / "docs" / "gpu.md").read_text() == before


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_check_refuses_without_a_gpu(tmp_path: Path) -> None:
    r, out, docs_unchanged = _check_with_smi(tmp_path, "#!/bin/sh\necho 'NVIDIA-SMI has failed: no driver' >&2\nexit 9\n", {})
    assert r.returncode == 2, out
    assert "device check not run: no NVIDIA GPU here" in out
    assert docs_unchanged


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_check_refuses_a_torch_without_cuda(tmp_path: Path) -> None:
    """A GPU is listed but python's torch cannot use it: nothing runs, exit 2, a clear message."""
    r, out, docs_unchanged = _check_with_smi(tmp_path, "#!/bin/sh\necho 'Fake GPU, 1.0, 1024 MiB'\n", {"PYTHON": sys.executable})
    assert r.returncode == 2, out
    assert "Fake GPU" in out and "torch sees no CUDA device" in out
    assert "has no CUDA build of torch that sees the GPU" in out
    assert docs_unchanged
    assert (tmp_path / "out" / "status.tsv").read_text() == ""  # no suite ran


# ---------------------------------------------------------------------------------------------- wheel fetch
FAKE_PIP = """#!/usr/bin/env python3
import sys
from pathlib import Path
args = sys.argv[1:]
Path({log!r}).write_text(" ".join(args))
out = Path(args[args.index("-d") + 1])
for req in (a for a in args if "==" in a):
    name, version = req.split("==")
    (out / f"{{name.replace('-', '_')}}-{{version}}-py3-none-any.whl").write_bytes(b"0" * {size})
"""


@pytest.mark.parametrize("size, limit_mb, ok", [(1000, 48, True), (200_000, 1, False)])
def test_fetch_asks_for_the_pinned_stack_and_checks_its_size(tmp_path: Path, size: int, limit_mb: int, ok: bool) -> None:
    root = _copy_repo(tmp_path)
    log = tmp_path / "pip-args"
    pip = _executable(tmp_path / "fakepip", FAKE_PIP.format(log=str(log), size=size))
    r = _run(["bash", str(root / "scripts" / "fetch_device_wheels.sh")], {"PIP": str(pip), "CARRY_LIMIT_MB": str(limit_mb)}, root)
    args = log.read_text().split()
    assert args[0] == "download" and "--no-deps" in args and "--only-binary=:all:" in args
    assert args[args.index("--python-version") + 1] == "3.12" and args[args.index("--implementation") + 1] == "cp"
    assert "manylinux_2_28_x86_64" in args and "any" in args
    assert [a for a in args if "==" in a] == PINS
    assert len(list((root / ".whl").glob("*.whl"))) == len(PINS)
    if ok:
        assert r.returncode == 0 and "(9 wheels): carry .whl" in r.stdout, r.stdout + r.stderr
    else:
        assert r.returncode == 1 and "over the 1 MiB that may travel" in r.stderr


def test_fetch_fails_when_a_wheel_is_missing(tmp_path: Path) -> None:
    root = _copy_repo(tmp_path)
    pip = _executable(tmp_path / "fakepip", FAKE_PIP.format(log=str(tmp_path / "args"), size=10))
    r = _run(["bash", str(root / "scripts" / "fetch_device_wheels.sh")],
             {"PIP": str(pip), "DEVICE_WHEELS": "torchrec==1.6.1 nothing-here"}, root)
    assert r.returncode == 1 and "fetched 1 wheels for 2 requirements" in r.stderr


# ---------------------------------------------------------------------------------------------- bookkeeping
PYTEST_OK = "....\n===== 4 passed in 3.10s =====\n"
PYTEST_SKIPPED = "sss\n3 skipped in 0.1s\n"
PYTEST_FAILED = "F.\nFAILED tests/x.py::test_a - AssertionError\n1 failed, 1 passed in 2.00s\n"
DLRM_SUMMARY = {"world_size": 2, "backend": "gloo", "device": "cuda", "steps": 60, "loss": 0.6931, "auc": 0.51,
                "samples_per_second": 12345.6}


def test_suite_results() -> None:
    assert report.suite_result(0, PYTEST_OK, None) == ("4 passed in 3.10s (exit 0)", True)
    text, ok = report.suite_result(0, PYTEST_SKIPPED, None)
    assert not ok and text == "3 skipped in 0.1s: a test that must run here was skipped (exit 0)"
    assert report.suite_result(0, PYTEST_SKIPPED, None, allow_skips=True)[1]
    assert report.suite_result(1, PYTEST_FAILED, None) == ("1 failed, 1 passed in 2.00s (exit 1)", False)
    assert report.suite_result(124, "....\n", None) == ("timed out (....) (exit 124)", False)
    assert report.suite_result(0, "", None) == ("no output: no test counts and no summary (exit 0)", False)
    text, ok = report.suite_result(0, "log\n", DLRM_SUMMARY, summary_expected=True)
    assert ok and text == "2 rank(s), gloo on cuda, 60 steps, loss 0.6931, AUC 0.5100, 12,346 samples/s (exit 0)"
    assert report.suite_result(0, "done\n", None, summary_expected=True) == ("done: no summary was written (exit 0)", False)
    assert report.suite_result(0, "rank 0 of 2 (cuda:0, gloo): last loss 0.5\n", None, expect=r"rank 0 of 2 \(cuda:0")[1]
    text, ok = report.suite_result(0, "rank 0 of 2 (cpu, gloo): last loss 0.5\n", None, expect=r"rank 0 of 2 \(cuda:0")
    assert not ok and "the expected output line is missing" in text


def test_cli_records_suites_and_the_verdict_fails_loudly(tmp_path: Path) -> None:
    res = tmp_path / "res"
    res.mkdir()
    cli = [sys.executable, str(REPO / "scripts" / "device_report.py")]

    def suite(*args: str) -> None:
        assert subprocess.run(cli + ["suite", str(res), *args], capture_output=True, text=True).returncode == 0

    (tmp_path / "ok.log").write_text(PYTEST_OK)
    (tmp_path / "ex.log").write_text("[dlrm] ... 2 ranks (gloo, cuda, 2 threads each)\n")
    (tmp_path / "ex.json").write_text(json.dumps(DLRM_SUMMARY))
    subprocess.run(cli + ["info", str(res), "stack", "torch 2.11, torchrec 1.6.1 | fbgemm"], check=True)
    suite("unit tests", "0", str(tmp_path / "ok.log"))
    suite("dlrm, 2 ranks", "0", str(tmp_path / "ex.log"), "--summary", str(tmp_path / "ex.json"), "--expect", r"ranks \(gloo, cuda")
    r = subprocess.run(cli + ["verdict", str(res)], capture_output=True, text=True)
    assert r.returncode == 0 and "every suite" in r.stdout
    suite("graph, 4 ranks", "0", str(tmp_path / "ex.log"), "--summary", str(tmp_path / "missing.json"))
    r = subprocess.run(cli + ["verdict", str(res)], capture_output=True, text=True)
    assert r.returncode == 1 and "device check FAILED: graph, 4 ranks" in r.stderr
    rows = [line.split("\t") for line in (res / "tests.tsv").read_text().splitlines()]
    assert [r[0] for r in rows] == ["stack", "unit tests", "dlrm, 2 ranks", "graph, 4 ranks"]
    assert rows[0][1] == "torch 2.11, torchrec 1.6.1 \\| fbgemm"  # a markdown table cell
    assert (res / "status.tsv").read_text().splitlines() == ["unit tests\tpass", "dlrm, 2 ranks\tpass", "graph, 4 ranks\tfail"]
    empty = tmp_path / "empty"
    empty.mkdir()
    r = subprocess.run(cli + ["verdict", str(empty)], capture_output=True, text=True)
    assert r.returncode == 1 and "no suite ran" in r.stderr


def test_report_renders_the_suites_into_docs_gpu_md(tmp_path: Path) -> None:
    """The table the check records goes through benchmarks/bench_gpu.py's renderer (placeholder figures)."""
    res = tmp_path
    report.record_suite(res, "CUDA unit tests", report.suite_result(0, PYTEST_OK, None))
    report.record_suite(res, "dlrm example, 4 rank(s)", report.suite_result(0, "x\n", DLRM_SUMMARY, summary_expected=True))
    with (res / "tests.tsv").open("a") as f:
        f.write("stack\tPython 3.12.3, torch 2.11.0+cu130, torchrec 1.6.1\n")
    bench = _load(REPO / "benchmarks" / "bench_gpu.py", "bench_gpu")
    results = {
        "facts": {"gpu": "GPU-X", "driver": "1.0", "cuda_runtime": "13.0", "torch": "2.11", "python": "3.12", "date": "D"},
        "paths": {"table_bytes": 1 << 30, "gather": [], "flush": []},
        "gate": [],
    }
    md = bench.render(results, str(res / "tests.tsv"))
    assert "| CUDA unit tests | 4 passed in 3.10s (exit 0) |" in md
    assert "| dlrm example, 4 rank(s) | 2 rank(s), gloo on cuda, 60 steps, loss 0.6931" in md
    assert "| stack | Python 3.12.3, torch 2.11.0+cu130, torchrec 1.6.1 |" in md
