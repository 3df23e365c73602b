"""What a shim is: a TorchRec function replaced by a frugal-aware wrapper, keyed and hashed as
:data:`.releases.RELEASES` records it."""
from __future__ import annotations

import hashlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable


def sha256_key(module: Any, name: str) -> str:
    """Key of ``module.name`` in ``Release.sha256``."""
    return f"{module.__name__.rsplit('.', 1)[-1]}.{name}"


@dataclass(frozen=True)
class Patch:
    """A function of TorchRec (module-level, or a method of a class) replaced by a frugal-aware wrapper."""

    module: Any
    name: str
    make: Callable[[Callable[..., Any]], Callable[..., Any]]

    @property
    def key(self) -> str:
        return sha256_key(self.module, self.name)


def source_sha256(fn: Callable[..., Any]) -> str:
    return hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()
