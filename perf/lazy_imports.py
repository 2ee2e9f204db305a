"""What each import inside a daifu function saves, measured.

An import stays inside a function only where start-up time needs it: the
module it names is not loaded by the time its host module is (``import
daifu``, ``daifu.install()``, ``python -m daifu`` with a warm code cache).
This tool finds every such import, times importing its module(s) in a
fresh interpreter that has ``import daifu`` done (the leanest way in), and
prints the table; with ``--write`` it puts the figure on the import's line
as ``lazy: N ms`` (``tests/test_layers.py`` checks each one has it).

    .venv/bin/python perf/lazy_imports.py [--write]

A module loaded anyway gets 0 ms: that import belongs at the top of its
module.  Figures vary by machine and load; the median of three runs each.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import re
import statistics
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
PACKAGE = os.path.join(ROOT, "daifu")
LIMIT = 100  # (ruff's line length)
MARK = re.compile(r"lazy: [\d.]+ (?:ms|s)")

_TIME = r"""
import importlib, sys, time, warnings
warnings.simplefilter("ignore")
import daifu
names = [n for n in sys.argv[1:] if n not in sys.modules]
t0 = time.perf_counter()
for n in names:
    try:
        importlib.import_module(n)
    except ImportError:
        pass
print((time.perf_counter() - t0) * 1000)
"""


def _module_name(path: str) -> str:
    rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
    return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


def _targets(host: str, is_package: bool, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules an import loads (a name that is a submodule: that one)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = host if is_package else host.rpartition(".")[0]
    for _ in range(node.level - 1):
        base = base.rpartition(".")[0]
    module = node.module or ""
    if node.level:
        module = f"{base}.{module}" if module else base
    found = []
    lazy = _lazy_names(module)
    for alias in node.names:
        sub = f"{module}.{alias.name}"
        path = os.path.join(ROOT, *sub.split("."))
        if alias.name in lazy:  # (a package's name imported on first use: its module)
            found.append(lazy[alias.name])
        elif os.path.exists(path + ".py") or os.path.isdir(path) or any(
                os.path.exists(path + suffix) for suffix in EXTENSION_SUFFIXES):
            found.append(sub)
        else:
            found.append(module)
    return sorted(set(found))


def _lazy_names(package: str) -> dict[str, str]:
    """A daifu package's ``_LAZY`` table: name -> the module it comes from."""
    if not package.startswith("daifu"):
        return {}
    try:
        table = getattr(importlib.import_module(package), "_LAZY", {})
    except ImportError:
        return {}
    if not isinstance(table, dict):
        return {}
    return {name: importlib.util.resolve_name(module, package) if module.startswith(".")
            else (module if module.startswith("daifu") else f"{package}.{module}")
            for name, (module, _) in table.items()}


def lazy_imports() -> list[tuple[str, int, int, list[str]]]:
    """(file, first line, last line, modules) of each import in a function,
    outside ``if TYPE_CHECKING:``."""
    found: list[tuple[str, int, int, list[str]]] = []
    for folder, _, files in os.walk(PACKAGE):
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as fh:
                tree = ast.parse(fh.read())
            _walk(tree, False, path, _module_name(path), name == "__init__.py", found)
    return found


def _walk(node: ast.AST, inside: bool, path: str, host: str, is_package: bool,
          found: list[tuple[str, int, int, list[str]]]) -> None:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            _walk(child, True, path, host, is_package, found)
        elif (isinstance(child, ast.If) and isinstance(child.test, ast.Name)
              and child.test.id == "TYPE_CHECKING"):
            continue
        elif isinstance(child, (ast.Import, ast.ImportFrom)) and inside:
            found.append((path, child.lineno, child.end_lineno or child.lineno,
                          _targets(host, is_package, child)))
        else:
            _walk(child, inside, path, host, is_package, found)


def cost_ms(modules: list[str], runs: int = 3) -> float:
    times = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", _TIME, *modules], capture_output=True,
                             text=True, cwd=ROOT, env={**os.environ, "PYTHONWARNINGS": "ignore"})
        times.append(float(out.stdout.strip().splitlines()[-1]))
    return statistics.median(times)


def _figure(ms: float) -> str:
    return f"lazy: {ms / 1000:.1f} s" if ms >= 1000 else f"lazy: {ms:.1f} ms"


def _annotate(lines: list[str], first: int, figure: str) -> None:
    """Put ``figure`` on the import's first line (its comment extended, or
    a new one; above the line when it would be too long)."""
    line = lines[first - 1].rstrip("\n")
    if MARK.search(line):
        lines[first - 1] = MARK.sub(figure, line) + "\n"
        return
    new = f"{line}  # {figure}"  # (a comment of its own: ``noqa``/``type:`` stay intact)
    if len(new) <= LIMIT:
        lines[first - 1] = new + "\n"
        return
    indent = line[: len(line) - len(line.lstrip())]
    above = lines[first - 2] if first >= 2 else ""
    if MARK.search(above) and above.lstrip().startswith("#"):
        lines[first - 2] = MARK.sub(figure, above)
    else:
        lines.insert(first - 1, f"{indent}# {figure}\n")


def main(argv: list[str]) -> int:
    write = "--write" in argv
    found = lazy_imports()
    costs: dict[tuple[str, ...], float] = {}
    for _, _, _, modules in found:
        key = tuple(modules)
        if key not in costs:
            costs[key] = cost_ms(list(key))
    for path, first, _, modules in found:
        print(f"{costs[tuple(modules)]:9.1f} ms  {', '.join(modules)}  "
              f"({os.path.relpath(path, ROOT)}:{first})")
    if write:
        by_file: dict[str, list[tuple[int, str]]] = {}
        for path, first, _, modules in found:
            by_file.setdefault(path, []).append((first, _figure(costs[tuple(modules)])))
        for path, marks in by_file.items():
            with open(path, encoding="utf-8") as fh:
                lines = fh.readlines()
            for first, figure in sorted(marks, reverse=True):  # (bottom up: lines shift)
                _annotate(lines, first, figure)
            with open(path, "w", encoding="utf-8") as fh:
                fh.writelines(lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
