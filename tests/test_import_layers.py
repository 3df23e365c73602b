"""Imports run one way: TorchRec glue -> estimate -> engine -> host layer -> base.

Every module of the package is assigned a layer below; a module may import modules of its own
layer or of a lower one, never of a higher one, and the package has no import cycle. The sources
are parsed with ``ast`` (nothing is imported), every import counting wherever it is (module
level, a function, ``if TYPE_CHECKING:``), as in ``tests/test_imports.py``. A new module must be
given its layer here.
"""
from __future__ import annotations

import ast
from typing import Callable, Dict, List, Optional, Set, Tuple

from test_imports import PACKAGE, ROOT, find_cycle, import_graph, imports, modules, package_sources

LAYERS = ("base", "host", "engine", "estimate", "torchrec")

# Module (or package, for all of its modules) -> layer; names relative to the package.
LAYER_OF: Dict[str, str] = {
    # base: configuration, errors, row ids, synthetic id streams and the names every layer records under
    "config": "base",
    "datasets": "base",
    "errors": "base",
    "fused_rows": "base",
    "int_sort": "base",
    "kernels": "base",
    "metrics": "base",
    "presample": "base",
    "quiet_exit": "base",
    "priorities": "base",
    "required_packages": "base",
    "synthetic_ids": "base",
    "worker": "base",
    # host: shared memory, host memory, ranks of this machine
    "host": "host",
    # engine: the mechanism
    "engine": "engine",
    # estimate: the cost model, its hardware profiles and measured inputs
    "estimate": "estimate",
    # torchrec: the glue, and the package's entry point (it loads the glue)
    "": "torchrec",
    "torchrec": "torchrec",
}


def package_layer_of(name: str) -> Optional[str]:
    """The layer of module ``name`` (dotted, from the package down): its own entry, else its
    nearest enclosing package's; None if it has none."""
    rel = name[len(PACKAGE) + 1 :] if name != PACKAGE else ""
    parts = rel.split(".") if rel else []
    for n in range(len(parts), -1, -1):
        key = ".".join(parts[:n])
        if key in LAYER_OF and (n > 0 or not parts):
            return LAYER_OF[key]
    return None


def layer_violations(
    sources: Dict[str, Tuple[str, bool]], layer_of: Callable[[str], Optional[str]]
) -> List[str]:
    """Each import of a module of a higher layer, as 'module (layer):line imports target (layer)'
    (once per import statement and target)."""
    known = set(sources)
    found: List[str] = []
    for name, (source, is_package) in sorted(sources.items()):
        own = layer_of(name)
        if own is None:
            continue
        for target, line, _ in imports(ast.parse(source), name, is_package, known):
            theirs = layer_of(target) if target in known else None
            what = f"{name} ({own}):{line} imports {target} ({theirs})"
            if theirs is not None and LAYERS.index(theirs) > LAYERS.index(own) and what not in found:
                found.append(what)
    return found


def test_every_module_has_a_layer() -> None:
    missing = [str(p.relative_to(ROOT)) for m, p in modules().items() if package_layer_of(m) is None]
    assert not missing, "modules without a layer (add them to LAYER_OF):\n" + "\n".join(missing)


def test_no_module_imports_a_higher_layer() -> None:
    found = layer_violations(package_sources(), package_layer_of)
    assert not found, "imports against the layers " + " < ".join(LAYERS) + ":\n" + "\n".join(found)


def test_no_import_cycle() -> None:
    cycle = find_cycle(import_graph(package_sources()))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


# ---------------------------------------------------------------------- the checks can fail
SYNTHETIC = {
    "pkg": ("", True),
    "pkg.low": ("def f():\n    from .high import g\n", False),
    "pkg.high": ("from pkg import low\n", False),
    "pkg.mid": ("from . import low\n", False),
}
SYNTHETIC_LAYERS = {"pkg": "torchrec", "pkg.low": "base", "pkg.mid": "host", "pkg.high": "engine"}


def test_an_upward_import_and_a_cycle_are_found() -> None:
    assert layer_violations(SYNTHETIC, SYNTHETIC_LAYERS.get) == ["pkg.low (base):2 imports pkg.high (engine)"]
    assert find_cycle(import_graph(SYNTHETIC)) == ["pkg.high", "pkg.low", "pkg.high"]


def test_layers_come_from_the_nearest_package() -> None:
    assert package_layer_of(PACKAGE) == "torchrec"
    assert package_layer_of(f"{PACKAGE}.estimate.cost_model.frugal") == "estimate"
    assert package_layer_of(f"{PACKAGE}.torchrec.embedding_lookup") == "torchrec"
    assert package_layer_of(f"{PACKAGE}.engine.gate") == "engine"
    assert package_layer_of(f"{PACKAGE}.host.shm") == "host"
    assert package_layer_of(f"{PACKAGE}.no_such_module") is None


# ---------------------------------------------------------------------- folders import one way
def folder_graphs(sources: Dict[str, Tuple[str, bool]]) -> Dict[str, Dict[str, Set[str]]]:
    """For each package, the imports among its children: a child module is a node, a child
    subpackage one node standing for every module below it; imports leaving the package are left out."""
    graph = import_graph(sources)
    packages = {m for m, (_, is_package) in sources.items() if is_package}
    graphs: Dict[str, Dict[str, Set[str]]] = {p: {} for p in packages}

    def child_of(package: str, module: str) -> Optional[str]:
        if not module.startswith(package + "."):
            return None
        return package + "." + module[len(package) + 1 :].split(".")[0]

    for package in packages:
        edges = graphs[package]
        for source, targets in graph.items():
            a = child_of(package, source)
            if a is None:
                continue
            edges.setdefault(a, set())
            for target in targets:
                b = child_of(package, target)
                if b is not None and b != a:
                    edges[a].add(b)
    return graphs


def folder_cycles(sources: Dict[str, Tuple[str, bool]]) -> List[str]:
    """One cycle per package whose children (modules, subpackages as a whole) import in a cycle."""
    found = []
    for package, edges in sorted(folder_graphs(sources).items()):
        cycle = find_cycle(edges)
        if cycle:
            found.append(f"in {package}: " + " -> ".join(cycle))
    return found


def test_no_import_cycle_between_folders() -> None:
    """``engine/flush`` and ``engine/lookahead`` (or any two folders) import one way: a subpackage
    is one unit to its siblings, so a cycle through two of its modules counts."""
    found = folder_cycles(package_sources())
    assert not found, "import cycles between a package's subpackages and modules:\n" + "\n".join(found)


def test_a_cycle_between_sibling_folders_is_found() -> None:
    sources = {
        "pkg": ("", True),
        "pkg.a": ("", True),
        "pkg.a.x": ("from ..b import y\n", False),
        "pkg.a.z": ("", False),
        "pkg.b": ("", True),
        "pkg.b.y": ("", False),
        "pkg.b.w": ("def f():\n    from ..a.z import g\n", False),
    }
    assert find_cycle(import_graph(sources)) is None  # no module imports itself in a circle ...
    assert folder_cycles(sources) == ["in pkg: pkg.a -> pkg.b -> pkg.a"]  # ... but the folders do
    del sources["pkg.b.w"]
    assert folder_cycles(sources) == []


def repeated_module_names(names: List[str]) -> Dict[str, List[str]]:
    """Last name -> the dotted modules that share it (packages' ``__init__`` aside)."""
    by_name: Dict[str, List[str]] = {}
    for name in names:
        by_name.setdefault(name.rsplit(".", 1)[-1], []).append(name)
    return {k: sorted(v) for k, v in by_name.items() if len(v) > 1}


def test_no_two_modules_share_a_name() -> None:
    """A name says which module it is: two ``worker.py`` send a reader to the wrong one."""
    names = [m for m, p in modules().items() if p.name != "__init__.py"]
    assert repeated_module_names(names) == {}


def test_a_repeated_module_name_is_found() -> None:
    found = repeated_module_names(["p.worker", "p.engine.lookahead.worker", "p.engine.feed"])
    assert found == {"worker": ["p.engine.lookahead.worker", "p.worker"]}
