"""The programs: pysource-codegen's, made to run.

pysource-codegen (a random generator of valid Python code, from PyPI) makes
programs over six names, ``name_0`` .. ``name_5``, that are never defined: as
they come, nearly every one ends at its first statement with a NameError.
Each seed gives one generated program and four programs made from it:

* ``plain``: a prelude binds the six names (an int, a list, a str, a dict,
  the harness's probe, an object with attributes and dunders), then the
  generated code runs as it is; the first exception nobody handles ends it.
  The probe (``__probe__``), called wherever the program calls ``name_4``,
  prints what its caller's frame shows: the chain of the program's frames
  (names and lines), the caller's names, the exception being handled.
* ``function``: the same, the generated statements being the body of a
  function that the program calls (the six names are its locals where it
  assigns them, the prelude's globals elsewhere).
* ``driven``: as ``plain``, but every statement of every body is wrapped in
  ``try: ... except Exception as e: print(...)`` (the program goes on after a
  failing statement, and the exceptions are raised and handled inside the
  functions, where daifu's barrier and stubs are), and an epilogue calls each
  function and class the program left in ``name_0`` .. ``name_5`` and drives
  what they return (generators, coroutines, async generators).

* ``generator``: as ``driven``, the generated statements being the body of a
  generator function, each followed by a ``yield`` (inside its own ``try``);
  the program iterates it and throws a ValueError in at every third yield.

Each gets a loop guard: ``__guard__()`` at the top of every loop body and
function body ends the program with ``Budget`` (a BaseException) after a fixed
number of steps, so a program that would loop forever ends deterministically.
``__guard__``, ``__caught__``, ``__probe__`` and ``Budget`` are given by the harness
(tests/fuzz/compare.py), never vaccinated.
"""

from __future__ import annotations

import ast
import sys
import warnings

KINDS = ("plain", "function", "driven", "generator")

PRELUDE = '''\
class _Thing:
    name_0 = 0
    name_1 = 1
    name_2 = "s"
    name_3 = [1, 2]
    name_4 = None
    name_5 = (3,)

    def __call__(self, *args, **kwargs):
        return args

    def __iter__(self):
        return iter([1, 2, 3])

    def __getitem__(self, key):
        return key

    def __len__(self):
        return 2

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __repr__(self):
        return "Thing"


name_0 = 3
name_1 = [0, 1, 2]
name_2 = "ab"
name_3 = {0: 1, "a": [2]}
name_4 = __probe__
name_5 = _Thing()
'''

EPILOGUE = '''
def __drive__(value, depth=0):
    import types
    if isinstance(value, types.GeneratorType):
        for _, item in zip(range(20), value):
            print("  item", repr(item))
    elif isinstance(value, types.CoroutineType):
        for _ in range(20):
            value.send(None)
    elif isinstance(value, types.AsyncGeneratorType):
        for _ in range(5):
            step = value.asend(None)
            for _ in range(20):
                step.send(None)
    else:
        print("  ->", repr(value)[:200])


for __name in ("name_0", "name_1", "name_2", "name_3", "name_4", "name_5"):
    __value = globals().get(__name)
    if callable(__value) and not isinstance(__value, type(print)):
        for __args in ((), (1,), ([1, 2], "x")):
            print("call", __name, len(__args))
            try:
                __drive__(__value(*__args))
            except StopIteration as __exc:
                print("  stop", repr(__exc.value)[:200])
            except Exception as __exc:
                print("  raised", type(__exc).__name__, str(__exc)[:200])
'''


def _guard() -> ast.stmt:
    return ast.Expr(ast.Call(ast.Name("__guard__", ast.Load()), [], []))


def _catch(stmt: ast.stmt) -> ast.stmt:
    """``try: stmt except Exception as __e: __caught__(LINE, __e)`` (the harness's
    ``__caught__`` prints the exception: type, message, its traceback's lines,
    the types of its context and cause)"""
    report = ast.parse(f"__caught__({stmt.lineno}, __e)").body[0]
    return ast.Try(body=[stmt], handlers=[ast.ExceptHandler(
        ast.Name("Exception", ast.Load()), "__e", [report])], orelse=[], finalbody=[])


class _Transform(ast.NodeTransformer):
    def __init__(self, catch: bool):
        self.catch = catch

    def _body(self, body: list[ast.stmt], guard: bool) -> list[ast.stmt]:
        out: list[ast.stmt] = [_guard()] if guard else []
        for stmt in body:
            stmt = self.visit(stmt)
            keep = (isinstance(stmt, ast.Global | ast.Nonlocal | ast.Pass)
                    or (isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__"))
            out.append(stmt if not self.catch or keep else _catch(stmt))
        return out

    def generic_visit(self, node: ast.AST) -> ast.AST:
        loop = isinstance(node, ast.For | ast.AsyncFor | ast.While)
        function = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                setattr(node, field, self._body(body, guard=(loop or function)
                                                 and field == "body"))
        for field, value in ast.iter_fields(node):
            if field in ("body", "orelse", "finalbody") and isinstance(value, list) \
                    and value and isinstance(value[0], ast.stmt):
                continue
            if isinstance(value, list):
                setattr(node, field, [self.visit(v) if isinstance(v, ast.AST) else v
                                      for v in value])
            elif isinstance(value, ast.AST):
                setattr(node, field, self.visit(value))
        return node


GENERATOR_DRIVER = '''
__g = __program__()
__n = 0
try:
    while True:
        __v = __g.throw(ValueError("thrown")) if __n % 3 == 2 else next(__g)
        print("yielded", __v)
        __n += 1
except StopIteration as __stop:
    print("stopped", __n, repr(__stop.value))
except Exception as __exc:
    print("generator raised", type(__exc).__name__, str(__exc)[:200])
'''


def make(generated: str, kind: str) -> str | None:
    """The runnable program of kind ``kind`` (one of KINDS) made from
    ``generated`` (None: it does not compile once transformed)."""
    driven = kind in ("driven", "generator")
    function = kind in ("function", "generator")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            tree = ast.parse(generated)
        except SyntaxError:
            return None
        future = [s for s in tree.body if isinstance(s, ast.ImportFrom)
                  and s.module == "__future__"]
        # (a module's ``global`` changes nothing, but after the prelude's
        # assignments it is a SyntaxError)
        tree.body = [s for s in tree.body if s not in future and not isinstance(s, ast.Global)]
        body = tree.body or [ast.Pass()]
        if kind == "generator":
            body = [part for stmt in body for part in (
                stmt, ast.copy_location(ast.Expr(ast.Yield(ast.Constant(stmt.lineno))), stmt))]
        if function:
            body = [ast.FunctionDef("__program__", ast.arguments([], [], None, [], [], None, []),
                                    body, [], None, None, lineno=body[0].lineno,
                                    **({"type_params": []} if sys.version_info >= (3, 12)
                                       else {}))]
        tree.body = body
        tree = _Transform(catch=driven).visit(tree)
        if function:  # (the function itself, not wrapped)
            tree.body = [tree.body[0].body[0]] if driven else tree.body
        call = {"function": "__program__()", "generator": GENERATOR_DRIVER}.get(kind, "")
        tree.body = [*future, *ast.parse(PRELUDE).body, *tree.body, *ast.parse(call).body,
                     *(ast.parse(EPILOGUE).body if driven else [])]
        ast.fix_missing_locations(tree)
        try:
            source = ast.unparse(tree)
            compile(source, "<fuzz>", "exec", dont_inherit=True)
        except (SyntaxError, ValueError, RecursionError):
            return None
    return source


def generate(seed: int) -> str:
    """pysource-codegen's program for ``seed`` (small: a few dozen statements)."""
    from pysource_codegen import generate as codegen

    return codegen(seed, node_limit=200, depth_limit=5)


def programs(seed: int, kinds: tuple[str, ...] = KINDS) -> list[tuple[str, str]]:
    """``[(kind, source), ...]``: the programs of these kinds made from seed ``seed``."""
    generated = generate(seed)
    out = []
    for kind in kinds:
        source = make(generated, kind)
        if source is not None:
            out.append((kind, source))
    return out
