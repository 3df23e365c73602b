"""The import graph of the torchrec_frugal package: no cycles, and an engine free of TorchRec.

Each module is parsed with ``ast`` (nothing is imported): every ``import`` and ``from ... import``
counts, at module level or inside a function or an ``if TYPE_CHECKING:`` block, relative ones
resolved against the module's package. A cycle makes the order of imports matter and hides
which module depends on which; it is named in full. Only ``torchrec_frugal/torchrec/`` may import
TorchRec (or its kernels, fbgemm_gpu): the engine must run without it.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "torchrec_frugal"
GLUE = f"{PACKAGE}.torchrec"
TORCHREC_STACK = ("torchrec", "fbgemm_gpu")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> Dict[str, Path]:
    return {module_name(p): p for p in sorted((ROOT / PACKAGE).rglob("*.py"))}


def imports(tree: ast.AST, name: str, is_package: bool, known: Set[str]) -> Iterator[Tuple[str, int, bool]]:
    """(imported module, line, at module level) of each import in ``tree``, relative ones resolved.

    ``from m import x`` names the module ``m.x`` when it is one of ``known``, else ``m``.
    """
    top_level = {id(n) for n in getattr(tree, "body", [])}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno, id(node) in top_level
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = name if is_package else name.rpartition(".")[0]
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                yield (sub if sub in known else target), node.lineno, id(node) in top_level


def import_graph(sources: Dict[str, Tuple[str, bool]]) -> Dict[str, Set[str]]:
    """Edges between the given modules (name -> (source, is a package)); other imports are left out."""
    known = set(sources)
    graph: Dict[str, Set[str]] = {m: set() for m in known}
    for name, (source, is_package) in sources.items():
        for target, _, _ in imports(ast.parse(source), name, is_package, known):
            if target in known and target != name:
                graph[name].add(target)
    return graph


def find_cycle(graph: Dict[str, Set[str]]) -> Optional[List[str]]:
    """One cycle of ``graph`` as [a, b, ..., a], or None."""
    state: Dict[str, int] = {}  # 1: on the current path, 2: done
    path: List[str] = []

    def visit(node: str) -> Optional[List[str]]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def package_sources() -> Dict[str, Tuple[str, bool]]:
    return {m: (p.read_text(), p.name == "__init__.py") for m, p in modules().items()}


def test_the_package_imports_without_cycles() -> None:
    cycle = find_cycle(import_graph(package_sources()))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_only_the_glue_imports_torchrec() -> None:
    found = []
    sources = package_sources()
    for name, (source, is_package) in sources.items():
        if name == GLUE or name.startswith(GLUE + "."):
            continue
        for target, line, at_module_level in imports(ast.parse(source), name, is_package, set(sources)):
            stack = target.split(".")[0] in TORCHREC_STACK
            # The package's lazy ``__getattr__`` loads the glue on first use; a module-level import would not be lazy.
            glue = at_module_level and (target == GLUE or target.startswith(GLUE + "."))
            if stack or glue:
                found.append(f"{modules()[name].relative_to(ROOT)}:{line}: imports {target}")
    assert not found, "TorchRec outside torchrec_frugal/torchrec/:\n" + "\n".join(found)


# ---------------------------------------------------------------------- the checks can fail
SYNTHETIC = {
    "pkg": ("from . import a\n", True),
    "pkg.a": ("from .b import f\n", False),
    "pkg.b": ("def f():\n    from .sub import c\n", False),
    "pkg.sub": ("", True),
    "pkg.sub.c": ("from .. import a\nimport os\n", False),
    "pkg.d": ("from pkg.sub import c\n", False),
}


def test_relative_and_function_level_imports_are_resolved() -> None:
    assert import_graph(SYNTHETIC) == {
        "pkg": {"pkg.a"},
        "pkg.a": {"pkg.b"},
        "pkg.b": {"pkg.sub.c"},
        "pkg.sub": set(),
        "pkg.sub.c": {"pkg.a"},
        "pkg.d": {"pkg.sub.c"},
    }


def test_a_cycle_is_found_and_named() -> None:
    assert find_cycle(import_graph(SYNTHETIC)) == ["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]
    acyclic = dict(SYNTHETIC, **{"pkg.sub.c": ("import os\n", False)})
    assert find_cycle(import_graph(acyclic)) is None


@pytest.mark.parametrize(
    "source, at_module_level",
    [("import torchrec.distributed\n", True), ("def f():\n    from torchrec import x\n", False)],
)
def test_a_torchrec_import_is_seen(source: str, at_module_level: bool) -> None:
    assert list(imports(ast.parse(source), "pkg.m", False, set())) == [
        ("torchrec.distributed" if at_module_level else "torchrec", 1 if at_module_level else 2, at_module_level)
    ]
