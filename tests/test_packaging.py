"""The package metadata leaves torch, FBGEMM and TorchRec alone, and a missing one is named on import.

torchrec_frugal is installed into an environment that already holds TorchRec's stack (docs/install.md):
a requirement on torch, FBGEMM or TorchRec in its metadata would let pip upgrade or replace the build
the user chose, or pull the newest CUDA torch and its NVIDIA packages where none is installed. So the
metadata asks for none of them, and ``torchrec_frugal/required_packages.py`` raises an ImportError that says what
to install first. ``make test-install`` (scripts/check_install.sh) checks the same in a fresh venv.
"""
from __future__ import annotations

import configparser
import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import List

ROOT = Path(__file__).resolve().parents[1]
# Distributions a requirement may not name (normalized): TorchRec's stack and what a CUDA torch brings.
STACK = re.compile(r"^(torch|torch-.*|fbgemm-gpu.*|torchrec.*|nvidia-.*|triton.*)$")


def normalized(requirement: str) -> str:
    """The distribution name of a requirement line, as pip compares it."""
    name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert name, requirement
    return re.sub(r"[-_.]+", "-", name.group(1)).lower()


def setup_cfg_requirements() -> List[str]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    lines: List[str] = []
    for key in ("install_requires", "setup_requires"):
        lines += cfg.get("options", key, fallback="").splitlines()
    if cfg.has_section("options.extras_require"):
        for _, value in cfg.items("options.extras_require"):
            lines += value.splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def test_setup_cfg_asks_for_nothing_of_torchrecs_stack() -> None:
    requirements = setup_cfg_requirements()
    names = {normalized(r) for r in requirements}
    assert {"numpy", "tqdm"} <= names, requirements
    stack = sorted(r for r in requirements if STACK.match(normalized(r)))
    assert not stack, f"setup.cfg requires {stack}: pip would upgrade or replace the user's build (docs/install.md)"
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert "[project]" not in pyproject, "dependencies belong in setup.cfg, where this test reads them"


def test_the_wheel_installs_nothing_but_itself_into_the_stack(tmp_path: Path) -> None:
    """The built wheel's Requires-Dist, and pip's dry-run report of installing it here, beside the stack."""
    src = tmp_path / "src"  # built from a copy: the build writes build/ and *.egg-info where it runs
    src.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "torchrec_frugal", src / "torchrec_frugal", ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    subprocess.run(pip + ["wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(tmp_path / "dist"), str(src)],
                   check=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("torchrec_frugal-*.whl")
    with zipfile.ZipFile(wheel) as z:
        metadata = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    requires = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert sorted(normalized(r) for r in requires) == sorted(normalized(r) for r in setup_cfg_requirements()), requires
    assert not [r for r in requires if STACK.match(normalized(r))], requires

    report = tmp_path / "report.json"
    r = subprocess.run(pip + ["install", "-q", "--dry-run", "--no-index", "--report", str(report), str(wheel)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    installs = [normalized(i["metadata"]["name"]) for i in json.loads(report.read_text())["install"]]
    assert installs == ["torchrec-frugal"], installs


def import_in_subprocess(code: str, blocked: str, tmp_path: Path, path: str = "") -> str:
    """Run ``code`` where importing the module ``blocked`` fails as if it were not installed
    (``sys.modules[name] = None``); what it prints."""
    prelude = f"import sys\nsys.path[:0] = [p for p in [{path!r}] if p]\nfor name in {blocked!r}.split():\n    sys.modules[name] = None\n"
    r = subprocess.run([sys.executable, "-c", prelude + code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


IMPORT_GLUE = """
try:
    import torchrec_frugal.torchrec
except ImportError as e:
    print(type(e).__name__, e.name)
    print(e)
else:
    print("imported")
"""


def test_without_torchrec_the_engine_imports_and_the_glue_says_what_to_install(tmp_path: Path) -> None:
    out = import_in_subprocess("import torchrec_frugal\nprint(torchrec_frugal.FrugalEngine.__name__)\n" + IMPORT_GLUE,
                               "torchrec", tmp_path)
    assert out.startswith("FrugalEngine\nImportError torchrec\n"), out
    assert "- torchrec:" in out and "pip install --no-deps torchrec==1.8.0" in out, out
    assert "- torch:" not in out and "- fbgemm_gpu:" not in out, out
    assert "pip install torch==2.13.0" in out and "fbgemm-gpu-cpu==1.8.0" in out, out  # the whole order
    assert "Install section" in out and "docs/install.md" in out, out
    assert "1.6.1, 1.8.0, 1.9.2" in out, out


def test_without_fbgemm_the_glue_names_fbgemm(tmp_path: Path) -> None:
    """TorchRec itself is installed but cannot load without FBGEMM: FBGEMM alone is named."""
    out = import_in_subprocess(IMPORT_GLUE, "fbgemm_gpu", tmp_path)
    assert out.startswith("ImportError fbgemm_gpu\n"), out
    assert "- fbgemm_gpu:" in out and "- torchrec:" not in out, out
    assert "fbgemm-gpu-cpu==1.8.0" in out and "fbgemm-gpu==1.8.0" in out, out


def test_without_torch_the_package_says_what_to_install(tmp_path: Path) -> None:
    code = """
try:
    import torchrec_frugal
except ImportError as e:
    print(type(e).__name__, e.name)
    print(e)
"""
    out = import_in_subprocess(code, "torch", tmp_path)
    assert out.startswith("ImportError torch\n"), out
    assert "- torch:" in out and "pip install torch==2.13.0" in out and "docs/install.md" in out, out


def test_an_installed_module_that_fails_to_load_raises_its_own_error(tmp_path: Path) -> None:
    """Only an absent module is reported as not installed: a broken one keeps its own error."""
    fake = tmp_path / "fake" / "fbgemm_gpu"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("import frugal_test_no_such_module\n")
    out = import_in_subprocess(IMPORT_GLUE, "", tmp_path, path=str(fake.parent))
    assert out.startswith("ModuleNotFoundError frugal_test_no_such_module\n"), out
    assert "docs/install.md" not in out, out
