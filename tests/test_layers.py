"""The house's shape, checked: layers, wings, no import cycle, short functions.

The import contracts live in setup.cfg (``[importlinter]``) and run under
``make lint``; here they run too, so that ``make test`` fails when one is
broken, and a stricter check is added: no cycle between any two modules at
all (import-linter's ``acyclic_siblings`` looks at each package's children).
Imports inside functions count; imports made only for type checkers do not.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import grimp
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: the C extensions (``engine/_routes.c``, ``engine/_csignals.c``): grimp
#: reads Python source only and counts ``from . import _routes`` as an import
#: of the package itself, which its ``__init__`` imports back
C_EXTENSIONS = ("_routes", "_csignals")

#: the longest a function may be, in lines (its docstring included)
MAX_LINES = 80


def _graph() -> grimp.ImportGraph:
    return grimp.build_graph("daifu", include_external_packages=False,
                             exclude_type_checking_imports=True)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_import_contracts_hold():
    """setup.cfg's contracts: hooks above engine above cells; the engine's
    core above its wings (human, remote, persist) above its values; no cycle
    among the modules of any package."""
    lint = os.path.join(os.path.dirname(sys.executable), "lint-imports")
    run = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count(" KEPT") == 3, run.stdout


def test_no_module_imports_itself_back_through_others():
    graph = _graph()
    edges: dict[str, set[str]] = {}
    for module in graph.modules:
        out = set()
        for imported in graph.find_modules_directly_imported_by(module):
            details = graph.get_import_details(importer=module, imported=imported)
            if module.startswith(imported + ".") and details and all(
                    any(ext in d["line_contents"] for ext in C_EXTENSIONS) for d in details):
                continue  # (a C extension: not a module grimp can see)
            out.add(imported)
        edges[module] = out
    assert _cycles(edges) == []


def test_a_contract_breach_is_seen():
    """The cycle check finds a cycle (it is not one that cannot fail)."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_wings_do_not_import_the_engine_core():
    """Each wing gets what it needs of the core passed in when it is
    installed: no wing module imports ``_engine``, ``_barrier`` or ``_guards``."""
    graph = _graph()
    core = {"daifu.engine", "daifu.engine._engine", "daifu.engine._barrier",
            "daifu.engine._guards"}
    wings = [m for m in graph.modules
             if m.split(".")[:3][-1] in ("human", "remote", "persist")
             and m.startswith("daifu.engine.")]
    assert len(wings) >= 15
    reached = {(m, w) for m in wings for w in graph.find_modules_directly_imported_by(m)
               if w in core}
    assert reached == set()


def test_packages_meet_through_their_init_only():
    """What hooks, cells, engine and ``daifu`` use of each other is named in
    the package's ``__init__``: no import of another package's underscore
    module (``daifu.engine.persist._journal`` from hooks)."""
    graph = _graph()

    def package(module: str) -> str:
        return module.split(".")[1] if module.count(".") else ""

    reached = []
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            if package(module) != package(imported) and any(
                    part.startswith("_") for part in imported.split(".")[2:]):
                reached.append(f"{module} -> {imported}")
    assert sorted(reached) == []


def _functions() -> list[tuple[str, str, int]]:
    out = []
    for folder, _, names in os.walk(os.path.join(ROOT, "daifu")):
        for name in names:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read())
            rel = os.path.relpath(path, ROOT).replace(os.sep, "/")
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    assert node.end_lineno is not None
                    out.append((rel, node.name, node.end_lineno - node.lineno + 1))
    return out


def test_functions_are_short():
    functions = _functions()
    assert len(functions) > 1000
    assert [(p, n, lines) for p, n, lines in functions if lines > MAX_LINES] == []


#: calls that make a container or a lock: a module-level one is state
_MUTABLE_CALLS = frozenset({
    "set", "dict", "list", "bytearray", "defaultdict", "deque", "OrderedDict", "Counter",
    "WeakSet", "WeakKeyDictionary", "WeakValueDictionary", "local", "Lock", "RLock", "Event",
    "Condition", "Semaphore", "_Shared"})

#: the module-level containers that are not a module's process state (which
#: is a record in ``RUNTIME.parts``), each with what it is
NOT_STATE = {
    "__all__": "what a module exports",
    "daifu.cells._LAZY": "a constant table (the names imported on first use)",
    "daifu.engine._LAZY": "a constant table (the names imported on first use)",
    "daifu.hooks._LAZY": "a constant table (the names imported on first use)",
    "daifu.cells._rewrite._core._SPLIT": "a constant table (3.13's superinstructions)",
    "daifu.cells._rewrite._ops._BACKWARD": "a constant table (the backward jumps)",
    "daifu.cells._source._ENTRY_ROLES": "a constant table (statement kinds)",
    "daifu.cells._source._BLOCK_FIELDS": "a cache: each statement class's nested blocks",
    "daifu.cells._versions.TABLE": "a constant table (what differs between versions)",
    "daifu.cells._rewrite._flattail.TAILS": "a constant table (flat code's trap per version)",
    "daifu.engine._events.LEVELS": "a constant table (the log levels)",
    "daifu.engine._patches._APPLY": "a constant table (how each kind of patch is applied)",
    "daifu.hooks._commands.USAGE": "a constant table (the commands' usage lines)",
    "daifu.hooks._config.BY_FLAG": "a constant table (filled at import from OPTIONS)",
    "daifu.hooks._config.VARIABLES": "a constant table (filled at import from OPTIONS)",
    "daifu.cells._lazy._templates": "a cache: one stub template per signature shape",
    "daifu.cells._rewrite._analysis._SHAPES": "a cache: each instruction's stack effect",
    "daifu.cells._rewrite._flat._effects": "a cache: each opcode and argument's stack effect",
    "daifu.cells._rewrite._assemble._TEMPLATES": "a cache: each stub shape's code",
    "daifu.cells._rewrite._assemble._KINDS": "a cache: each opcode's kind",
    "daifu.cells._rewrite._assemble._COVERING_TAILS": "a cache: flat code's tail, laid out",
    "daifu.cells._rewrite._decode._ENUMS": "a constant table (the enum of each argument kind)",
    "daifu.cells._rewrite._decode._MEMO": "a cache: each enum argument's member",
    "daifu.cells._rewrite._emit._SHARED": "a cache: daifu's own instructions, made once",
    "daifu.engine.persist._resume._library": "a cache: is a code object a library's?",
    "daifu.hooks._ipython._classes": "a cache: IPython's classes, each with daifu's subclass",
    "daifu._record._showing": "a repr's recursion guard (per thread; empty between calls)",
    "daifu.cells._cell._INFOS": "the fast path's: the registry the stubs' constants name",
    "daifu.engine._fastpath.passing": "the fast path's: the slots every stub reads (a builtin)",
    "daifu.engine._fastpath.ROUTES": "the fast path's: the routes the C barrier reads",
}


def _top_level(body: list[ast.stmt]):
    for st in body:
        if isinstance(st, (ast.If, ast.Try)):
            yield from _top_level(st.body)
            yield from _top_level(st.orelse)
            for handler in getattr(st, "handlers", ()):
                yield from _top_level(handler.body)
        else:
            yield st


def _makes_a_container(value: ast.expr | None) -> bool:
    if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp,
                          ast.SetComp)):
        return True
    if isinstance(value, ast.Call):
        func = value.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        return name in _MUTABLE_CALLS
    return False


def test_no_module_keeps_state_in_its_globals():
    """Each module's process state is one record in ``RUNTIME.parts``: no
    ``global`` statement anywhere, and every module-level container or lock
    is one of ``NOT_STATE`` (a constant table, a cache of a pure computation,
    or one of the fast path's objects that the stubs and C code hold)."""
    found, globals_ = [], []
    for folder, _dirs, files in os.walk(os.path.join(ROOT, "daifu")):
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".").removesuffix(".__init__")
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read())
            globals_ += [(rel, node.lineno, node.names) for node in ast.walk(tree)
                         if isinstance(node, ast.Global)]
            for st in _top_level(tree.body):
                targets = st.targets if isinstance(st, ast.Assign) else \
                    [st.target] if isinstance(st, ast.AnnAssign) else []
                for target in targets:
                    if isinstance(target, ast.Name) and _makes_a_container(st.value) \
                            and target.id not in NOT_STATE \
                            and f"{rel}.{target.id}" not in NOT_STATE:
                        found.append(f"{rel}.{target.id}")
    assert globals_ == []
    assert found == []


def test_each_part_of_the_runtime_is_a_record_of_its_module():
    """``RUNTIME.parts``: one record per module that keeps process state,
    once daifu's modules are imported."""
    import importlib

    from daifu._runtime import RUNTIME

    for module in ("daifu.engine", "daifu.hooks._install", "daifu.engine.persist._preempt",
                   "daifu.engine.remote._distributed", "daifu.engine.remote._jobstore"):
        importlib.import_module(module)
    assert {"daifu.engine._events", "daifu.engine._signals", "daifu.engine._preload",
            "daifu.engine._barrier", "daifu.engine.persist._preempt",
            "daifu.engine.remote._distributed", "daifu.hooks._install",
            "daifu.cells._lazy"} <= set(RUNTIME.parts)
    for module, part in RUNTIME.parts.items():
        assert sys.modules[module]._state is part
        assert "_state" not in repr(part) and repr(part).startswith(type(part).__name__)


def test_engine_and_console_are_small():
    """The engine decides and the console asks: each class stays under 400
    lines (their parts are mixins in modules of their own)."""
    sizes = {}
    for rel, name in (("daifu/engine/_engine.py", "Engine"),
                      ("daifu/engine/human/_console.py", "Console")):
        with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
        assert cls.end_lineno is not None
        sizes[name] = cls.end_lineno - cls.lineno + 1
    assert max(sizes.values()) < 400, sizes


@pytest.mark.parametrize("package", ["cells", "engine", "hooks"])
def test_each_package_says_what_it_is(package):
    """A newcomer can place a file: every package and wing has a docstring."""
    for folder, _, names in os.walk(os.path.join(ROOT, "daifu", package)):
        if "__init__.py" in names:
            with open(os.path.join(folder, "__init__.py"), encoding="utf-8") as f:
                assert ast.get_docstring(ast.parse(f.read())), folder


@pytest.mark.parametrize("package", ["daifu.cells", "daifu.engine", "daifu.hooks"])
def test_the_names_imported_on_first_use_are_declared_alike_for_type_checkers(package):
    """A package's lazy names (``_LAZY``) resolve to what they name, and its
    ``if TYPE_CHECKING:`` block declares the same ones, from the same places
    (what mypy checks the callers against)."""
    import importlib

    pkg = importlib.import_module(package)
    for name, (module, attr) in pkg._LAZY.items():
        home = importlib.import_module(f"{package}.{module}")
        assert getattr(pkg, name) is getattr(home, attr), name
    with open(pkg.__file__, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    blocks = [n for n in tree.body if isinstance(n, ast.If)
              and getattr(n.test, "id", "") == "TYPE_CHECKING"]
    declared = {(a.asname or a.name): ((node.module or ""), a.name)
                for block in blocks for node in block.body
                if isinstance(node, ast.ImportFrom) and node.level == 1 for a in node.names}
    assert declared == {name: where for name, where in pkg._LAZY.items()}


def test_each_import_inside_a_function_says_what_it_saves():
    """Imports are at the top of their modules, except where start-up time
    needs one inside a function; that one says what it saves, measured by
    ``perf/lazy_imports.py --write`` (``lazy: N ms``, on its line or the one
    above).  An import of a module loaded anyway belongs at the top."""
    sys.path.insert(0, os.path.join(ROOT, "perf"))
    try:
        import lazy_imports
    finally:
        sys.path.remove(os.path.join(ROOT, "perf"))
    found = lazy_imports.lazy_imports()
    assert len(found) > 50
    bare = []
    for path, first, _, modules in found:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
        if not any(lazy_imports.MARK.search(line) for line in lines[max(first - 2, 0):first]):
            bare.append(f"{os.path.relpath(path, ROOT)}:{first} ({', '.join(modules)})")
    assert bare == [], "run: .venv/bin/python perf/lazy_imports.py --write"
