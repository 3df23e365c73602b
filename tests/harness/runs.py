"""Named runs of a test module, each made when a test first reads it.

A module's runs (training jobs whose results several tests compare) cost seconds each. Made
eagerly in one fixture, one failing run would fail every test of the module under the fixture's
name; here a run is made once, when a test first asks for it, and a failed run raises again, with
its name and without running again, in every test that reads it, and in no other.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, Mapping


class Runs(Mapping[str, Any]):
    """``runs[name]``: the result of ``makers[name]()``, made on first read."""

    def __init__(self, makers: Mapping[str, Callable[[], Any]], what: str = "run") -> None:
        self._makers = dict(makers)
        self._what = what  # how a failure names it: "run", "scenario"
        self._done: Dict[str, Any] = {}
        self._failed: Dict[str, BaseException] = {}

    def __getitem__(self, name: str) -> Any:
        if name in self._failed:
            e = self._failed[name]
            raise RuntimeError(f"{self._what} {name!r} failed earlier:\n{e}") from e
        if name not in self._makers:
            raise KeyError(name)
        if name not in self._done:
            try:
                self._done[name] = self._makers[name]()
            except Exception as e:
                self._failed[name] = e
                raise RuntimeError(f"{self._what} {name!r} failed:\n{e}") from e
        return self._done[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._makers)

    def __len__(self) -> int:
        return len(self._makers)
