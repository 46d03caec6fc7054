"""Structure rules for ``runtime/`` and ``agentlang/`` (DESIGN.md, conventions), read from the
source with ``ast``: no module-level import cycle, no access to another object's private
attribute (``x._name`` where ``x`` is not ``self`` / ``cls``), no file over 330 lines."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("runtime", "agentlang")
MAX_LINES = 330


def sources() -> dict[str, Path]:
    """Module name → file, for every module of the checked packages."""
    out = {}
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            parts = f.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = f
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
        (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def module_level_imports(tree: ast.Module, name: str, is_pkg: bool,
                         modules: set[str]) -> set[str]:
    """Checked-package modules imported when the module is imported (function bodies and
    ``if TYPE_CHECKING:`` blocks excluded)."""
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for st in body:
            if isinstance(st, ast.Import):
                found.update(a.name for a in st.names)
            elif isinstance(st, ast.ImportFrom):
                base = st.module or ""
                if st.level:
                    pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                    pkg = pkg[: len(pkg) - (st.level - 1)]
                    base = ".".join(pkg + ([st.module] if st.module else []))
                for a in st.names:      # ``from pkg import module`` imports the module
                    sub = f"{base}.{a.name}"
                    found.add(sub if sub in modules else base)
            elif isinstance(st, ast.If) and not _is_type_checking(st):
                visit(st.body)
                visit(st.orelse)
            elif isinstance(st, ast.Try):
                visit(st.body)
                for h in st.handlers:
                    visit(h.body)
                visit(st.orelse)
                visit(st.finalbody)

    visit(tree.body)
    # a module's own packages are already (being) imported when it runs: never a cycle
    parents = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    return {m for m in found if m in modules and m != name and m not in parents}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state:
                cycle = dfs(n)
                if cycle:
                    return cycle
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            cycle = dfs(m)
            if cycle:
                return cycle
    return None


def private_accesses(tree: ast.Module) -> list[tuple[int, str]]:
    """``x._name`` where ``x`` is not ``self`` / ``cls`` (dunder names are public)."""
    bad = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        if not node.attr.startswith("_") or node.attr.startswith("__"):
            continue
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            continue
        if ast.unparse(node.value).startswith("torch.ops."):
            continue   # an operator's name in torch's registry (aten._weight_int4pack_mm_for_cpu)
        bad.append((node.lineno, ast.unparse(node)))
    return bad


SOURCES = sources()


def test_private_access_rule_itself():
    found = private_accesses(ast.parse("self._a\ncls._b\nx.__len__\nother._c\n"
                                       "torch.ops.aten._int4_mm(x)\nengine.pool._pages\n"))
    assert [name for _, name in found] == ["other._c", "engine.pool._pages"]


def test_the_checked_packages_are_found():
    assert {"runtime.engine", "runtime.scheduler", "agentlang.interpreter"} <= set(SOURCES)


def test_no_module_level_import_cycle():
    modules = set(SOURCES)
    graph = {m: module_level_imports(ast.parse(f.read_text()), m, f.name == "__init__.py",
                                     modules) for m, f in SOURCES.items()}
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"


@pytest.mark.parametrize("module", sorted(SOURCES))
def test_no_private_access_to_other_objects(module):
    bad = private_accesses(ast.parse(SOURCES[module].read_text()))
    assert not bad, f"{module}: another object's private attribute: {bad}"


@pytest.mark.parametrize("module", sorted(SOURCES))
def test_file_length(module):
    n = len(SOURCES[module].read_text().splitlines())
    assert n <= MAX_LINES, f"{module}: {n} lines (at most {MAX_LINES}): split it along concepts"


def test_the_checks_can_fail():
    """Each rule flags a known-bad sample."""
    assert private_accesses(ast.parse("def f(o):\n    return o._x + self._y\n")) \
        == [(2, "o._x")]
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}}
    assert find_cycle(g) == ["a", "b", "c", "a"]
    tree = ast.parse("from typing import TYPE_CHECKING\nimport runtime.b\n"
                     "if TYPE_CHECKING:\n    import runtime.c\n"
                     "def f():\n    import runtime.d\n")
    assert module_level_imports(tree, "runtime.a", False,
                                {"runtime.b", "runtime.c", "runtime.d"}) == {"runtime.b"}
