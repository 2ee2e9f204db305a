"""Helpers shared by the tests."""

from __future__ import annotations

import itertools
import linecache
import textwrap

from daifu.cells import Selection, vaccinate_source

_counter = itertools.count()


def vaccinate(source: str, entries=("**",), module_level: bool = False, name: str | None = None):
    """Compile ``source`` with daifu's rewrite and return its namespace.

    The source is registered with linecache so tracebacks and inspect work.
    """
    source = textwrap.dedent(source)
    name = name or f"snippet_{next(_counter)}"
    filename = f"/daifu-tests/{name}.py"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    code, report = vaccinate_source(source, filename, Selection(entries, module_level), module=name)
    namespace = {"__name__": name, "__file__": filename}
    exec(code, namespace)
    namespace["__report__"] = report
    return namespace


def plain(source: str, name: str | None = None):
    source = textwrap.dedent(source)
    name = name or f"plain_{next(_counter)}"
    filename = f"/daifu-tests/{name}.py"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"__name__": name, "__file__": filename}
    exec(compile(source, filename, "exec"), namespace)
    return namespace


