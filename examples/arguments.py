"""The examples' argument parser: under torchrun every rank parses the command line, and a mistake
should read as one short line, once, not a usage screen per rank."""
from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn


def is_first_rank() -> bool:
    """Rank 0 of torchrun's launch, or a process started without it."""
    return os.environ.get("RANK", "0") == "0"


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors print ``<prog>: error: <message>`` and where to find
    the options, on rank 0 only, and exit with status 2 on every rank (torchrun then stops the job)."""

    def error(self, message: str) -> NoReturn:
        if is_first_rank():
            sys.stderr.write(f"{self.prog}: error: {message}\n(`{self.prog} --help` lists the options)\n")
            sys.stderr.flush()
        raise SystemExit(2)
