"""What torchrec_frugal needs installed before it, and the error that says so.

The package's metadata does not ask for torch, FBGEMM or TorchRec (``setup.cfg`` says why): pip
would otherwise upgrade or replace the build a user installed, or pull a CUDA build of torch and
FBGEMM into a CPU environment. So a missing one is found here, on import: the engine needs torch
(``torchrec_frugal``), the TorchRec glue needs all three (``torchrec_frugal.torchrec``).
"""
from __future__ import annotations

import importlib

# import name -> what to install, on CPU and where CUDA is present (the pinned stack; docs/install.md).
STACK = {
    "torch": "torch (CPU: torch==2.13.0)",
    "fbgemm_gpu": "FBGEMM (CPU: fbgemm-gpu-cpu==1.8.0; CUDA: fbgemm-gpu==1.8.0 from the PyTorch index of your torch's CUDA)",
    "torchrec": "TorchRec (pip install --no-deps torchrec==1.8.0, after torch and FBGEMM)",
}

INSTALL_HELP = (
    "torchrec_frugal does not install torch, FBGEMM or TorchRec itself, so that it never replaces the "
    "builds you chose: install TorchRec's stack first, then torchrec_frugal. On CPU:\n"
    "    pip install torch==2.13.0\n"
    "    pip install fbgemm-gpu-cpu==1.8.0 tensordict==0.15.3 torchmetrics==1.0.3 tqdm pyre-extensions iopath numpy\n"
    "    pip install --no-deps torchrec==1.8.0\n"
    "With CUDA, TorchRec's own install (torch, fbgemm-gpu and torchrec from https://download.pytorch.org/whl/cuXXX). "
    "Supported TorchRec releases: 1.6.1, 1.8.0, 1.9.2. See the Install section of the torchrec_frugal "
    "README (docs/install.md)."
)


def require(*modules: str) -> None:
    """Import each of ``modules`` (names in ``STACK``); raise ImportError naming those not installed.

    Only a module that is absent counts: one that is installed but fails to load (a FBGEMM built for
    another torch, say) raises its own error unchanged, which names the real problem.
    """
    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            top = (e.name or "").split(".")[0]
            if top == name:
                missing.append(name)
            elif top not in missing:  # else it failed for want of one already named (torchrec without FBGEMM)
                raise
    if missing:
        needed = "\n".join(f"  - {name}: {STACK[name]}" for name in missing)
        raise ImportError(f"torchrec_frugal needs, not installed here:\n{needed}\n{INSTALL_HELP}", name=missing[0])
