"""Refit the exchange worker's rates of the shipped profiles from the engine as it is now.

The cost model prices the host work beside a Frugal step with three rates: ``exchange_step_s``,
``exchange_row_s`` and ``lookahead_row_s`` (docs/cost_model.md, "Frugal's threads"). ``--calibrate``
measures them with the rest of a machine; this measures only them (``calibration.microbenchmarks.measure_engine``:
one rank, two batch sizes, L = 0 and 10) and writes them into each named profile, with the CPU and
the commit they were measured on in the profile's ``extra.host_thread_rates``. A GPU box's host
runs the same Python and numpy on its own CPU: until one is measured there, its profile carries
this CPU's rates, and says so.

    python benchmarks/refit_host_rates.py --profiles cpu rtx3090 rtx4090 a30 h200
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path
from typing import Any, Dict

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a script: `benchmarks`, `examples`, and `torchrec_frugal` where no installed one wins
    sys.path.append(str(ROOT))

from torchrec_frugal.estimate.calibration.microbenchmarks import measure_engine  # noqa: E402
from torchrec_frugal.estimate.calibration.profile_fit import fit_exchange  # noqa: E402
from benchmarks.measure import git_state  # noqa: E402
from torchrec_frugal.estimate.profiles import builtin_profiles, load_profile  # noqa: E402

PROFILES = ROOT / "torchrec_frugal" / "estimate" / "profiles"


def cpu_model() -> str:
    """The CPU's model name as /proc/cpuinfo gives it, else the platform's processor."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profiles", nargs="+", default=["cpu"], choices=builtin_profiles())
    ap.add_argument("--repeats", type=int, default=3, help="measurements; each rate is the median of their fits")
    args = ap.parse_args()
    fits = []
    for i in range(args.repeats):
        fit = fit_exchange(measure_engine("cpu"))
        print(f"measurement {i + 1}: " + ", ".join(f"{k} {v * 1e6:.3f} us" for k, v in fit.items()), flush=True)
        fits.append(fit)
    rates = {k: sorted(f[k] for f in fits)[len(fits) // 2] for k in fits[0]}
    source: Dict[str, Any] = {
        "cpu": cpu_model(),
        "cores": __import__("os").cpu_count(),
        "commit": git_state(ROOT),
        "command": "python benchmarks/refit_host_rates.py --profiles " + " ".join(args.profiles),
        "fits": fits,
    }
    for name in args.profiles:
        load_profile(name)  # a profile that does not load is not rewritten
        path = PROFILES / f"{name}.json"
        data = json.loads(path.read_text())
        data.update(rates)
        data.setdefault("extra", {})["host_thread_rates"] = source
        path.write_text(json.dumps(data, indent=1) + "\n")
        load_profile(name)
        print(f"{name}: " + ", ".join(f"{k} {v * 1e6:.3f} us" for k, v in rates.items()))


if __name__ == "__main__":
    main()
