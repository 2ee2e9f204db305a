"""A try/except KeyError loop whose exception is raised ``depth + 2`` calls down."""

from __future__ import annotations

import daifu


def build(depth: int, vaccinate: bool):
    def inner(d, k):
        return d[k]

    def mid(d, k, depth):
        if depth:
            return mid(d, k, depth - 1)
        return inner(d, k)

    def outer(n):
        hits = 0
        for i in range(n):
            try:
                mid({}, i, depth)
            except KeyError:
                hits += 1
        return hits

    if vaccinate:  # (daifu.vaccinate records this file: callers' handlers are read here)
        for fn in (inner, mid, outer):
            daifu.vaccinate(fn)
    return outer


def build_own(vaccinate: bool):
    """``try: d[k]`` / ``except KeyError`` in the function that raises."""
    def own(n):
        d, hits = {}, 0
        for i in range(n):
            try:
                d[i]
            except KeyError:
                hits += 1
        return hits

    if vaccinate:
        daifu.vaccinate(own)
    return own


# -- the handled exceptions of issue 33's table: each as ``run(n) -> hits`` ----------------

ROWS = {
    "tuple": ("caught by the caller's except (IndexError, KeyError)", """
def lookup(d, k):
    return d[k]

def run(n):
    hits = 0
    for i in range(n):
        try:
            lookup({}, i)
        except (IndexError, KeyError):
            hits += 1
    return hits
"""),
    "with": ("a with block between the raise and the handler", """
class Exit:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

def watched(d, k):
    with Exit():
        return d[k]

def run(n):
    hits = 0
    for i in range(n):
        try:
            watched({}, i)
        except KeyError:
            hits += 1
    return hits
"""),
    "module": ("a try/except loop at module level", """
d, hits = {}, 0
for i in range(N):
    try:
        d[i]
    except KeyError:
        hits += 1
"""),
    "hasattr": ("hasattr on a __getattr__ that raises", """
class Lazy:
    def __getattr__(self, name):
        raise AttributeError(name)

def run(n):
    a, hits = Lazy(), 0
    for _ in range(n):
        if not hasattr(a, "missing"):
            hits += 1
    return hits
"""),
    "stopiteration": ("StopIteration from a class's __next__", """
class Empty:
    def __iter__(self):
        return self

    def __next__(self):
        raise StopIteration

def run(n):
    hits = 0
    for _ in range(n):
        for _x in Empty():
            pass
        hits += 1
    return hits
"""),
}


def build_row(row: str, vaccinate: bool):
    """``run(n) -> hits`` of a row of the table: its source compiled plainly,
    or vaccinated whole (every function, and the module code for "module")."""
    import os

    from daifu.cells import Selection, vaccinate_source

    source = ROWS[row][1]
    filename = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"eafp_{row}.py")
    module = row == "module"
    if vaccinate:
        code, _ = vaccinate_source(source, filename, Selection(("**",), module),
                                   module=f"eafp_{row}")
    else:
        code = compile(source, filename, "exec")
    if module:
        def run(n):
            ns = {"N": n, "__name__": f"eafp_{row}"}
            exec(code, ns)
            return ns["hits"]
        return run
    ns = {"__name__": f"eafp_{row}"}
    exec(code, ns)
    return ns["run"]
