"""Reload of structural edits: the most natural fix for bad data is to wrap
the failing statement (or the loop body around it) in ``try``/``except``, or
to guard it with a new ``if``, and reload.  A new ``try``, ``if`` or ``else``
block holds no stack state, so the running call continues inside it; the
recovered call must return exactly what the corrected program returns."""

from __future__ import annotations

import ast
import importlib
import sys
import textwrap

import pytest

import daifu
from daifu import cells as _registry
from daifu.cells import ModuleSource, map_statement
from daifu.engine._events import capture

BUGGY = '''
def train(data):
    seen = []
    total = 0
    for x in data:
        seen.append(x)
        if x >= 0:
            y = 10 // x
            total += y
        seen.append(-x)
    return total, seen
'''

EDITS = {
    # the enclosing if wrapped in try/except
    "wrap_enclosing_if": ('''        if x >= 0:
            y = 10 // x
            total += y
''', '''        try:
            if x >= 0:
                y = 10 // x
                total += y
        except ZeroDivisionError:
            total += 1000
'''),
    # the failing statement itself wrapped
    "wrap_statement": ('''            y = 10 // x
''', '''            try:
                y = 10 // x
            except ZeroDivisionError:
                y = 1000
'''),
    # the whole loop body wrapped: what ran before the failing statement
    # (seen.append(x)) must not run again
    "wrap_loop_body": ('''        seen.append(x)
        if x >= 0:
            y = 10 // x
            total += y
        seen.append(-x)
''', '''        try:
            seen.append(x)
            if x >= 0:
                y = 10 // x
                total += y
            seen.append(-x)
        except ZeroDivisionError:
            total += 1000
'''),
    # a new guard in front of the failing statement: its condition runs
    "guard_with_if": ('''            y = 10 // x
            total += y
''', '''            if x:
                y = 10 // x
                total += y
'''),
    # the failing statement moved into a new else block
    "move_into_else": ('''            y = 10 // x
            total += y
''', '''            if x == 0:
                total -= 1
            else:
                y = 10 // x
                total += y
'''),
}


def _corrected(name: str) -> str:
    old, new = EDITS[name]
    assert old in BUGGY
    return BUGGY.replace(old, new, 1)


def _expected(name: str, data) -> object:
    scope: dict = {}
    exec(compile(_corrected(name), "<corrected>", "exec"), scope)
    return scope["train"](data)


@pytest.fixture
def buggy(tmp_path, monkeypatch):
    loaded = []

    def load(name: str):
        path = tmp_path / f"{name}.py"
        path.write_text(BUGGY)
        monkeypatch.syspath_prepend(str(tmp_path))
        daifu.install(modules=name, entry="*")
        importlib.invalidate_caches()
        mod = importlib.import_module(name)
        loaded.append((name, path))
        return mod, path

    yield load
    daifu.uninstall()
    for name, path in loaded:
        sys.modules.pop(name, None)
        _registry.forget(str(path))


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_reload_continues_inside_a_new_try_or_if_block(buggy, edit):
    mod, path = buggy(f"wrap_{edit}")
    edited = []

    @daifu.on(ZeroDivisionError)
    def edit_and_reload(crash):
        if edited:
            return None  # the new code's own handling takes any later one
        path.write_text(_corrected(edit))
        edited.append(crash.lineno)
        return daifu.RELOAD

    data = [2, 0, 5, 0, 1]
    with capture() as events:
        result = mod.train(data)
    assert result == _expected(edit, data)
    assert edited == [8]  # y = 10 // x, once: the reload took
    applied = [e for e in events if e["event"] == "patch.applied"]
    assert len(applied) == 1 and not [e for e in events if e["event"] == "patch.rejected"]
    assert mod.train(data) == _expected(edit, data)  # and later calls run the new code


def _map(edit: str):
    old_msrc = ModuleSource(textwrap.dedent(BUGGY), "m.py")
    new_msrc = ModuleSource(textwrap.dedent(_corrected(edit)), "m.py")
    old_fn, new_fn = old_msrc.tree.body[0], new_msrc.tree.body[0]
    stmt = old_fn.body[2].body[1].body[0]  # y = 10 // x
    return map_statement(old_msrc, old_fn, stmt, new_msrc, new_fn)


@pytest.mark.parametrize("edit,expected", [
    ("wrap_enclosing_if", "y = 10 // x"),
    ("wrap_statement", "y = 10 // x"),
    ("wrap_loop_body", "y = 10 // x"),
    ("guard_with_if", "if x:"),  # the new condition runs first
    ("move_into_else", "if x == 0:"),
])
def test_statement_mapping_enters_new_blocks(edit, expected):
    mapped = _map(edit)
    assert not isinstance(mapped, str), mapped
    assert ast.unparse(mapped).splitlines()[0] == expected


def test_a_new_with_around_the_running_statement_is_still_refused():
    # a with block holds its __exit__ on the stack: a call in the middle of
    # it cannot be continued inside a with it never entered
    new = BUGGY.replace('''        if x >= 0:
            y = 10 // x
            total += y
''', '''        with open("/dev/null"):
            if x >= 0:
                y = 10 // x
                total += y
''')
    old_msrc, new_msrc = ModuleSource(BUGGY, "m.py"), ModuleSource(new, "m.py")
    stmt = old_msrc.tree.body[0].body[2].body[1].body[0]
    reason = map_statement(old_msrc, old_msrc.tree.body[0], stmt, new_msrc, new_msrc.tree.body[0])
    assert isinstance(reason, str) and "changed from If to With" in reason


# -- the failing statement inside an except, a finally or a with block, edited -----------

IN_BLOCKS = {
    "except": ('''
import sys

def train(data):
    total = 0
    for x in data:
        try:
            total += {}[x]
        except KeyError as e:
            total += 10 // x
            total += 100 * (sys.exc_info()[1] is e)
    return total
''', lambda data: sum(10 // (x or 1) + 100 for x in data)),
    "finally": ('''
def train(data):
    total = 0
    for x in data:
        try:
            total += 1
        finally:
            total += 10 // x
    return total
''', lambda data: sum(1 + 10 // (x or 1) for x in data)),
    "finally_while_an_exception_passes": ('''
def step(x):
    try:
        if x == 5:
            raise KeyError(x)
        return x
    finally:
        step.log.append(10 // x)

def train(data):
    step.log = []
    total = 0
    for x in data:
        try:
            total += step(x)
        except KeyError:
            total += 100
    return total, step.log
''', lambda data: (sum(100 if x == 5 else x for x in data), [10 // (x or 1) for x in data])),
    "with": ('''
import contextlib

def train(data):
    total = 0
    for x in data:
        with contextlib.nullcontext(x) as v:
            total += 10 // v
    return total
''', lambda data: sum(10 // (x or 1) for x in data)),
}


@pytest.fixture
def blocks(tmp_path, monkeypatch):
    loaded = []

    def load(name: str, source: str, entry: str = "*"):
        path = tmp_path / f"{name}.py"
        path.write_text(source)
        monkeypatch.syspath_prepend(str(tmp_path))
        daifu.install(modules=name, entry=entry)
        importlib.invalidate_caches()
        loaded.append((name, path))
        return importlib.import_module(name), path

    yield load
    daifu.uninstall()
    for name, path in loaded:
        sys.modules.pop(name, None)
        _registry.forget(str(path))


@pytest.mark.parametrize("block", sorted(IN_BLOCKS))
def test_an_edited_statement_inside_an_except_finally_or_with_continues_in_the_new_code(
        blocks, block):
    # the running call goes on in its new code at the edited statement, inside
    # the block it was in (the except's exception still the one handled, a
    # finally's pending exception still raised after it, the with still
    # exited), and returns what the corrected program returns
    source, expected = IN_BLOCKS[block]
    mod, path = blocks(f"block_{block}", source)
    edited = []

    @daifu.on(ZeroDivisionError)
    def edit(crash):
        if edited:
            return None
        path.write_text(source.replace("10 // x", "10 // (x or 1)")
                        .replace("10 // v", "10 // (v or 1)"))
        edited.append(crash.statement)
        return daifu.RELOAD

    data = [2, 0, 5]
    with capture() as events:
        assert mod.train(data) == expected(data)
    assert len(edited) == 1
    applied = [e for e in events if e["event"] == "patch.applied"]
    assert len(applied) == 1 and "continues in the new code" in applied[0]["summary"]
    assert not [e for e in events if e["event"] in ("patch.rejected", "crash.gave_up")]


MODULE_LEVEL = '''
class Config:
    def __init__(self):
        self.n = 3

def lookup(d, k):
    return d[k]

data = {"a": 1}
total = 0
for k in ["a", "b"]:
    total += lookup(data, k)
'''


def test_a_module_level_edit_in_focus_continues_and_unchanged_classes_are_not_reported(
        blocks, tmp_path):
    # the caller in focus is module code (``up`` from the crash): its edited
    # statement was refused ("no function of the running program changed")
    # or, with a class in the file, reported as applied and then the old code
    # ran; and the unchanged class was listed as changed
    from daifu.engine._queue import ReloadPatch

    name = "module_level_edit"
    path = tmp_path / f"{name}.py"
    edited = []

    @daifu.on(KeyError)
    def edit_the_caller(crash):
        if edited:
            return None
        path.write_text(MODULE_LEVEL.replace("total += lookup(data, k)",
                                             "total += data.get(k, 0)"))
        edited.append(crash.function)
        crash.patches.put(ReloadPatch(frame=1, origin="test"))
        return None

    with capture() as events:  # (its module code vaccinated, as a script's is)
        mod, _ = blocks(name, MODULE_LEVEL, entry="*,<module>")
    assert (mod.total, edited) == (1, ["lookup"])
    applied = [e["summary"] for e in events if e["event"] == "patch.applied"]
    assert applied and all("<module>()" in a and "Config" not in a for a in applied), applied


def test_an_unchanged_class_is_not_reported_as_changed(blocks):
    # its body holds vaccinated methods: compared with the new plain body, it
    # always differed ("changed r2.py: Config() -- module code ... keeps its own code")
    source = "class Config:\n    def __init__(self):\n        self.n = 3\n" + BUGGY
    mod, path = blocks("unchanged_class", source)

    @daifu.on(ZeroDivisionError)
    def edit(crash):
        path.write_text(source.replace("10 // x", "10 // (x or 1)"))
        return daifu.RELOAD

    with capture() as events:
        mod.train([2, 0])
    applied = [e["summary"] for e in events if e["event"] == "patch.applied"]
    assert len(applied) == 1 and "train()" in applied[0] and "Config" not in applied[0]
