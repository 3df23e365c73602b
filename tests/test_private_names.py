"""No module, test, benchmark or example touches another module's private names.

A name starting with one underscore belongs to the module that defines it: code elsewhere goes
through a public hook, so that renaming a private never silently changes a test or a benchmark.
A private method of the package named by a string outside it (a table of methods to wrap) counts too.
Private names of third-party code (TorchRec, torch, the standard library) are allowed only where
listed below with the reason, or, for TorchRec's and torch's, in
``torchrec_frugal.torchrec.patches.third_party_privates.THIRD_PARTY_PRIVATES``, where each is guarded by its source hash,
a class that still assigns it or the names its module still provides (``tests/torchrec/test_torchrec_patches.py``).
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
TREES = ("torchrec_frugal", "tests", "benchmarks", "examples", "scripts")

# Third-party private names the code relies on, each with why.
THIRD_PARTY: Dict[str, str] = {
    "_exit": "os._exit: a child that must skip atexit handlers (crash and leftover-segment tests)",
    "_create_dataset_tsv": "torchrec.datasets.test_utils.CriteoTest: Criteo files exactly as TorchRec's readers expect",
    "_create_dataset_npys": "torchrec.datasets.test_utils.CriteoTest: as above, the preprocessed .npy layout",
    "_python_dispatch": "torch.utils._python_dispatch.TorchDispatchMode: the aten ops a thread runs (torch has no public path to it)",
}


def _sources() -> List[Path]:
    return sorted(p for tree in TREES for p in (ROOT / tree).rglob("*.py") if ".venv" not in p.parts)


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _defined(tree: ast.AST) -> Set[str]:
    """Private names a module defines: functions, classes, assigned names and attributes, imports."""
    out: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                out.add(node.attr)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.add(node.target.id)
    return {n for n in out if _is_private(n)}


REFLECTION = ("setattr", "getattr", "hasattr", "delattr")


def _by_string(node: ast.Call) -> Iterator[str]:
    """Private names a call reaches by string: ``setattr(x, "_name", v)``, ``getattr(x, "_name")``,
    ``monkeypatch.setattr(x, "_name", v)`` (x not self/cls), ``monkeypatch.setattr("m.C._name", v)``."""
    func = node.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    if name not in REFLECTION or not node.args:
        return
    first = node.args[0]
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        last = first.value.rsplit(".", 1)[-1]
        if "." in first.value and _is_private(last):
            yield last
        return
    if isinstance(first, ast.Name) and first.id in ("self", "cls"):
        return
    if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
        if _is_private(node.args[1].value):
            yield node.args[1].value


def _accesses(tree: ast.AST) -> Iterator[Tuple[int, str, str]]:
    """(line, expression, private name) of ``x._name`` with x not self/cls/super(), of the same
    reached by string (:func:`_by_string`), and of ``from m import _name`` / ``import m._name``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for name in _by_string(node):
                yield node.lineno, ast.unparse(node), name
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            base = node.value
            if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                continue
            if isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super":
                continue
            yield node.lineno, ast.unparse(node), node.attr
        elif isinstance(node, ast.ImportFrom):
            for part in (node.module or "").split("."):
                if _is_private(part):
                    yield node.lineno, f"from {node.module} import ...", part
            for alias in node.names:
                if _is_private(alias.name):
                    yield node.lineno, f"from {node.module} import {alias.name}", alias.name


def _class_privates(trees: Iterator[ast.AST]) -> Dict[str, Tuple[Set[str], List[str]]]:
    """Per class of ours: the private names it defines (methods, class attributes, ``self._x = ...``
    in its methods) and the names of its bases."""
    out: Dict[str, Tuple[Set[str], List[str]]] = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                names = _defined(ast.Module(body=node.body, type_ignores=[]))
                bases = [ast.unparse(b).rsplit(".", 1)[-1].split("[")[0] for b in node.bases]
                known = out.get(node.name, (set(), []))
                out[node.name] = (known[0] | names, known[1] + bases)
    return out


def _inherited(cls: str, classes: Dict[str, Tuple[Set[str], List[str]]]) -> Set[str]:
    """Private names ``cls`` and its bases among our classes define."""
    seen: Set[str] = set()
    names: Set[str] = set()
    todo = [cls]
    while todo:
        c = todo.pop()
        if c in seen or c not in classes:
            continue
        seen.add(c)
        names |= classes[c][0]
        todo.extend(classes[c][1])
    return names


def _self_accesses(tree: ast.AST) -> Iterator[Tuple[str, int, str, str]]:
    """(class, line, expression, private name) of ``self._x`` / ``cls._x`` read in a class's methods."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for sub in ast.walk(node):
                if (
                    isinstance(sub, ast.Attribute)
                    and _is_private(sub.attr)
                    and isinstance(sub.value, ast.Name)
                    and sub.value.id in ("self", "cls")
                ):
                    yield node.name, sub.lineno, ast.unparse(sub), sub.attr


def _private_methods(tree: ast.AST) -> Set[str]:
    """Private methods of the classes a module defines."""
    return {
        f.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        for f in node.body
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and _is_private(f.name)
    }


def _named_by_string(tree: ast.AST, methods: Set[str]) -> Iterator[Tuple[int, str]]:
    """(line, name) of each string that is exactly one of ``methods``: a method reached by a name
    kept as data (a table of methods to wrap, say), which :func:`_by_string` cannot see."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in methods:
            yield node.lineno, node.value


def violations() -> List[str]:
    parsed = {p: ast.parse(p.read_text(), str(p)) for p in _sources()}
    ours: Set[str] = set().union(*(_defined(t) for t in parsed.values()))
    package = ROOT / "torchrec_frugal"
    methods: Set[str] = set().union(*(_private_methods(t) for p, t in parsed.items() if package in p.parents))
    guarded = _guarded_privates()
    classes = _class_privates(iter(parsed.values()))
    out = []
    for path, tree in parsed.items():
        for cls, line, expr, name in _self_accesses(tree):
            # An attribute of self that neither the class nor our bases of it define is a private of a
            # third-party base class: allowed only where guarded (TorchRec's) or listed.
            if name not in _inherited(cls, classes) and name not in guarded and name not in THIRD_PARTY:
                out.append(f"{path.relative_to(ROOT)}:{line}: {expr} (a third-party base class's private)")
    for path, tree in parsed.items():
        own = _defined(tree)
        for line, expr, name in _accesses(tree):
            if name in own:
                continue  # the module's own private (another instance of its own class, say)
            if name in guarded or (name not in ours and name in THIRD_PARTY):
                continue  # a listed third-party private (a shimmed TorchRec function may share its name)
            where = "another module's private" if name in ours else "an unlisted third-party private"
            out.append(f"{path.relative_to(ROOT)}:{line}: {expr} ({where})")
        if package not in path.parents:
            for line, name in _named_by_string(tree, methods - own - guarded):
                out.append(f"{path.relative_to(ROOT)}:{line}: {name!r} (a private method of the package, named by string)")
    return out


def _guarded_privates() -> Set[str]:
    """Private names of TorchRec and torch the glue relies on, each guarded in patches/third_party_privates.py."""
    from torchrec_frugal.torchrec.patches.third_party_privates import THIRD_PARTY_PRIVATES

    return {name.rsplit(".", 1)[-1] for name in THIRD_PARTY_PRIVATES}


def test_no_private_reach_ins() -> None:
    found = violations()
    assert not found, "private names used outside their module:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "code, flagged",
    [
        ("eng._flush_once = f", True),
        ("x = eng.last_metrics", False),
        ("self._lock = None", False),
        ("super()._init()", False),
        ("from a.b import _helper", True),
        ("from torch.distributed._shard import x", True),
        ('monkeypatch.setattr(presample, "_MIN_FLUSH_IDS", 1)', True),
        ('monkeypatch.setattr("torchrec_frugal.host.shm._create", f)', True),
        ('setattr(eng, "_flush_once", f)', True),
        ('getattr(self, "_lock")', False),
        ('monkeypatch.setattr(presample, "MIN_FLUSH_IDS", 1)', False),
    ],
)
def test_the_check_finds_reach_ins(code: str, flagged: bool) -> None:
    """The checker flags what it must: a test that cannot fail is a defect."""
    tree = ast.parse(code)
    found = [n for _, _, n in _accesses(tree) if n not in _defined(tree)]
    assert bool(found) == flagged, (code, found)


@pytest.mark.parametrize(
    "code, flagged",
    [
        ("class A(Stock):\n    def f(self):\n        return self._env", True),
        ("class A(Stock):\n    def __init__(self):\n        self._env = 1\n    def f(self):\n        return self._env", False),
        ("class M:\n    def _setup(self): ...\nclass A(M, Stock):\n    def f(self):\n        self._setup()", False),
        ("class A(Stock):\n    def f(self):\n        self._model_fwd = g", False),
    ],
)
def test_the_check_finds_privates_of_third_party_bases(code: str, flagged: bool) -> None:
    """``self._x`` that neither the class nor a base of ours defines belongs to a third-party base."""
    tree = ast.parse(code)
    classes = _class_privates(iter([tree]))
    found = [n for cls, _, _, n in _self_accesses(tree) if n not in _inherited(cls, classes)]
    assert bool(found) == flagged, (code, found)


def test_the_check_finds_private_methods_named_by_string() -> None:
    """A method named in a table (to wrap it, say) is a reach-in as much as ``x._method`` is."""
    tree = ast.parse('class C:\n    def _work(self): ...\n')
    assert _private_methods(tree) == {"_work"}
    table = ast.parse('CALLS = (("m", "C", "_work", "label"), ("m", "C", "work", "label"))')
    assert [n for _, n in _named_by_string(table, {"_work"})] == ["_work"]


def overridden_third_party_privates() -> List[str]:
    """Private names our classes define that a third-party base class of theirs also has (a method,
    or an attribute its source assigns), and that THIRD_PARTY_PRIVATES does not guard:
    overriding them silently depends on how the base class uses them."""
    import importlib
    import inspect
    import pkgutil
    import re

    import torchrec_frugal

    guarded = _guarded_privates()
    found = []
    for info in pkgutil.walk_packages(torchrec_frugal.__path__, "torchrec_frugal."):
        module = importlib.import_module(info.name)
        assert module.__file__ is not None
        for name, (privates, _) in _class_privates(iter([ast.parse(Path(module.__file__).read_text())])).items():
            cls = getattr(module, name, None)
            if not inspect.isclass(cls):
                continue
            for base in cls.__mro__[1:]:
                if base.__module__.startswith("torchrec_frugal") or base is object:
                    continue
                try:
                    source = inspect.getsource(base)
                except (OSError, TypeError):
                    source = ""
                for private in sorted(privates - guarded):
                    if private in vars(base) or re.search(rf"self\.{re.escape(private)}\b", source):
                        found.append(f"{info.name}.{name}.{private} (of {base.__module__}.{base.__qualname__})")
    return found


def test_no_unguarded_third_party_private_is_overridden() -> None:
    found = overridden_third_party_privates()
    assert not found, "privates of third-party base classes redefined without a guard:\n" + "\n".join(found)
