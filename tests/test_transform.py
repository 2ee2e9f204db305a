"""Transform tests: every statement kind, crashing inside it once.

Each snippet calls ``flaky()`` at one point; ``flaky`` raises the first time
it is called and returns normally afterwards.  Vaccinated with a RETRY rule
the function must return exactly what the plain function returns when nothing
fails; vaccinated without a rule it must raise exactly what the plain function
raises.  The cells the rewrite produced are checked too.
"""

from __future__ import annotations

import ast
import contextlib
import dis
import os
import subprocess
import sys
import textwrap
import threading

import pytest

import daifu
from daifu.cells import cells_of, is_vaccinated

from .support import plain, vaccinate

PRELUDE = '''
class Flake(Exception):
    pass

STATE = {"fail": 0}

def flaky(value=None):
    if STATE["fail"] > 0:
        STATE["fail"] -= 1
        raise Flake("transient")
    return value

class Ctx:
    def __init__(self, log, name="c"):
        self.log, self.name = log, name
    def __enter__(self):
        self.log.append("enter " + self.name)
        return self
    def __exit__(self, et, ev, tb):
        self.log.append("exit " + self.name + (" " + et.__name__ if et else ""))
        return False

G = 0
'''

SNIPPETS = {
    "for_else": '''
def f():
    out = []
    for i in range(3):
        out.append(flaky(i))
    else:
        out.append("else")
    return out
''',
    "while_else": '''
def f():
    n, out = 0, []
    while n < 3:
        n += 1
        out.append(flaky(n))
    else:
        out.append("else")
    return out
''',
    "break_continue_return": '''
def f():
    out = []
    for i in range(10):
        if i == 1:
            continue
        if i == 4:
            break
        out.append(flaky(i))
    for j in range(5):
        if j == 2:
            return out + [flaky("ret")]
    return None
''',
    "nested_loops": '''
def f():
    out = []
    for i in range(2):
        for j in range(2):
            k = 0
            while k < 2:
                out.append((i, j, k, flaky(k)))
                k += 1
    return out
''',
    "try_except_else_finally": '''
def f():
    log = []
    for i in range(3):
        try:
            log.append(flaky(i))
        except KeyError:
            log.append("key")
        else:
            log.append("else")
        finally:
            log.append("finally")
    return log
''',
    "crash_in_except_body": '''
def f():
    log = []
    for i in range(2):
        try:
            {}[i]
        except KeyError as e:
            log.append(("caught", e.args, flaky(i)))
    return log
''',
    "crash_in_finally_body": '''
def f():
    log = []
    for i in range(2):
        try:
            log.append(i)
        finally:
            log.append(flaky("fin"))
    return log
''',
    "with_nested": '''
def f():
    log = []
    for i in range(2):
        with Ctx(log, "a"), Ctx(log, "b") as b:
            with Ctx(log, "c"):
                log.append(flaky(b.name))
    return log
''',
    "with_header": '''
def f():
    log = []
    for i in range(2):
        with Ctx(log, flaky("x")):
            log.append(i)
    return log
''',
    "match": '''
def f():
    out = []
    for item in [1, [2, 3], {"k": 4}, "s"]:
        match item:
            case int(n) if flaky(n) is not None:
                out.append(("int", n))
            case [a, b]:
                out.append(("pair", flaky(a + b)))
            case {"k": v}:
                out.append(("map", v))
            case _:
                out.append(("other", item))
    return out
''',
    "global_nonlocal": '''
def f():
    global G
    G = 0
    total = 0
    def add(v):
        nonlocal total
        total += flaky(v)
    for i in range(4):
        add(i)
        G += i
    return total, G
''',
    "closures_lambdas_comprehensions": '''
def f():
    scale = 3
    mul = lambda v: v * scale
    out = []
    for i in range(3):
        out.append([mul(flaky(j)) for j in range(i)])
        out.append({k: flaky(k) for k in range(2)})
        out.append(sum(flaky(x) for x in range(i)))
    return out
''',
    "generator": '''
def gen(n):
    for i in range(n):
        yield flaky(i)
    yield "end"

def f():
    return list(gen(3))
''',
    "del_walrus_star": '''
def f():
    out = []
    data = [1, 2, 3, 4]
    while (n := len(data)) > 1:
        first, *rest = flaky(data)
        out.append((n, first, rest))
        del data[0]
    tmp = flaky(5)
    del tmp
    return out
''',
    "assert_augassign_subscript": '''
def f():
    d = {"a": 0}
    for i in range(3):
        d["a"] += flaky(i)
        assert flaky(d["a"]) >= 0, "never"
    return d
''',
    # 16 entries or more over several lines: 3.11 builds the dict with
    # MAP_ADD, whose stack effect the bytecode library misreports
    # 16 entries or more over several lines: 3.11 builds the dict with
    # MAP_ADD, whose stack effect the bytecode library misreports
    "big_dict_literal": '''
def f():
    out = []
    for i in range(3):
        table = {"flaky": flaky(i),
            "k0": 0,
            "k1": 1,
            "k2": 2,
            "k3": 3,
            "k4": 4,
            "k5": 5,
            "k6": 6,
            "k7": 7,
            "k8": 8,
            "k9": 9,
            "k10": 10,
            "k11": 11,
            "k12": 12,
            "k13": 13,
            "k14": 14,
            "k15": 15,
            "k16": 16,
            "k17": 17,
        }
        out.append(sorted(table.items()))
    return out
''',
    "module_level": None,  # handled below
}


def _run(ns):
    ns["STATE"]["fail"] = 0
    return ns["f"]()


@pytest.mark.parametrize("kind", [k for k, v in SNIPPETS.items() if v])
def test_statement_kind_retry_equals_plain(kind):
    source = PRELUDE + SNIPPETS[kind]
    expected = _run(plain(source))
    ns = vaccinate(source)
    assert is_vaccinated(ns["f"].__code__)
    assert _run(ns) == expected  # vaccinated, nothing fails

    retried = []

    @daifu.on(Exception)
    def retry(crash):
        retried.append(crash.statement)
        return daifu.RETRY

    ns["STATE"]["fail"] = 1
    assert ns["f"]() == expected  # vaccinated, fails once, retried
    assert len(retried) == 1 and "flaky" in retried[0]


@pytest.mark.parametrize("kind", [k for k, v in SNIPPETS.items() if v])
def test_statement_kind_without_rule_raises_like_plain(kind):
    source = PRELUDE + SNIPPETS[kind]
    p, v = plain(source), vaccinate(source)
    results = []
    for ns in (p, v):
        ns["STATE"]["fail"] = 1
        with pytest.raises(Exception) as info:
            ns["f"]()
        tb_lines = [(e.name, e.lineno) for e in info.traceback if "daifu-tests" in str(e.path)]
        results.append((info.type.__name__, info.value.args, tb_lines))
    assert results[0] == results[1]


def test_module_level_code_statement_kinds():
    source = PRELUDE + '''
log = []
for i in range(3):
    try:
        log.append(flaky(i))
    finally:
        log.append("f")
with Ctx(log):
    log.append(flaky("w"))
'''
    expected = plain(source)["log"]

    @daifu.on(Exception)
    def retry(crash):
        return daifu.RETRY

    ns = vaccinate(source.replace('STATE = {"fail": 0}', 'STATE = {"fail": 2}'),
                   module_level=True)
    assert ns["log"] == expected
    assert ns["STATE"] == {"fail": 0}  # both failures happened and were retried


def test_cells_describe_statements():
    ns = vaccinate(PRELUDE + SNIPPETS["try_except_else_finally"])
    info = cells_of(ns["f"].__code__)
    roles = {(c.role, c.source) for c in info.cells}
    assert ("loop-header", "for i in range(3):") in roles
    assert ("statement", "log.append(flaky(i))") in roles
    body = next(c for c in info.cells if c.source == "log.append(flaky(i))")
    kinds = [g.kind for g in body.guards]
    assert kinds == ["except", "finally"]
    assert body.can_retry and body.can_skip
    assert not body.can_continue  # the try/finally would be skipped


def test_normal_path_never_calls_daifu():
    """No call to the barrier or the resumed-probe outside the appended stubs
    and retry copies: the original instructions are unchanged."""
    ns = vaccinate(PRELUDE + SNIPPETS["nested_loops"])
    original = cells_of(ns["f"].__code__).original
    new = ns["f"].__code__
    def listing(code):  # (jump targets compared by opcode only: dis numbers labels)
        return [(i.opname, "" if i.argrepr.startswith("to ") else i.argrepr)
                for i in dis.get_instructions(code)]

    old_ops, new_ops = listing(original), listing(new)
    if sys.version_info >= (3, 12):
        # 3.12+: one NOP before each loop header (run once per loop, on entry;
        # see _py313.emit), nothing else
        loops = sum(1 for op in old_ops if op[0] == "FOR_ITER")
        head = new_ops[: len(old_ops) + loops]
        assert sum(1 for op in head if op[0] == "NOP") - sum(
            1 for op in old_ops if op[0] == "NOP") == loops
        new_ops = [op for op in head if op[0] != "NOP"]
        old_ops = [op for op in old_ops if op[0] != "NOP"]
    assert new_ops[: len(old_ops)] == old_ops
    assert not any("barrier" in repr(arg) or "resumed" in repr(arg)
                   for _, arg in new_ops[: len(old_ops)])


def test_keyboard_interrupt_and_generator_exit_are_never_intercepted():
    ns = vaccinate('''
def stop(exc):
    for i in range(3):
        raise exc
def gen():
    for i in range(3):
        yield i
''')
    seen = []

    @daifu.on(BaseException)
    def everything(crash):
        seen.append(crash)
        return daifu.RETRY

    for exc in (KeyboardInterrupt, SystemExit, GeneratorExit, StopIteration):
        with pytest.raises(exc):
            ns["stop"](exc)
    g = ns["gen"]()
    next(g)
    g.close()
    assert seen == []


def test_statement_text_survives_form_feeds_and_unicode_line_separators():
    # str.splitlines() would split these lines: the AST's line numbers do not
    from daifu.cells._source import ModuleSource

    source = "x = '\u2028'\n\x0c\ndef f(xs):\n    try:\n        return xs[0]\n" \
             "    except IndexError:\n        return None\n"
    m = vaccinate(source)
    info = cells_of(m["f"].__code__)
    assert "return xs[0]" in [c.source for c in info.cells]
    guard = next(c for c in info.cells if c.source == "return xs[0]").guards[0]
    assert guard.clauses[0].text == "except IndexError:"
    assert ModuleSource(source, "ff.py").line(5) == "return xs[0]"


DEEP_STACKS = '''
import contextlib

def deep(rows, log):
    with contextlib.nullcontext(log) as a:
        for row in rows:
            with contextlib.nullcontext(row) as b:
                for x in b:
                    for y in range(x):
                        try:
                            log.append((a is log, x, y, [v * 2 for v in range(y)]))
                        except KeyError:
                            continue
    return log

def gen(n):
    for i in range(n):
        with contextlib.nullcontext(i) as v:
            yield [w for w in range(v)]
'''


def _canonical(code):
    """A rewritten code object as its instructions (EXTENDED_ARG prefixes and
    caches left out) with their arguments' values (a cell's constant by its
    index), jump targets and exception-table handlers as indices into that
    list, each instruction's source position, and its stack size."""
    from daifu.cells._cell import CELL_MARK

    ext = dis.opmap["EXTENDED_ARG"]
    ins = [i for i in dis.get_instructions(code) if i.opname not in ("EXTENDED_ARG", "CACHE")]
    index = {i.offset: n for n, i in enumerate(ins)}
    raw = code.co_code

    def at(offset):
        while raw[offset] == ext:
            offset += 2
        return index[offset]

    def const(value):
        if isinstance(value, tuple) and value[:1] == (CELL_MARK,):
            return ("cell", value[2])
        return "<code>" if hasattr(value, "co_code") else value

    positions = list(code.co_positions())
    seq = [(i.opname, ("->", at(i.argval)) if i.opcode in dis.hasjrel + dis.hasjabs
            else const(i.argval) if i.opcode in dis.hasconst else i.argval,
            positions[i.offset // 2]) for i in ins]
    handlers = {}
    for entry in dis._parse_exception_table(code):
        for offset in range(entry.start, entry.end, 2):
            if offset in index:
                handlers[index[offset]] = (at(entry.target), entry.depth, entry.lasti)
    return seq, handlers, code.co_stacksize


def test_module_code_with_more_constants_and_names_than_a_byte_is_retried_exactly():
    # 400 statements, each a constant and a name of its own: every stub's
    # constants and names sit past index 255 (EXTENDED_ARG), or the shared
    # part of the stubs is given the first indices after the original's
    body = "".join(f"v{i} = {i} + 1000\n" for i in range(400))
    source = PRELUDE + body + "middle = flaky('m')\n" + body.replace("v", "w") + \
        "total = sum(globals()[f'w{i}'] for i in range(400))\n"
    expected = plain(source)

    @daifu.on(Exception)
    def retry(crash):
        return daifu.RETRY

    ns = vaccinate(source.replace('STATE = {"fail": 0}', 'STATE = {"fail": 1}'),
                   module_level=True)
    assert ns["STATE"] == {"fail": 0}  # it failed once, and was retried
    assert (ns["middle"], ns["total"], ns["v399"]) == \
        (expected["middle"], expected["total"], expected["v399"])


def _module_source(module: str) -> tuple[str, str]:
    """A stdlib module's source and file name (``deep``: ``DEEP_STACKS``)."""
    import importlib.util

    if module == "deep":
        return DEEP_STACKS, "deep.py"
    filename = importlib.util.find_spec(module).origin
    with open(filename, encoding="utf-8") as f:
        return f.read(), filename


def _codes(code):
    yield code
    for const in code.co_consts:
        if hasattr(const, "co_code"):
            yield from _codes(const)


@pytest.mark.parametrize("module", ["argparse", "compileall", "dataclasses", "deep"])
def test_spliced_stubs_are_the_code_bytecode_assembles(module, monkeypatch):
    # daifu assembles rewritten code itself (``_assemble.splice``: the
    # original's encoded arguments, its own stubs, jumps, exception and
    # location tables); assembling it all with the bytecode library (and the
    # stack size from a full analysis instead of ``stub_peak``) gives the
    # same instructions, argument values, jumps, handlers, positions and
    # stack size -- for functions with hundreds of constants and long jumps
    # (argparse, compileall) and with many values on the stack below a cell
    # (deep).  splice keeps the original's variables where bytecode
    # renumbers them and drops unused ones.
    import warnings

    from daifu.cells import Selection, options, vaccinate_source
    from daifu.cells._rewrite import _core

    source, filename = _module_source(module)
    monkeypatch.setattr(options, "cache", None)
    monkeypatch.setattr(options, "strict", False)
    built = {}
    for splice in (True, False):
        monkeypatch.setattr(_core, "_SPLICE", splice)
        with warnings.catch_warnings():  # (what cannot be vaccinated: the same both ways)
            warnings.simplefilter("ignore")
            built[splice] = vaccinate_source(source, filename, Selection(("**",)))[0]
    spliced, whole = list(_codes(built[True])), list(_codes(built[False]))
    assert len(spliced) == len(whole)
    originals = list(_codes(compile(source, filename, "exec", dont_inherit=True)))
    for a, b, original in zip(spliced, whole, originals):
        assert _canonical(a) == _canonical(b), a.co_qualname
        assert (a.co_varnames, a.co_cellvars, a.co_freevars, a.co_flags, a.co_nlocals) == (
            original.co_varnames, original.co_cellvars, original.co_freevars,
            original.co_flags, original.co_nlocals)
    if module == "deep":  # a cell with five values below it: its stub goes deepest
        assert max(c.co_stacksize for c in spliced) >= 2 * 5 + 11



def _decoded(ops, label_at):
    """The instructions as comparable values (a label: where it is)."""
    from bytecode import Label

    out = []
    for op in ops:
        arg, loc, entry = op.instr.arg, op.instr.location, op.entry
        out.append((op.instr.name, ("label", label_at[arg]) if isinstance(arg, Label)
                    else (type(arg).__name__, repr(arg)),
                    None if entry is None else (label_at[entry[0]], *entry[1:]),
                    None if loc is None else (loc.lineno, loc.end_lineno, loc.col_offset,
                                              loc.end_col_offset), op.raw, op.offset))
    return out, sorted(label_at.values())


def test_exception_tables_are_read_as_dis_reads_them_without_raising():
    # dis's reader ends on a StopIteration that a sys.monitoring tool sees
    # (daifu reads tables on the path of exceptions the program handles)
    from types import CodeType

    from daifu.cells._exctable import exception_entries

    codes = []
    for name in ("json.decoder", "argparse", "asyncio.base_events", "contextlib"):
        source, filename = _module_source(name)
        pending = [compile(source, filename, "exec")]
        while pending:
            code = pending.pop()
            codes.append(code)
            pending += [c for c in code.co_consts if isinstance(c, CodeType)]
    with_tables = [c for c in codes if c.co_exceptiontable]
    assert len(with_tables) > 40
    for code in codes:
        assert [tuple(e) for e in exception_entries(code)] == \
            [tuple(e) for e in dis._parse_exception_table(code)], code.co_qualname
    # a table cut inside its last entry: that entry left out, as dis does
    code = max(with_tables, key=lambda c: len(c.co_exceptiontable))
    cut = code.replace(co_exceptiontable=code.co_exceptiontable[:-1])
    assert [tuple(e) for e in exception_entries(cut)] == \
        [tuple(e) for e in dis._parse_exception_table(cut)]

    def raised(read) -> list:
        seen: list = []

        def tracer(frame, event, arg):
            if event == "exception":
                seen.append(arg[0].__name__)
            return tracer
        sys.settrace(tracer)
        try:
            read(code)
        finally:
            sys.settrace(None)
        return seen

    assert raised(dis._parse_exception_table) and raised(exception_entries) == []


@pytest.mark.parametrize("module", ["argparse", "asyncio.base_events", "dataclasses", "locale",
                                    "email._header_value_parser", "typing", "deep"])
def test_the_rewrites_decoder_reads_code_as_bytecode_does(module):
    # the rewrite decodes a code object in one pass (``_decode``); what it
    # reads must be what ``bytecode`` reads (``_flatten`` of its abstract
    # instructions): every instruction, argument, location, exception-table
    # entry and label (locale's module code: 1462 constants, EXTENDED_ARG)

    from bytecode import Bytecode

    from daifu.cells._rewrite._analysis import _flatten
    from daifu.cells._rewrite._core import _read_raw_args
    from daifu.cells._rewrite._decode import decode

    source, filename = _module_source(module)
    codes = list(_codes(compile(source, filename, "exec", dont_inherit=True)))
    assert len(codes) >= 3
    for code in codes:
        ops, label_at = _flatten(Bytecode.from_code(code,
                                                    conserve_exception_block_stackdepth=True))
        _read_raw_args(code, ops)
        ours = decode(code)
        assert ours is not None, code.co_qualname
        assert _decoded(*ours) == _decoded(ops, label_at), code.co_qualname


@pytest.mark.parametrize("module", ["argparse", "dataclasses", "typing", "locale",
                                    "email._header_value_parser", "deep"])
def test_flat_code_is_armed_as_its_runs_would_arm_it(module, monkeypatch):
    # flat code (no exception table, no loop iterator, no jump into a
    # statement with values on the stack: ``_flat``) is armed without its
    # analysis, every instruction after the prologue pointed at one trap of
    # depth 0.  The exact arming of the same code (its runs) must have that
    # trap only, at depth 0, on a part of the same range; what it leaves
    # out cannot raise (the implicit return, a forward jump).  The walk in C
    # answers as the one in Python.
    import dis

    from daifu.cells._cell import CodeInfo
    from daifu.cells._exctable import exception_entries
    from daifu.cells._rewrite import _core, _flat
    from daifu.cells._source import ModuleSource

    if _flat.flat_start is _flat.py_flat_start:
        if os.environ.get("DAIFU_REQUIRE_SPEEDUPS") == "1":
            raise AssertionError("daifu/cells/_rewrite/_cflat.c is not built")
    source, filename = _module_source(module)
    tree = ast.parse(source, filename)
    msrc = ModuleSource(source, filename, tree)
    monkeypatch.setattr(_core, "_FLAT", False)
    flat = total = 0
    for code in _codes(compile(tree, filename, "exec", dont_inherit=True)):
        scope = msrc.scope_for(code)
        if scope is None:
            continue
        total += 1
        start = _flat.py_flat_start(code, msrc.statements(scope))
        assert _flat.flat_start(code, msrc.statements(scope)) == start, code.co_qualname
        if start is None:
            continue
        flat += 1
        info = CodeInfo(code.co_qualname, filename, code.co_firstlineno, None, original=code)
        armed = _core.arm(code, info, msrc, scope, {})
        own = [e for e in exception_entries(armed) if e.start < len(code.co_code)]
        assert own and {(e.target, e.depth, e.lasti) for e in own} == \
            {(own[0].target, 0, True)}, code.co_qualname
        assert own[0].start >= 2 * start, code.co_qualname
        covered = {o for e in own for o in range(e.start, e.end, 2)}
        left = {i.opname for i in dis.get_instructions(code)
                if i.offset >= 2 * start and i.offset not in covered}
        assert left <= {"LOAD_CONST", "RETURN_VALUE", "RETURN_CONST", "JUMP_FORWARD",
                        "EXTENDED_ARG"}, (code.co_qualname, left)
    assert flat >= total // 4, (flat, total)


@pytest.mark.parametrize("module", ["argparse", "email._header_value_parser", "deep"])
def test_locating_statements_in_order_finds_what_lookup_finds(module):
    # ``StatementIndex.locate`` tries the simple statements in source order
    # from the one found last (the flat walk's lookups): at every position of
    # every code object, in instruction order, the statement ``lookup``
    # finds, and its own span
    from daifu.cells._source import ModuleSource

    source, filename = _module_source(module)
    msrc = ModuleSource(source, filename, ast.parse(source, filename))
    checked = 0
    for code in _codes(compile(source, filename, "exec", dont_inherit=True)):
        scope = msrc.scope_for(code)
        if scope is None:
            continue
        by_lookup, by_locate = msrc.statements(scope), msrc.statements(scope)
        for pos in code.co_positions():
            stmt, located = by_lookup.lookup(pos), by_locate.locate(pos)
            assert (stmt is None and located is None) or (
                located is not None and located[0] is stmt
                and located[1:] == by_lookup.own_span(stmt)), (code.co_qualname, pos)
            checked += stmt is not None
    assert checked > 200


@pytest.mark.parametrize("module", ["argparse", "typing"])
def test_a_flat_trap_laid_out_once_is_the_one_laid_out_for_each_code(module, monkeypatch):
    # flat code's tail is laid out once per the table indices it uses
    # (``_assemble._COVERING_TAILS``): arming every code object of a module
    # with the layouts of those before it gives the code of a fresh layout
    from daifu.cells._cell import CodeInfo
    from daifu.cells._rewrite import _assemble, _core
    from daifu.cells._source import ModuleSource

    source, filename = _module_source(module)
    tree = ast.parse(source, filename)
    msrc = ModuleSource(source, filename, tree)
    monkeypatch.setattr(_assemble, "_COVERING_TAILS", {})
    hits = 0

    def armed(code, scope):
        info = CodeInfo(code.co_qualname, filename, code.co_firstlineno, None, original=code)
        try:
            new = _core.arm(code, info, msrc, scope, {})
        except (_core.Unsupported, _core.NothingToProtect) as exc:
            return repr(exc)
        added = tuple("mark" if type(c) is tuple and c[:1] == ("daifu.armed",) else c
                      for c in new.co_consts[len(code.co_consts):])  # (its key: per info)
        return (new.co_code, new.co_exceptiontable, new.co_linetable, new.co_names,
                new.co_stacksize, added)

    for code in _codes(compile(tree, filename, "exec", dont_inherit=True)):
        scope = msrc.scope_for(code)
        if scope is None:
            continue
        kept = dict(_assemble._COVERING_TAILS)
        _assemble._COVERING_TAILS.clear()
        fresh = armed(code, scope)
        _assemble._COVERING_TAILS.clear()
        _assemble._COVERING_TAILS.update(kept)
        before = len(kept)
        assert armed(code, scope) == fresh, code.co_qualname
        hits += len(_assemble._COVERING_TAILS) == before
    assert hits > 10


def test_the_flat_walk_reads_the_opcodes_as_the_rewrite_reads_them():
    # the flat walk's table (from ``opcode``: a first start that arms only
    # flat code imports neither ``bytecode`` nor ``dis``) has the columns of
    # the rewrite's (from ``bytecode``): name, argument, jump kind, caches
    from daifu.cells._rewrite import _decode, _flat

    assert [(row[0], row[1], row[3], row[4]) for row in _flat._TABLE] == \
        [(row[0], row[1], row[3], row[4]) for row in _decode._TABLE]
    assert (_flat._FORWARD, _flat._BACKWARD, _flat._ABSOLUTE) == \
        (_decode._FORWARD, _decode._BACKWARD, _decode._ABSOLUTE)


def test_the_flat_trap_of_this_version_is_the_one_its_rewrite_lays_out():
    # ``_flattail.TAILS``' entry of the running version (what ``_flat.arm``
    # appends to flat code without ``bytecode``) is a fresh derivation's:
    # a change to the stubs that does not renew it fails here
    from daifu.cells._rewrite import _core, _flat, _flattail
    from daifu.cells._rewrite._ops import PY

    assert _flattail.TAILS.get((*PY.python, _flat.magic())) == _core.flat_tail(), (
        "renew the entry: python -m daifu.cells._rewrite._core")
    assert _flat._TAIL is _flattail.TAILS[(*PY.python, _flat.magic())]


def test_a_build_without_a_laid_out_flat_trap_arms_flat_code_through_the_rewrite(monkeypatch):
    # no entry for the running bytecode (another magic number, 3.12, 3.14):
    # flat code is armed by ``_core.arm``, as it arms it
    from daifu.cells import _rewrite
    from daifu.cells._cell import CodeInfo
    from daifu.cells._rewrite import _core, _flat
    from daifu.cells._source import ModuleSource

    monkeypatch.setattr(_flat, "_TAIL", None)
    source = "x = 1\ny = x + 2\n"
    msrc = ModuleSource(source, "<no-entry>", ast.parse(source))
    code = compile(source, "<no-entry>", "exec")
    got = []
    for arm in (_rewrite.arm, _core.arm):
        info = CodeInfo("<module>", "<no-entry>", 1, None, original=code)
        got.append(_armed_fields(code, arm(code, info, msrc, msrc.scope_for(code), {})))
    assert got[0] == got[1]


def _armed_fields(code, new):
    added = tuple("mark" if type(c) is tuple and c[:1] == ("daifu.armed",) else c
                  for c in new.co_consts[len(code.co_consts):])  # (its key: per info)
    return (new.co_code, new.co_exceptiontable, new.co_linetable, new.co_names,
            new.co_consts[:len(code.co_consts)], new.co_stacksize, added)


@pytest.mark.parametrize("module", ["argparse", "typing", "email._header_value_parser", "deep"])
def test_flat_code_armed_without_bytecode_is_armed_as_the_rewrite_arms_it(module):
    # the package's ``arm`` arms flat code with ``_flat.arm``, its trap laid
    # out from the version's entry: byte for byte what ``_core.arm`` makes of
    # the same code (its tables, exception table, line table, stack size;
    # the trap's guards); code that is not flat is ``_core.arm``'s own
    from daifu.cells import _rewrite
    from daifu.cells._cell import CodeInfo
    from daifu.cells._rewrite import _core, _flat
    from daifu.cells._source import ModuleSource

    source, filename = _module_source(module)
    tree = ast.parse(source, filename)
    msrc = ModuleSource(source, filename, tree)
    flat = 0
    for code in _codes(compile(tree, filename, "exec", dont_inherit=True)):
        scope = msrc.scope_for(code)
        if scope is None:
            continue
        got = []
        for arm in (_rewrite.arm, _core.arm):
            info = CodeInfo(code.co_qualname, filename, code.co_firstlineno, None,
                            original=code)
            try:
                new = arm(code, info, msrc, scope, {})
            except (_core.Unsupported, _core.NothingToProtect) as exc:
                got.append(repr(exc))
            else:
                got.append((_armed_fields(code, new), repr(info.traps), info.armed))
        assert got[0] == got[1], code.co_qualname
        flat += _flat.flat_start(code, msrc.statements(scope)) is not None
    assert flat >= (1 if module == "deep" else 10)


@pytest.mark.parametrize("tables", ["names: 300", "names: 70000", "constants: 230-262"])
def test_flat_code_with_tables_past_a_byte_is_armed_as_the_rewrite_arms_it(tables):
    # a module of 300 names (or 70,000: two prefixes) puts the trap's names
    # past a byte: its instructions take EXTENDED_ARG prefixes, its jumps
    # move and its tables grow in its instructions' order; 230 to 262
    # constants put its mark alone past a byte, then its shared part's
    # constants too.  Laid out by ``_flat`` as ``_core.arm`` lays it out, and
    # run as the original runs
    from daifu.cells import _rewrite
    from daifu.cells._cell import CodeInfo
    from daifu.cells._rewrite import _core, _flat
    from daifu.cells._source import ModuleSource

    kind, sizes = tables.split(": ")
    low, _, high = sizes.partition("-")
    wide = 0
    for n in range(int(low), int(high or low) + 1):
        source = "".join(f"v{i} = w{i}\n" if kind == "names" else f"v = 's{i}'\n"
                         for i in range(n))
        msrc = ModuleSource(source, "<wide>", ast.parse(source))
        code = compile(source, "<wide>", "exec")
        scope = msrc.scope_for(code)
        assert _flat.flat_start(code, msrc.statements(scope)) is not None
        got, armed = [], []
        for arm in (_rewrite.arm, _core.arm):
            info = CodeInfo("<module>", "<wide>", 1, None, original=code)
            armed.append(arm(code, info, msrc, scope, {}))
            got.append(_armed_fields(code, armed[-1]))
        assert got[0] == got[1], n
        wide += dis.opmap["EXTENDED_ARG"] in armed[0].co_code[len(code.co_code)::2]
        ns: dict = {f"w{i}": i for i in range(n)}
        exec(code, ns)
        armed_ns: dict = {f"w{i}": i for i in range(n)}
        exec(armed[0], armed_ns)
        assert (armed_ns["v"] == ns["v"]) if kind == "constants" else (
            armed_ns[f"v{n - 1}"] == ns[f"v{n - 1}"] == n - 1)
    assert wide >= (1 if kind == "names" else 10)


def test_a_program_of_flat_code_starts_without_bytecode(tmp_path):
    # a program whose code is all flat is armed without importing the
    # ``bytecode`` library (or the rewrite): its first start does not pay
    # for them; its crash still reaches the engine
    script = tmp_path / "prog.py"
    script.write_text("import sys\n"
                      "def f(x):\n    return 1 / x\n"
                      "print(sorted(m for m in sys.modules if m.startswith('bytecode')"
                      "             or m == 'daifu.cells._rewrite._core'))\n"
                      "print(f(2))\n"
                      "print(f(0))\n")
    env = {**os.environ, "DAIFU_CACHE": "0"}
    out = subprocess.run([sys.executable, "-m", "daifu", str(script)],
                         capture_output=True, text=True, env=env, timeout=120)
    lines = out.stdout.splitlines()
    assert lines[:2] == ["[]", "0.5"], out.stdout + out.stderr
    assert out.returncode != 0 and "ZeroDivisionError: division by zero" in out.stderr
    assert '"statement": "return 1 / x"' in out.stderr and "crash.intercepted" in out.stderr


def test_a_flat_function_crashes_into_its_own_frame_and_is_retried():
    # a function with no loop, try or with (armed flat): the crash is taken
    # in its frame at the failing statement, which a retry re-runs; the
    # statements before it are not run again
    source = PRELUDE + textwrap.dedent("""
        CALLS = []
        def step(a, b=2):
            CALLS.append("before")
            x = a + flaky(3) * b
            if x > 10:
                y = [x, a]
            else:
                y = (x, b)
            return len(y) + x
        result = step(20)
    """)
    expected = plain(source)

    @daifu.on(Exception)
    def retry(crash):
        return daifu.RETRY

    ns = vaccinate(source.replace('STATE = {"fail": 0}', 'STATE = {"fail": 1}'),
                   module_level=True, armed=True)
    assert ns["STATE"] == {"fail": 0}  # it failed once, and was retried
    assert ns["result"] == expected["result"] and ns["CALLS"] == ["before"]
    # (the function runs its vaccinated code from then on, made at the crash)
    info = cells_of(ns["step"].__code__)
    assert info is not None and info.upgraded is ns["step"].__code__


@pytest.mark.parametrize("statements", [500, 3000])  # (3000: a long source, in pieces)
def test_the_module_tree_is_freed_before_the_collector_is_back(monkeypatch, statements):
    # the collector is paused while a module is rewritten; its first
    # collection after the pause walks what the pause allocated and is
    # still alive -- the module's tree, if anything still held it (the
    # rewrite's recursive walk did: a cycle only the collector frees)
    import gc

    from daifu.cells import Selection, _transform, options, vaccinate_source

    alive = []
    real = _transform._collector_paused

    @contextlib.contextmanager
    def spy():
        with real():
            yield
            alive.append(sum(1 for o in gc.get_objects(0)
                             if isinstance(o, ast.Name) and o.id.startswith("freed_")))

    monkeypatch.setattr(_transform, "_collector_paused", spy)
    monkeypatch.setattr(options, "cache", None)
    monkeypatch.setattr(options, "strict", False)  # (strict: rewritten now, the tree kept)
    body = "".join(f"freed_v{i} = freed_w{i} = {i}\n" for i in range(statements))
    assert (len(body) >= _transform._LONG) == (statements == 3000)
    monkeypatch.setattr(_transform, "_alone", lambda: True)  # (as in a program's main thread)
    vaccinate_source(body, "tree_freed.py", Selection(("**",), True, armed=True))
    assert alive == [0]


PIECES = {
    "strings and brackets at column 0": 'x = """\nabc\ny = 1\n"""\nz = f(\n1,\n)\nw = [\n]\n'
                                        "v = 1 + \\\n2\nu = 3\n",
    "clauses at column 0": "if a:\n    b = 1\nelif c:\n    b = 2\nelse:\n    b = 3\n"
                           "try:\n    d\nexcept E:\n    e\nfinally:\n    f\n"
                           "for i in x:\n    pass\nelse:\n    pass\n",
    "decorators and defs": "@dec\n@dec2(\n1)\ndef f(\na,\n):\n    return a\n"
                           "class C:\n    x = 1\n\n    def m(self): pass\n# end\nq = 1\n",
    "comments, blank lines, a form feed": "# c\n\n\na = 1  # x\n\x0c\nb = 2\n  # indented\nc = 3\n",
    "a carriage return": "a = 1\rb = 2\r\nc = 3\n",
    "multi-byte text": "s = 'ü€😀'\nt = s + 'é'  # ü\n",
}


@pytest.mark.parametrize("case", list(PIECES))
def test_a_long_source_parsed_in_pieces_is_the_tree_of_the_whole(case):
    # ``_source.parse`` cuts a long source before lines that start a
    # statement at column 0 and parses each piece after as many empty lines
    # as come before it: the tree, with every position, is ``ast.parse``'s;
    # a cut inside a statement (a string, brackets, a clause) parses the
    # whole source instead
    from daifu.cells._source import parse

    source = PIECES[case] * 3
    want = ast.dump(ast.parse(source, "p.py"), include_attributes=True)
    for lines in (1, 2, 3, 7, 256):
        assert ast.dump(parse(source, "p.py", lines), include_attributes=True) == want, lines


@pytest.mark.parametrize("module", ["argparse", "typing", "email._header_value_parser"])
def test_a_module_parsed_in_pieces_is_the_tree_of_the_whole(module):
    from daifu.cells._source import parse

    source, filename = _module_source(module)
    want = ast.dump(ast.parse(source, filename), include_attributes=True)
    for lines in (5, 64, 256):
        assert ast.dump(parse(source, filename, lines), include_attributes=True) == want


def test_a_source_that_does_not_parse_raises_what_ast_raises_in_pieces_too():
    from daifu.cells._source import parse

    source = "a = 1\n" * 10 + "b = (\n" + "c = 2\n" * 10
    with pytest.raises(SyntaxError) as want:
        ast.parse(source, "bad.py")
    with pytest.raises(SyntaxError) as got:
        parse(source, "bad.py", 3)
    assert (got.value.msg, got.value.lineno, got.value.offset) == \
        (want.value.msg, want.value.lineno, want.value.offset)


def test_a_long_module_warns_as_python_warns_once(monkeypatch):
    # a long source is compiled, then parsed in pieces: the parser's
    # warnings (an invalid escape sequence) are shown once, the compiler's
    # (``is`` with a literal) too, as ``compile`` shows them; the module
    # runs as compiled
    import warnings

    from daifu.cells import Selection, _transform, options, vaccinate_source

    monkeypatch.setattr(options, "cache", None)
    source = ("s = '\\d'\nt = (1 is 1)\n" + "".join(f"v{i} = {i}\n" for i in range(9000)))
    assert len(source) >= _transform._LONG

    def shown(run):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run()
        return sorted((w.category.__name__, str(w.message), w.lineno) for w in caught)

    given_back = []
    real = _transform._give_back
    monkeypatch.setattr(_transform, "_give_back", lambda: given_back.append(real()))
    want = shown(lambda: compile(source, "long_warns.py", "exec", dont_inherit=True))
    assert len(want) == 2, want
    # (another thread running: parsed, then compiled, as a short source is;
    # a thread an earlier test left behind would do it too)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert not _transform._alone()
        assert shown(lambda: vaccinate_source(source, "long_warns2.py",
                                              Selection(("**",), True, armed=True))) == want
    finally:
        stop.set()
        other.join()
    assert given_back == []
    monkeypatch.setattr(_transform, "_alone", lambda: True)  # (as in a program's main thread)
    out = []
    got = shown(lambda: out.append(vaccinate_source(source, "long_warns.py",
                                                    Selection(("**",), True, armed=True))))
    assert got == want and given_back == [None]  # (compiled first: the long path)
    ns: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(out[0][0], ns)
    assert ns["s"] == "\\d" and ns["t"] is True and ns["v8999"] == 8999


def test_the_collector_is_paused_while_a_module_is_rewritten_and_left_as_it_was(monkeypatch):
    # the rewrite allocates tens of objects per instruction: collections it
    # triggered walked the whole module's tree (3000 statements: 3.6x slower)
    import gc

    from daifu.cells import Selection, _transform, options, vaccinate_source

    seen = []
    real = _transform.vaccinate_module

    def spy(*args, **kwargs):
        seen.append(gc.isenabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(_transform, "vaccinate_module", spy)
    monkeypatch.setattr(options, "cache", None)
    selection = Selection(("**",), True)
    assert gc.isenabled()
    vaccinate_source("x = 1\n", "collector_a.py", selection)
    assert seen == [False] and gc.isenabled()
    with pytest.raises(SyntaxError):  # (raised as python raises it; the collector back on)
        vaccinate_source("x = (\n", "collector_b.py", selection)
    assert gc.isenabled()
    gc.disable()  # a program that turned it off: left off
    try:
        vaccinate_source("x = 2\n", "collector_c.py", selection)
        assert not gc.isenabled()
    finally:
        gc.enable()
    assert seen == [False, False]
