"""Armed code (``cells._armed``): a function is armed at import -- its
original instructions and one trap per group of cells -- and vaccinated at
its first exception, the frame moved onto the vaccinated code without
leaving it.  What a user relies on: the same recoveries in the same frame,
the program's own exceptions handled as without daifu, and starts that do
not pay for a full rewrite of code that never fails."""

from __future__ import annotations

import importlib
import inspect
import os
import subprocess
import sys
import types
import warnings

import pytest

import daifu
from daifu.cells import Selection, backend, cells_of, options, original_code, vaccinate_source
from daifu.cells._cell import info_of

from .support import vaccinate


def _codes(code: types.CodeType):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


@pytest.fixture
def lenient():
    strict, options.strict = options.strict, False
    yield
    options.strict = strict


#: real modules whose every function is armed, then completed: the two codes
#: must agree below the traps (``_readback.trap_path`` relies on it)
CORPUS = ["json.decoder", "textwrap", "argparse", "dataclasses", "shlex", "fractions",
          "difflib", "inspect", "ast", "tokenize"]


@pytest.mark.parametrize("name", CORPUS)
def test_armed_code_has_the_vaccinated_codes_instructions_before_its_traps(name, lenient):
    module = importlib.import_module(name)
    path = module.__file__
    with open(path, "rb") as f:
        source = f.read()
    code, report = vaccinate_source(source, path, Selection(("**",), True, True, True,
                                                            armed=True), module=name)
    back, _ = backend()
    armed = [c for c in _codes(code) if (i := info_of(c)) is not None and i.armed]
    assert len(armed) >= 10
    for a in armed:
        info = info_of(a)
        assert not info.cells  # (nothing made before it is needed)
        full = cells_of(a).upgraded  # (``cells_of`` makes it: the rewrite)
        assert full is not None, info.refused
        end = back.armed_end(a)
        assert end and a.co_code[:end] == full.co_code[:end], a.co_qualname
        # the same positions (tracebacks of either code read the same lines)
        assert list(a.co_positions())[:end // 2] == list(full.co_positions())[:end // 2]
        assert full.co_stacksize <= a.co_stacksize and full.co_nlocals == a.co_nlocals
        assert original_code(a) is original_code(full) is info.original
        # the armed code is small: the original and a trap per group
        assert len(a.co_code) < len(full.co_code)
        # every cell's instructions lead to a trap of its group, laid out
        # as the cell's stub in the vaccinated code
        ranges = [r for r in back.cell_ranges(full) if not r[3]]
        assert ranges
        for start, stop, cell, _ in ranges:
            assert stop <= end
            for offset in (start, stop - 2):
                path = back.trap_path(a, full, offset // 2)
                assert path is not None and path[0] == info.ref(cell), (a.co_qualname, offset)


SOURCE = """
import sys

def step(log, x):
    me = sys._getframe()
    log.append(("before", x))
    y = 10 // x
    log.append(("after", y))
    return y, me is sys._getframe()

def handled_here(d, k):
    try:
        return d[k]
    except KeyError:
        return "missing"

def middle(d, k):
    return d[k]

def handled_above(d, k):
    try:
        return middle(d, k)
    except KeyError:
        return "caught above"

class Lazy:
    def __getattr__(self, name):
        raise AttributeError(name)

def probe(obj):
    return hasattr(obj, "x"), getattr(obj, "y", "default")

def down(n):
    if n == 0:
        return 10 // n
    return down(n - 1) + 1

def gen(n):
    for i in range(n):
        yield 10 // i
"""


@pytest.fixture
def m():
    return vaccinate(SOURCE, armed=True)


def _armed(fn) -> bool:
    info = info_of(fn.__code__)
    return info is not None and info.armed and fn.__code__ is not info.upgraded


def test_a_crash_is_recovered_in_the_frame_that_raised_it(m):
    assert _armed(m["step"])

    @daifu.on(ZeroDivisionError, where="step")
    def fix(crash):
        crash.vars["x"] = 5
        return daifu.RETRY

    log: list = []
    assert m["step"](log, 0) == (2, True)  # the same frame, before and after
    # the statements before the failing one ran once; the failing one again
    assert log == [("before", 0), ("after", 2)]
    assert not _armed(m["step"])  # its next calls run the vaccinated code
    log.clear()
    assert m["step"](log, 0) == (2, True)


def test_the_programs_own_exceptions_are_handled_as_without_daifu(m):
    for name in ("handled_here", "middle", "handled_above", "probe"):
        assert _armed(m[name])
    assert m["handled_here"]({}, "k") == "missing"
    assert m["handled_above"]({}, "k") == "caught above"
    assert m["probe"](m["Lazy"]()) == (False, "default")
    with pytest.raises(KeyError):  # (a handler in the test: the program's own)
        m["middle"]({}, "k")


def test_a_function_with_more_names_than_a_byte_holds_is_armed_and_recovers():
    """The traps' own names and constants come after a big code object's
    (here 300 globals): past index 255, their instructions are laid out
    with ``EXTENDED_ARG`` after the original bytes, which stay as they are."""
    names = [f"g{i}" for i in range(300)]
    source = "".join(f"{n} = {i}\n" for i, n in enumerate(names)) + (
        "def total(d):\n    s = " + " + ".join(names) + "\n    return s // d, s\n")
    m = vaccinate(source, armed=True)
    fn = m["total"]
    assert _armed(fn) and len(fn.__code__.co_names) > 255
    original = info_of(fn.__code__).original
    assert fn.__code__.co_code[:len(original.co_code)] == original.co_code
    s = sum(range(300))

    @daifu.on(ZeroDivisionError, where="total")
    def fix(crash):
        crash.vars["d"] = 2
        return daifu.RETRY

    assert m["total"](0) == (s // 2, s)
    assert not _armed(m["total"])


def test_a_function_raising_for_its_callers_again_and_again_gets_vaccinated_code(
        m, monkeypatch):
    """Each exception the program handles makes the armed raiser's trap ask
    whether it is a crash (a Python call); after 16 the function gets its
    vaccinated code, whose handled exceptions take the remembered routes."""
    from daifu.engine import _barrier

    monkeypatch.setattr(_barrier, "_PROFILERS", ())  # (pytest-benchmark loads cProfile)
    fn = m["middle"]
    info = info_of(fn.__code__)
    for _ in range(_barrier.HANDLED_BEFORE_UPGRADE - 1):
        assert m["handled_above"]({}, "k") == "caught above"
    assert _armed(fn)
    assert m["handled_above"]({}, "k") == "caught above"
    assert fn.__code__ is info.upgraded is not None
    assert m["handled_above"]({"k": 1}, "k") == 1


def test_under_a_profiler_a_function_keeps_one_code_object(m):
    """cProfile counts calls by code object: a function given its vaccinated
    code mid-run would be counted as two functions of one name, pstats
    keeping one of them.  Under a profiler it stays armed."""
    import cProfile
    import pstats

    fn = m["middle"]

    def run():
        return [m["handled_above"]({}, "k") for _ in range(40)]

    prof = cProfile.Profile()
    assert prof.runcall(run) == ["caught above"] * 40
    assert _armed(fn)
    calls = {k[2]: v[1] for k, v in pstats.Stats(prof).stats.items()
             if k[0] == fn.__code__.co_filename}
    assert calls["middle"] == calls["handled_above"] == 40


def test_an_armed_module_keeps_no_parsed_tree_and_parses_again_at_a_crash(m):
    """A module's syntax tree is ~4 KB a statement: armed code needs it
    only at a crash (as code from the cache, which was never parsed)."""
    from daifu.cells import _registry

    loaded = _registry.get(m["step"].__code__.co_filename)
    assert loaded is not None and loaded._msrc is None

    @daifu.on(ZeroDivisionError, where="step")
    def fix(crash):
        crash.vars["x"] = 5
        return daifu.RETRY

    assert m["step"]([], 0) == (2, True)
    assert loaded._msrc is not None  # (parsed at the crash, from the text it ran)


def test_a_recursive_function_recovers_in_its_innermost_frame(m):
    seen = []

    @daifu.on(ZeroDivisionError, where="down")
    def fix(crash):
        seen.append((crash.vars["n"], crash.attempt))
        crash.vars["n"] = 5  # (the innermost frame: n == 0)
        return daifu.RETRY

    assert m["down"](3) == 2 + 3
    assert seen == [(0, 1)]


def test_a_generator_is_vaccinated_at_import(m):
    info = info_of(m["gen"].__code__)
    assert info is not None and not info.armed and info.cells

    @daifu.on(ZeroDivisionError, where="gen")
    def fix(crash):
        return daifu.CONTINUE

    assert list(m["gen"](3)) == [10, 5]


def test_the_engine_sees_an_armed_callers_cells(m):
    """The walk over callers asks armed code for its cells: made then."""
    code = m["handled_above"].__code__
    info = cells_of(code)
    assert info is not None and info.cells and info.upgraded is not None
    assert m["handled_above"]({}, "k") == "caught above"


RUNNER = """
import sys
calls = []
def traced(frame, event, arg):
    if event == "call":
        calls.append(frame.f_code.co_filename)
    return None

def work(xs):
    total = 0
    for x in xs:
        total += 100 // x
    return total

def once(x):
    y = [x]
    z = y[0] // x
    return z

sys.settrace(traced)
print(work([1, 0, 4]), once(0))
sys.settrace(None)
print(sorted({c.rsplit("/", 1)[-1] for c in calls}))
print(work.__code__ is once.__code__)
"""

FIXES = """
import daifu
@daifu.on(ZeroDivisionError)
def fix(crash):
    crash.vars["x"] = 2
    return daifu.RETRY
"""


def _run(tmp_path, *args, env=None):
    script = tmp_path / "prog.py"
    script.write_text(RUNNER)
    (tmp_path / "fixes.py").write_text(FIXES)
    env = {**os.environ, "DAIFU_CACHE": str(tmp_path / "cache"), **(env or {"DAIFU_ARM": "1"})}
    out = subprocess.run([sys.executable, "-m", "daifu", "--fixes", str(tmp_path / "fixes.py"),
                          *args, str(script)], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.splitlines()


def test_recovered_by_the_runner_first_start_and_from_the_code_cache(tmp_path):
    first = _run(tmp_path, "--arm")
    # the tracer saw the program's calls only: no frame of daifu's
    assert first == ["175 0", "['prog.py']", "False"]
    assert os.listdir(tmp_path / "cache")
    assert _run(tmp_path) == first  # (armed code from the cache)
    assert _run(tmp_path, env={"DAIFU_ARM": "0"}) == first
    assert _run(tmp_path, env={"DAIFU_ARM": "1"}) == first


WARMED = """
import sys, time
from daifu.cells._cell import info_of
from daifu.cells._rewrite import _assemble
from daifu.engine import _preload

def work(rows):
    total = 0
    for row in rows:
        total += 10 // row
    return total

def main():
    global BEFORE
    end = time.monotonic() + 30
    while not _preload._state.done.is_set() and time.monotonic() < end:
        pass  # (the preload runs on this thread, between two instructions)
    BEFORE = len(_assemble._TEMPLATES)
    # main (running) was made vaccinated code ahead of a crash; work was not
    print(info_of(sys._getframe().f_code).upgraded is not None,
          info_of(work.__code__).upgraded is not None, flush=True)
    print(work([1, 0, 5]))

main()
"""

WARMED_FIX = """
import daifu
from daifu.cells import code_infos
from daifu.cells._rewrite import _assemble

@daifu.on(ZeroDivisionError)
def fix(crash):
    import __main__
    # the armed function was rewritten in full: with no template of its own
    print(len(_assemble._TEMPLATES) - __main__.BEFORE,
          sorted({i.filename for i in code_infos()} - {__main__.__file__}))
    crash.vars["row"] = 2
    return daifu.RETRY
"""


def test_the_preload_makes_what_an_armed_functions_first_crash_rewrites_with(tmp_path):
    # armed code's first crash rewrites its function in full; the first
    # rewrite of a process built the stubs' templates then (~2 ms at the
    # crash): the preload rewrites a sample once instead, and forgets it;
    # and it makes the vaccinated code of the armed functions running then
    # (1 s after start-up: main is running by then, on a loaded machine too)
    (tmp_path / "prog.py").write_text(WARMED)
    (tmp_path / "fix.py").write_text(WARMED_FIX)
    out = subprocess.run([sys.executable, "-m", "daifu", "--fixes", "fix.py", "prog.py"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "DAIFU_PRELOAD": "1", "DAIFU_CONSOLE": "0",
                              "DAIFU_CACHE": "0"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines() == ["True False", "0 []", "17"]


PROFILED = """
import cProfile, pstats, time
from daifu.engine import _preload

def main():
    end = time.monotonic() + 30
    while not _preload._state.done.is_set() and time.monotonic() < end:
        pass

profile = cProfile.Profile()
profile.runcall(main)
print(sorted({f[0].rsplit("daifu/", 1)[-1] for f in pstats.Stats(profile).stats
              if "/daifu/cells/" in f[0]}))
"""


def test_under_a_profiler_the_preload_rewrites_nothing_ahead(tmp_path):
    # (3.12+: cProfile is a sys.monitoring tool, which sees daifu's Python
    # run by the preload; the warm-up and the running functions' vaccinated
    # code are left to the first crash then)
    (tmp_path / "prog.py").write_text(PROFILED)
    out = subprocess.run([sys.executable, "-m", "daifu", "prog.py"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "DAIFU_PRELOAD": "0.2", "DAIFU_CONSOLE": "0",
                              "DAIFU_CACHE": "0"})
    assert out.returncode == 0, out.stderr[-3000:]
    seen = out.stdout.strip()  # (the imports it runs are seen, as documented)
    for rewrite in ("_rewrite/_core.py", "_rewrite/_emit.py", "_rewrite/_assemble.py",
                    "_armed.py"):
        assert rewrite not in seen, seen


def test_the_rewrites_warm_up_never_raises_and_keeps_nothing(monkeypatch):
    # (the preload goes on after it: the imports a crash needs, the running
    # functions' vaccinated code)
    from daifu.cells import code_infos
    from daifu.cells._rewrite import _core

    def broken(*args, **kwargs):
        raise _core.Unsupported("not on this version")

    for rewrite in (_core.rewrite, broken):
        monkeypatch.setattr(_core, "rewrite", rewrite)
        _core.warm()
        assert not [i for i in code_infos() if i.filename.startswith("<daifu")]


def test_code_made_ahead_of_a_crash_that_cannot_be_made_warns_only_at_a_crash(m, monkeypatch):
    # the preload makes the vaccinated code of the functions running then;
    # one that cannot be made must not warn there (it may never fail), nor
    # be given up: the crash tries again and says why
    from daifu.cells import _armed, complete_running

    code = m["step"].__code__
    info = info_of(code)
    calls = []

    def refuse(info, armed):
        calls.append(info.qualname)
        raise _armed.backend()[0].Unsupported("not today")

    monkeypatch.setattr(_armed, "_rewrite", refuse)
    frame = types.SimpleNamespace(f_code=code, f_back=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (a warning would raise here)
        complete_running(frame)
    assert calls == ["step"] and info.upgraded is None and info.refused is None
    with pytest.warns(daifu.NotVaccinatedWarning, match="not today"):
        assert _armed.complete(info, code) is None
    assert calls == ["step", "step"] and info.refused == "not today"
    monkeypatch.undo()
    complete_running(frame)  # (given up at the crash: not tried again)
    assert info.upgraded is None


def test_armed_code_keeps_its_signature_and_lines(m):
    fn = m["step"]
    original = info_of(fn.__code__).original
    assert inspect.signature(fn) == inspect.signature(types.FunctionType(original, {}))
    lines = {line for _, _, line in fn.__code__.co_lines() if line is not None}
    assert lines == {line for _, _, line in original.co_lines() if line is not None}


def test_strict_mode_rewrites_everything_at_import():
    assert options.strict  # (the tests' default: conftest)
    code, _ = vaccinate_source("def f(x):\n    return 1 // x\n", "/daifu-tests/strict.py",
                               Selection(("**",), armed=True), module="strict")
    f = next(c for c in code.co_consts if isinstance(c, types.CodeType))
    info = info_of(f)
    assert info is not None and not info.armed and info.cells


def _shape(code: types.CodeType) -> tuple:
    import dis

    consts = tuple("mark" if type(c) is tuple and c[:1] == ("daifu.armed",) else
                   ("cell", c[2]) if type(c) is tuple and c[:1] == ("daifu.cell",) else
                   c.co_qualname if isinstance(c, types.CodeType) else c
                   for c in code.co_consts)
    return (code.co_code, consts, code.co_names, code.co_stacksize,
            [tuple(e) for e in dis._parse_exception_table(code)], list(code.co_positions()))


@pytest.mark.parametrize("name", ["argparse", "difflib"])
def test_arming_without_reencoding_the_original_is_exact(name, lenient, monkeypatch):
    """Where nothing is inserted among the original instructions, armed code
    is the original's bytes and location table with the traps appended
    (``_assemble.append``): the same code the general assembly makes."""
    from daifu.cells._rewrite import _core

    module = importlib.import_module(name)
    with open(module.__file__, "rb") as f:
        source = f.read()
    selection = Selection(("**",), True, True, True, armed=True)
    fast, _ = vaccinate_source(source, module.__file__, selection, module=name)
    monkeypatch.setattr(_core, "append", lambda *args: None)
    slow, _ = vaccinate_source(source, module.__file__, selection, module=name)
    pairs = list(zip(_codes(fast), _codes(slow)))
    assert len(pairs) > 20
    for a, b in pairs:
        assert _shape(a) == _shape(b), a.co_qualname
