"""Structure rules for ``agentlang/``, ``runtime/`` and ``kernels/`` (DESIGN.md, conventions),
read from the source with ``ast``: no module-level import cycle, imports inside the runtime only
point down its tree (:data:`LAYERS`), no access to another object's private attribute
(``x._name`` where ``x`` is not ``self`` / ``cls``), no file over 330 lines."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# repository folder → the import name it installs as (setup.py maps the same)
PACKAGES = {"agentlang": "agentlang", "runtime": "agentlang.runtime", "kernels": "agentlang.kernels"}
MAX_LINES = 330
# The runtime's folders from the top of the tree down (docs/architecture.md): a module may
# import its own folder and the folders below it, never one above. ``agentlang.kernels`` (the
# Triton kernels) sits between attention, which launches them, and cache, whose KV format they
# read. The frontend (the rest of ``agentlang``) is above all of them: nothing here imports it.
LAYERS = ("agentlang.runtime.server", "agentlang.runtime.engine", "agentlang.runtime.session",
          "agentlang.runtime.execution",
          "agentlang.runtime.scheduler", "agentlang.runtime.request", "agentlang.runtime.speculative",
          "agentlang.runtime.sampling", "agentlang.runtime.chat", "agentlang.runtime.grammar", "agentlang.runtime.models",
          "agentlang.runtime.attention", "agentlang.kernels", "agentlang.runtime.cache",
          "agentlang.runtime.weights", "agentlang.runtime.quant", "agentlang.runtime.core")


def sources(packages: dict[str, str] = PACKAGES) -> dict[str, Path]:
    """Module name → file, for every module of the checked packages."""
    out = {}
    for folder, name in packages.items():
        for f in sorted((ROOT / folder).rglob("*.py")):
            parts = f.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join((name,) + parts)] = f
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
        (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def imported_names(st: ast.stmt, name: str, is_pkg: bool, modules: set[str]) -> set[str]:
    """The modules an ``import`` statement of module ``name`` names (``from pkg import module``
    names the module, relative imports resolved); empty for any other statement."""
    if isinstance(st, ast.Import):
        return {a.name for a in st.names}
    if not isinstance(st, ast.ImportFrom):
        return set()
    base = st.module or ""
    if st.level:
        pkg = name.split(".") if is_pkg else name.split(".")[:-1]
        pkg = pkg[: len(pkg) - (st.level - 1)]
        base = ".".join(pkg + ([st.module] if st.module else []))
    return {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in st.names}


def all_imports(tree: ast.Module, name: str, is_pkg: bool, modules: set[str]) -> set[str]:
    """Checked-package modules imported anywhere in the module (function bodies and
    ``if TYPE_CHECKING:`` blocks included)."""
    found: set[str] = set()
    for st in ast.walk(tree):
        found |= imported_names(st, name, is_pkg, modules)
    return {m for m in found if m in modules and m != name}


def layer_of(module: str) -> int | None:
    """The index of ``module``'s folder in :data:`LAYERS`, or None outside them."""
    for i, layer in enumerate(LAYERS):
        if module == layer or module.startswith(layer + "."):
            return i
    return None


def upward_imports(module: str, imports: set[str]) -> list[str]:
    """The imports of ``module`` that point up the tree: to a folder above its own, or from
    the runtime or the kernels to the frontend."""
    own = layer_of(module)
    if own is None:
        return []
    frontend = [m for m in imports if m.startswith("agentlang.") and layer_of(m) is None
                and not m.startswith(("agentlang.runtime", "agentlang.kernels"))]
    return sorted(frontend + [m for m in imports
                              if (lay := layer_of(m)) is not None and lay < own])


def module_level_imports(tree: ast.Module, name: str, is_pkg: bool,
                         modules: set[str]) -> set[str]:
    """Checked-package modules imported when the module is imported (function bodies and
    ``if TYPE_CHECKING:`` blocks excluded)."""
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for st in body:
            if isinstance(st, (ast.Import, ast.ImportFrom)):
                found.update(imported_names(st, name, is_pkg, modules))
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
    assert {"agentlang.runtime.engine.engine", "agentlang.runtime.scheduler.scheduler", "agentlang.interpreter"} <= set(SOURCES)


def test_no_module_level_import_cycle():
    modules = set(SOURCES)
    graph = {m: module_level_imports(ast.parse(f.read_text()), m, f.name == "__init__.py",
                                     modules) for m, f in SOURCES.items()}
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"


@pytest.mark.parametrize("module", sorted(m for m in SOURCES if layer_of(m) is not None))
def test_imports_point_down_the_tree(module):
    f = SOURCES[module]
    imports = all_imports(ast.parse(f.read_text()), module, f.name == "__init__.py",
                          set(SOURCES))
    up = upward_imports(module, imports)
    assert not up, (f"{module} imports {up}: above its folder in LAYERS (move the shared "
                    "part down, or the module up)")


def test_every_runtime_folder_is_a_layer():
    folders = {p.name for p in (ROOT / "runtime").iterdir()
               if p.is_dir() and (p / "__init__.py").exists()}
    assert {f"agentlang.runtime.{f}" for f in folders} == \
        {lay for lay in LAYERS if lay.startswith("agentlang.runtime.")}
    loose = sorted(p.name for p in (ROOT / "runtime").glob("*.py") if p.name != "__init__.py")
    assert not loose, f"modules outside the tree's folders: {loose}"


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


def test_the_import_rule_fails_on_a_planted_upward_import():
    """A cache module that imports the scheduler (inside a function, or only for typing)
    points up the tree: the rule names it; its downward import passes."""
    mods = {"agentlang.runtime.cache.page_table", "agentlang.runtime.scheduler.scheduler",
            "agentlang.runtime.core.errors", "agentlang.api"}
    planted = ast.parse("from agentlang.runtime.core.errors import EngineError\n"
                        "def f():\n    from agentlang.runtime.scheduler import scheduler\n"
                        "if TYPE_CHECKING:\n    import agentlang.api\n")
    imports = all_imports(planted, "agentlang.runtime.cache.page_table", False, mods)
    assert upward_imports("agentlang.runtime.cache.page_table", imports) == \
        ["agentlang.api", "agentlang.runtime.scheduler.scheduler"]
    assert upward_imports("agentlang.runtime.server.app", imports) == ["agentlang.api"]


# Test modules whose subject is a benchmark script itself (what they import is under test).
TESTS_OF_BENCH_SCRIPTS = {"tests/kernels/test_kernel_compile.py",   # bench/kernel_compile.py
                          "tests/test_gpu_script_dry_run.py"}              # bench/gpu_run.sh & co


def test_tests_take_their_helpers_from_tests_support_not_bench():
    offenders = []
    for f in sorted((ROOT / "tests").rglob("*.py")):
        rel = f.relative_to(ROOT).as_posix()
        names = set()
        for st in ast.walk(ast.parse(f.read_text())):
            names |= imported_names(st, "", False, set())
        if any(n == "bench" or n.startswith("bench.") for n in names) \
                and rel not in TESTS_OF_BENCH_SCRIPTS:
            offenders.append(rel)
    assert not offenders, f"import helpers from tests/support, not bench/: {offenders}"


def test_the_step_is_written_once():
    """Only :class:`StepCore` schedules a step (the engine and the model-free harness both run
    it): a second ``scheduler.schedule()`` anywhere would be a copy of the step."""
    callers = []
    for folder in ("runtime", "agentlang", "kernels", "tests", "bench"):
        for f in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(f.read_text())):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                        and node.func.attr == "schedule" and not node.args:
                    callers.append(f.relative_to(ROOT).as_posix())
    assert callers == ["runtime/engine/step_core.py"], callers


def test_no_module_imports_another_packages_private_module():
    """``agentlang.kernels._common`` and friends are the kernels' own: the runtime (and the
    frontend) import what ``agentlang.kernels`` exports."""
    bad = []
    for module, f in SOURCES.items():
        pkg = module.split(".")[1] if module.count(".") else module
        for st in ast.walk(ast.parse(f.read_text())):
            for name in imported_names(st, module, f.name == "__init__.py", set(SOURCES)):
                parts = name.split(".")
                if len(parts) > 2 and parts[0] == "agentlang" and parts[1] != pkg \
                        and any(p.startswith("_") and not p.startswith("__") for p in parts):
                    bad.append((module, name))
    assert not bad, bad


# Test modules that check the repository as a whole stay at the top of tests/.
REPO_WIDE_TESTS = {"test_structure.py", "test_packaging.py", "test_readme.py", "test_examples.py",
                   "test_gpu_script_dry_run.py"}
# tests/ folders that hold no test of their own subject.
TEST_HELPER_FOLDERS = {"support", "data"}


def test_tests_mirror_the_tree():
    """A test lives in ``tests/<folder>/`` named after the folder it tests: one of runtime/'s
    folders (server/ included), ``kernels`` or ``frontend`` (the rest of ``agentlang/``)."""
    allowed = {lay.rsplit(".", 1)[1] for lay in LAYERS} | {"frontend"}
    misplaced = []
    for f in sorted((ROOT / "tests").rglob("test_*.py")):
        parts = f.relative_to(ROOT / "tests").parts
        if len(parts) == 1:
            ok = parts[0] in REPO_WIDE_TESTS
        else:
            ok = parts[0] in allowed and parts[0] not in TEST_HELPER_FOLDERS
        if not ok:
            misplaced.append("/".join(parts))
    assert not misplaced, (f"put each test under tests/<folder it tests>/ (one of "
                           f"{sorted(allowed)}): {misplaced}")
    have = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir()} - TEST_HELPER_FOLDERS
    assert have <= allowed | {"__pycache__"}, have - allowed
