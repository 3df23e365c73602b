"""A kernel compiled by numba at its first call, or its numpy twin where numba is missing.

numba is imported and the loop compiled only when a kernel is first called (an engine's first
step), not when the package is imported: importing numba costs a third of a second, compiling a
loop about half a second, and most processes that import the package (a planner, an estimate)
never run a step. Compiled code is cached on disk beside the module (``cache=True``), so later
processes load it instead of compiling. Kernels release the GIL (``nogil``): the training thread
and the exchange worker run theirs at the same time.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, Optional

_lock = threading.Lock()


def numba_available() -> bool:
    """Whether numba can be imported (then every kernel runs compiled)."""
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


class Kernel:
    """``loops`` compiled by numba on the first call; ``twin`` (same results, numpy calls)
    where numba cannot be imported."""

    def __init__(self, loops: Callable[..., Any], twin: Callable[..., Any]) -> None:
        self.loops = loops  # the plain Python loops: what numba compiles
        self.twin = twin
        self._fn: Optional[Callable[..., Any]] = None
        self.__doc__ = loops.__doc__
        self.__name__ = loops.__name__

    @property
    def compiled(self) -> bool:
        """Whether calls run numba's compiled loops (loads them if not loaded yet)."""
        return self._load() is not self.twin

    def __call__(self, *args: Any) -> Any:
        fn = self._fn if self._fn is not None else self._load()
        return fn(*args)

    def _load(self) -> Callable[..., Any]:
        with _lock:
            if self._fn is None:
                try:
                    import numba
                except ImportError:
                    self._fn = self.twin
                else:
                    # error_model="numpy": a float division by zero gives inf or nan, as in the twins
                    self._fn = numba.njit(cache=True, nogil=True, boundscheck=False, error_model="numpy")(self.loops)
        return self._fn


def kernel(twin: Callable[..., Any]) -> Callable[[Callable[..., Any]], Kernel]:
    """Decorator: the loops it decorates become a :class:`Kernel` with the numpy ``twin``."""
    return lambda loops: Kernel(loops, twin)


@contextmanager
def running_as(variant: str, kernels: Iterable[Kernel]) -> Iterator[None]:
    """Within the block, ``kernels`` run as ``variant``: "loops" (the plain Python loops numba
    compiles) or "twin" (numpy), instead of as they load: how tests compare the three on the data
    structures the kernels keep, not only on one call's output."""
    if variant not in ("loops", "twin"):
        raise ValueError(f"variant must be 'loops' or 'twin', got {variant!r}")
    kernels = list(kernels)
    before = [k._fn for k in kernels]
    for k in kernels:
        k._fn = getattr(k, variant)
    try:
        yield
    finally:
        for k, fn in zip(kernels, before):
            k._fn = fn

