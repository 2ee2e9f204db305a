"""The engine: rules, patches, events, and never making a crash worse."""

from __future__ import annotations

import json
import sys
import threading
import traceback

import pytest

import daifu
from daifu.engine import ENGINE
from daifu.engine._events import capture as capture_logs

from .support import crashes, vaccinate

SOURCE = '''
import contextlib

def divide_all(xs):
    out = []
    for x in xs:
        out.append(60 // x)
    return out

def scale(v):
    return v * 2

class Model:
    def forward(self, v):
        return v + 1

def uses_helpers(xs, model):
    out = []
    for x in xs:
        out.append(model.forward(scale(x)))
    return out

def with_suppress(xs):
    out = []
    for x in xs:
        with contextlib.suppress(ZeroDivisionError):
            out.append(60 // x)
    return out

def caller_catches(xs):
    try:
        return divide_all(xs)
    except ZeroDivisionError:
        return "handled by caller"

def caller_logs_and_reraises(xs, log):
    try:
        return divide_all(xs)
    except ZeroDivisionError:
        log.append("logged")
        raise

def closure_maker():
    k = 10
    def inner(v):
        return v + k
    return inner
'''


@pytest.fixture
def m():
    return vaccinate(SOURCE, entries=("divide_all", "uses_helpers", "with_suppress"))


def test_rules_run_in_order_and_none_means_not_mine(m):
    calls = []

    @daifu.on(ZeroDivisionError)
    def first(crash):
        calls.append("first")
        return None

    @daifu.on(ArithmeticError)
    def second(crash):
        calls.append("second")
        crash.vars["x"] = 1
        return daifu.RETRY

    @daifu.on(ZeroDivisionError)
    def third(crash):
        calls.append("third")
        return daifu.ABORT

    assert m["divide_all"]([0]) == [60]
    assert calls == ["first", "second"]


def test_rule_type_filter(m):
    @daifu.on(KeyError)
    def never(crash):
        raise AssertionError("not for ZeroDivisionError")

    with crashes(ZeroDivisionError):
        m["divide_all"]([0])


@pytest.mark.parametrize("where,fires", [
    ("divide_all", True), ("divide_*", True), ("other", False),
    ("snippet*.py:7", None), (lambda crash: crash.lineno == 7, True),
])
def test_rule_where_filters(m, where, fires):
    fired = []
    if where == "snippet*.py:7":  # file:line form, with the real file name
        where = f"{m['__file__']}:7"
        fires = True

    @daifu.on(ZeroDivisionError, where=where)
    def rule(crash):
        fired.append(crash.lineno)
        crash.vars["x"] = 3
        return daifu.RETRY

    if fires:
        assert m["divide_all"]([0]) == [20]
        assert fired == [7]
    else:
        with crashes(ZeroDivisionError):
            m["divide_all"]([0])
        assert fired == []


@pytest.mark.daifu_errors
def test_a_rule_that_raises_is_reported_and_the_next_rule_runs(m):
    with capture_logs() as logs:
        @daifu.on(ZeroDivisionError)
        def broken(crash):
            raise RuntimeError("bug in my fix")

        @daifu.on(ZeroDivisionError)
        def good(crash):
            crash.vars["x"] = 2
            return daifu.RETRY

        assert m["divide_all"]([0]) == [30]
    failed = [e for e in logs if e["event"] == "rule.failed"]
    assert len(failed) == 1
    assert "RuntimeError: bug in my fix" in failed[0]["error"]
    assert "bug in my fix" in failed[0]["traceback"]


@pytest.mark.daifu_errors
def test_a_fix_that_raises_leaves_state_intact_and_gives_up_cleanly(m):
    xs = [5, 0, 3]

    @daifu.on(ZeroDivisionError)
    def broken(crash):
        crash.vars["out"].append("partial")  # a mutation before failing
        raise ValueError("oops")

    with capture_logs() as logs, crashes(ZeroDivisionError) as info:
        m["divide_all"](xs)
    assert info.value.__context__ is None  # the original exception, not chained to the fix
    events = [e["event"] for e in logs]
    assert "rule.failed" in events and events[-1] == "crash.gave_up"
    assert xs == [5, 0, 3]


def test_bad_return_value_is_rejected(m):
    with capture_logs() as logs:
        @daifu.on(ZeroDivisionError)
        def confused(crash):
            return "retry"

        with crashes(ZeroDivisionError):
            m["divide_all"]([0])
    rejected = [e for e in logs if e["event"] == "patch.rejected"]
    assert rejected and "not 'retry'" in rejected[0]["reason"]


def test_events_for_a_recovered_crash(m):
    with capture_logs() as logs:
        @daifu.on(ZeroDivisionError)
        def fix(crash):
            crash.exec("x = 6")
            return daifu.RETRY

        assert m["divide_all"]([0]) == [10]
    names = [e["event"] for e in logs]
    assert names == ["crash.intercepted", "patch.applied", "patch.applied", "crash.resumed"]
    intercepted, exec_applied, decision, resumed = logs
    assert intercepted["function"] == "divide_all"
    assert intercepted["statement"] == "out.append(60 // x)"
    assert intercepted["exc_type"] == "ZeroDivisionError"
    assert intercepted["where"].endswith(":7")
    assert exec_applied["kind"] == "exec" and exec_applied["summary"] == "x = 6"
    assert decision["summary"] == "retry"
    assert resumed["action"] == "retry" and resumed["latency_ms"] >= 0


def test_events_for_a_crash_nobody_fixes(m):
    with capture_logs() as logs:
        with crashes(ZeroDivisionError):
            m["divide_all"]([0])
    assert [e["event"] for e in logs] == ["crash.intercepted", "crash.gave_up"]


def test_exec_that_does_not_compile_or_raises(m):
    errors = []

    @daifu.on(ZeroDivisionError)
    def fix(crash):
        for code in ("x = = 1", "x = undefined_name"):
            try:
                crash.exec(code)
            except daifu.PatchError as err:
                errors.append(str(err))
        assert crash.vars["x"] == 0  # nothing changed
        crash.exec("x = 4")
        return daifu.RETRY

    assert m["divide_all"]([0]) == [15]
    assert errors[0].startswith("code does not compile")
    assert errors[1].startswith("code raised NameError")


def test_eval_in_frame(m):
    @daifu.on(ZeroDivisionError)
    def fix(crash):
        assert crash.eval("len(out), x") == (0, 0)
        return daifu.ABORT

    with crashes(ZeroDivisionError):
        m["divide_all"]([0])


def test_vars_refuses_names_that_are_not_variables(m):
    @daifu.on(ZeroDivisionError)
    def fix(crash):
        with crashes(KeyError, match="not a variable of divide_all"):
            crash.vars["nonexistent"] = 1
        crash.vars["x"] = 1
        return daifu.RETRY

    assert m["divide_all"]([0]) == [60]


def test_replace_swaps_code_everywhere(m):
    model = m["Model"]()
    bound = model.forward
    held = [m["scale"]]

    def better_scale(v):
        return v * 3

    def better_forward(self, v):
        return v + 100

    @daifu.on(ZeroDivisionError)
    def unused(crash):
        return None

    daifu.replace(m["scale"], better_scale)
    daifu.replace(m["Model"].forward, better_forward)
    assert held[0](2) == 6 and bound(1) == 101
    assert m["uses_helpers"]([1, 2], model) == [103, 106]


def test_replace_vaccinates_the_new_code_of_a_vaccinated_function(m, tmp_path, monkeypatch):
    fixed_mod = tmp_path / "fixed_impl.py"
    fixed_mod.write_text(
        "def divide_all(xs):\n    out = []\n    for x in xs:\n        out.append(120 // x)\n"
        "    return out\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import fixed_impl

    from daifu.cells import is_vaccinated

    daifu.replace(m["divide_all"], fixed_impl.divide_all)
    assert is_vaccinated(m["divide_all"].__code__)
    assert m["divide_all"]([2]) == [60]


def test_replace_errors_are_clear(m):
    inner = m["closure_maker"]()
    with crashes(daifu.PatchError, match="closes over"):
        daifu.replace(inner, lambda v: v)
    with crashes(daifu.PatchError, match="must be a Python function"):
        daifu.replace(len, lambda v: v)


def test_in_frame_suppress_is_respected(m):
    with capture_logs() as logs:
        assert m["with_suppress"]([1, 0, 2]) == [60, 30]
    assert logs == []


def test_pytest_raises_in_frame_is_respected():
    ns = vaccinate('''
import json

import pytest
def check(xs):
    for x in xs:
        with pytest.raises(ZeroDivisionError):
            1 // x
    return "ok"
''')
    with capture_logs() as logs:
        assert ns["check"]([0, 0]) == "ok"
    assert logs == []


def test_caller_in_a_target_file_that_catches_is_respected():
    ns = vaccinate(SOURCE, entries=("divide_all",))
    with capture_logs() as logs:
        assert ns["caller_catches"]([0]) == "handled by caller"
    assert logs == []


EAFP = '''
import gc, weakref

class Big:
    pass

def lookup(d, k):
    big = Big()  # a local of a frame the exception leaves
    BIGS.append(weakref.ref(big))
    return d[k]

def via(d, k, depth):
    if depth:
        return via(d, k, depth - 1)
    return lookup(d, k)

def loop(n):
    hits = 0
    for i in range(n):
        try:
            via({}, i, 5)
        except KeyError:
            hits += 1
    gc.collect()
    return hits

BIGS = []
'''


def test_an_exception_the_program_catches_is_judged_once_not_at_every_frame(
        monkeypatch, barrier_calls):
    # 7 vaccinated frames: the first barrier finds the handler in loop(); the
    # stubs of the frames between let the exception pass without calling
    # anything (``_fastpath.passing``), and loop()'s stub lets go of it.  The
    # next exceptions take the same route: their first barrier checks it
    # frame by frame (``_fastpath.ROUTES``) and asks the engine nothing
    from daifu.engine import _barrier

    mode, judged, called = barrier_calls
    ns = vaccinate(EAFP, entries=("lookup", "via", "loop"))
    asked = []
    judge = ENGINE.on_exception
    monkeypatch.setattr(ENGINE, "on_exception",
                        lambda *a: asked.append(a[4].f_code.co_name) or judge(*a))
    assert ns["loop"](10) == 10
    assert judged == asked == ["lookup"]
    if mode == "python":  # (the C barrier's calls are not seen from Python)
        assert called == ["lookup"] * 10
    # ... and nothing of it is kept: the frames' locals are freed as without daifu
    assert [r() for r in ns["BIGS"]] == [None] * 10
    assert _barrier.passing[:2] == [None, None]


def test_a_remembered_route_is_checked_before_tracing_is_suspended(barrier_calls):
    # each stub that calls its barrier first calls the quick check
    # (``passing[P_QUICK]``): with daifu's C extension, an exception taking
    # its remembered route is let go there, and the stub neither suspends
    # tracing (``sys.getprofile``/``gettrace`` read, the profiler switched
    # off) nor calls the barrier; without it, the Python barrier checks the
    # route after the suspension
    import sys

    from daifu.cells._cell import P_GETPROFILE
    from daifu.engine import _barrier

    mode, judged, _called = barrier_calls
    suspended = []
    shipped = _barrier.passing[P_GETPROFILE]
    _barrier.passing[P_GETPROFILE] = lambda: suspended.append(1) or sys.getprofile()
    try:
        ns = vaccinate(EAFP, entries=("lookup", "via", "loop"))
        assert ns["loop"](10) == 10
    finally:
        _barrier.passing[P_GETPROFILE] = shipped
    assert judged == ["lookup"]
    assert len(suspended) == (1 if mode == "c" else 10)


ROUTES = '''
Missing = KeyError

def lookup(d, k):
    return d[k]

def caught(d, k):
    try:
        return lookup(d, k)
    except Missing:
        return "caught"

def not_caught(d, k):
    try:
        return lookup(d, k)
    except ValueError:
        return "not this"

def two_sites(d, k, guarded):
    if guarded:
        try:
            return lookup(d, k)
        except Missing:
            return "caught"
    return lookup(d, k)
'''


def test_a_remembered_route_is_taken_only_by_an_exception_that_goes_the_same_way(
        barrier_calls):
    # lookup()'s KeyError is caught by caught() again and again: its route is
    # remembered.  The same cell's KeyError on its way through another
    # caller, or to a handler whose name now holds another class, is a crash
    _mode, judged, _called = barrier_calls
    ns = vaccinate(ROUTES)
    fixed = []

    @daifu.on(KeyError)
    def fix(crash):
        fixed.append(crash.frame.f_back.f_code.co_name)
        crash.vars["d"] = {crash.vars["k"]: "fixed"}
        return daifu.RETRY

    assert [ns["caught"]({}, 1) for _ in range(3)] == ["caught"] * 3
    assert judged == ["lookup"]  # (the first searched; the next two took its route)
    assert ns["not_caught"]({}, 1) == "fixed"
    assert ns["caught"]({}, 1) == "caught"
    ns["Missing"] = ValueError
    assert ns["caught"]({}, 1) == "fixed"
    ns["Missing"] = KeyError
    assert ns["caught"]({}, 1) == "caught"
    assert fixed == ["not_caught", "caught"]
    judged.clear()  # (the last call was searched again: the route is remembered)
    assert [ns["caught"]({}, 1) for _ in range(3)] == ["caught"] * 3
    assert judged == []
    # the same caller, from another call site: not the same way
    assert [ns["two_sites"]({}, 1, True) for _ in range(3)] == ["caught"] * 3
    assert ns["two_sites"]({}, 1, False) == "fixed"
    assert fixed == ["not_caught", "caught", "two_sites"]


TUPLE_AND_WITH = '''
Missing, Other = KeyError, IndexError
exits = []

class Watch:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        exits.append(exc[0])
        return False

def lookup(d, k):
    return d[k]

def watched(d, k):
    with Watch():
        return d[k]

def either(d, k):
    try:
        return lookup(d, k)
    except (Other, Missing):
        return "caught"

def through_with(d, k):
    try:
        return watched(d, k)
    except Missing:
        return "caught"
'''


def test_a_route_to_an_except_tuple_or_through_a_with_is_remembered_and_checked(
        barrier_calls):
    # ``except (Other, Missing):`` -- each name checked again on the route; a
    # ``with`` around the raise -- its ``__exit__`` still sees every exception
    _mode, judged, _called = barrier_calls
    ns = vaccinate(TUPLE_AND_WITH)
    fixed = []

    @daifu.on(KeyError)
    def fix(crash):
        fixed.append(crash.function)
        crash.vars["d"] = {crash.vars["k"]: "fixed"}
        return daifu.RETRY

    assert [ns["either"]({}, 1) for _ in range(4)] == ["caught"] * 4
    assert judged == ["lookup"]  # (the first searched; the next three took its route)
    ns["Other"] = KeyError  # (another name of the tuple rebound: checked too)
    assert ns["either"]({}, 1) == "caught" and judged == ["lookup"] * 2
    ns["Other"], ns["Missing"] = IndexError, ValueError  # (no clause catches it now)
    assert ns["either"]({}, 1) == "fixed" and fixed == ["lookup"]
    ns["Missing"] = KeyError
    # the retry that fixed it is over: the engine is quiet again, and the
    # handled exceptions take their routes (judged once more, to learn it)
    judged.clear()
    assert [ns["either"]({}, 1) for _ in range(3)] == ["caught"] * 3
    assert judged == ["lookup"], judged
    judged.clear()
    assert [ns["through_with"]({}, 1) for _ in range(4)] == ["caught"] * 4
    assert judged == ["watched"], judged
    assert ns["exits"] == [KeyError] * 4  # (the with's __exit__ ran each time)
    ns["Missing"] = ValueError
    assert ns["through_with"]({}, 1) == "fixed" and fixed == ["lookup", "watched"]


THROUGH_C = '''
class Lazy:
    def __getattr__(self, name):
        raise AttributeError(name)

class Proxy:
    def __getattr__(self, name):
        return object.__getattribute__(self, "_" + name)

def probe(a, name):
    return hasattr(a, name)

def fetch(a, name):
    value = None
    value = getattr(a, name)
    return value
'''


@pytest.mark.parametrize("kind", ["Lazy", "Proxy"])
def test_an_exception_left_for_c_code_takes_its_route_and_is_still_judged_above(
        barrier_calls, kind):
    # ``hasattr`` on a ``__getattr__`` that raises: C code catches it.  The
    # first one is searched; the next ones take its route: from a ``raise``
    # (Lazy: nothing can be done at that cell, whoever calls it), or left
    # for C code at ``probe``'s call (Proxy: its statement could be retried;
    # ``probe`` is vaccinated).  Through ``getattr`` without a default, C
    # lets it go: ``fetch`` judges it (a crash there), as before
    _mode, judged, _called = barrier_calls
    ns = vaccinate(THROUGH_C)
    seen = []

    @daifu.on(AttributeError)
    def fix(crash):
        seen.append(crash.function)
        return daifu.SKIP

    a = ns[kind]()
    assert [ns["probe"](a, "x") for _ in range(4)] == [False] * 4
    assert judged == ["__getattr__"], judged
    assert ns["fetch"](a, "x") is None and seen == ["fetch"]
    # (Lazy's route holds at any call site; Proxy's is another site's)
    assert judged == ["__getattr__"] + (["__getattr__"] if kind == "Proxy" else []) + ["fetch"]
    judged.clear()
    assert [ns["probe"](a, "y") for _ in range(3)] == [False] * 3
    # (the retry is over: Proxy's site is searched once more)
    assert judged == ([] if kind == "Lazy" else ["__getattr__"]), judged


MODULE_EAFP = '''
d, hits = {}, 0
for i in range(50):
    try:
        d[i]
    except KeyError:
        hits += 1

class Shadowed:
    KeyError = IndexError  # (the class body's own name: the handler reads it first)
    try:
        {}["x"]
    except KeyError:
        caught = True
    else:
        caught = False
'''


def test_a_module_level_handler_is_tested_by_its_own_stub_as_python_reads_it(barrier_calls):
    # ``except KeyError:`` in module and class bodies reads its name with
    # LOAD_NAME: the stub tests it the same way and calls nothing -- and a
    # class body's own binding of the name is the one that counts
    _mode, judged, _called = barrier_calls
    seen = []

    @daifu.on(KeyError)
    def record(crash):
        seen.append(crash.function)
        return None

    with crashes(KeyError):
        vaccinate(MODULE_EAFP, module_level=True)
    # the loop's 50 KeyErrors: none judged; the class body's KeyError, which
    # its ``except KeyError:`` (IndexError there) lets go, is the crash of
    # the module's ``class`` statement
    # (3.13 with the C barrier: the crash's judge is asked twice)
    assert set(judged) == {"<module>"} and len(judged) < 3 and seen == ["<module>"], \
        (judged, seen)
    ns = vaccinate(MODULE_EAFP.split("class Shadowed")[0], module_level=True)
    assert ns["hits"] == 50


ENDS = '''
class Countdown:
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return self

    def __next__(self):
        if self.n == 0:
            raise StopIteration
        self.n -= 1
        return self.n

def total(k):
    return sum(sum(Countdown(3)) for _ in range(k))
'''


def test_an_iteration_that_ends_asks_no_barrier_anything(barrier_calls):
    # StopIteration from a vaccinated ``__next__`` is never a crash: while
    # the engine is quiet its barrier answers at once (judged: none)
    _mode, judged, _called = barrier_calls
    ns = vaccinate(ENDS)
    assert ns["total"](5) == 15 and judged == []


FIXED_ONCE = '''
def fetch(d, k):
    return d[k]

def deep(n, d, k):
    return fetch(d, k) if n == 0 else deep(n - 1, d, k)

def handled(d, k):
    try:
        return fetch(d, k)
    except KeyError:
        return "caught"
'''


def test_a_retry_that_succeeded_leaves_the_engine_quiet_again():
    # nothing runs when a retried statement succeeds: the retry is known to
    # be over at the next exception the program handles -- after that, the
    # stubs pass handled exceptions on by themselves again (a job with one
    # fixed crash would otherwise judge every later EAFP exception in full)
    from daifu.engine import _fastpath

    ns = vaccinate(FIXED_ONCE)

    @daifu.on(KeyError)
    def repair(crash):
        crash.vars["d"] = {crash.vars["k"]: "fixed"}
        return daifu.RETRY

    assert ns["deep"](5, {}, 1) == "fixed"
    assert ENGINE._pending and not ENGINE.quiet()  # (the retry's entry: its frame is gone)
    assert ns["handled"]({}, 1) == "caught"
    assert not ENGINE._pending and ENGINE.quiet() and _fastpath.passing[2] is True


RERAISED = '''
def flaky(i):
    return {}["missing"]

def with_retries(n):
    last = None
    for i in range(n):
        try:
            return flaky(i)
        except KeyError as e:
            last = e
    raise last

def inner(x):
    return 60 // x

def catcher(x, strict):
    try:
        return inner(x)
    except ZeroDivisionError:
        if strict:
            raise
        return -1

def train(strict):
    x = catcher(0, strict)
    if strict is None:
        x = with_retries(3)
    return x
'''


@pytest.mark.parametrize("strict, where", [(True, ["train"]), (None, ["train"])])
def test_an_exception_caught_then_raised_again_is_a_crash_where_it_goes_on(strict, where):
    # the handler that took it lets it go again -- a conditional bare
    # ``raise``, or ``raise last`` after a retry loop: the barriers above
    # must judge it, not take it for the handled exception it was
    ns = vaccinate(RERAISED, entries=("**",))
    seen = []

    @daifu.on(Exception)
    def record(crash):
        seen.append(crash.function)
        return None

    with crashes(KeyError if strict is None else ZeroDivisionError):
        ns["train"](strict)
    assert seen == where


def test_a_new_exception_at_an_old_ones_address_is_judged_anew():
    # in a loop every exception (and traceback, and frame) is made where the
    # last one was: ids alone would take a crash for the handled exception
    # before it, on its way to the same handler
    from daifu.engine import _guards

    def raising():
        raise KeyError("k")

    def catcher():
        try:
            raising()
        except KeyError as exc:
            return exc, sys._getframe()

    exc, frame = catcher()
    head = exc.__traceback__
    inner = head.tb_next.tb_frame
    mark = _guards._mark
    # a remembered catch whose every id matches, but this exception never left
    # a barrier below: the first barrier it meets looks for itself
    _guards._seen.caught = (KeyError, id(exc), id(frame), frame.f_code, *mark(head.tb_next))
    assert not _guards.caught_above(exc, inner)
    _guards._seen.caught = (KeyError, id(exc), 0, None, *mark(head))
    assert not _guards.caught_above(exc, frame)  # (head == last seen: it has not moved)
    _guards._seen.caught = (ValueError, id(exc), 0, None, *mark(head.tb_next))
    assert not _guards.caught_above(exc, frame)  # another type
    dead = (id(head.tb_next), id(inner), inner.f_code, head.tb_next.tb_lasti + 2)
    _guards._seen.caught = (KeyError, id(exc), 0, None, *dead)
    assert not _guards.caught_above(exc, frame)  # an entry at a dead one's address
    _guards._seen.caught = (KeyError, id(exc), 0, None, *mark(head.tb_next))
    assert _guards.caught_above(exc, frame)  # it travelled here from there
    # at the catching frame's own barrier the memo is used up
    _guards._seen.caught = (KeyError, id(exc), id(frame), frame.f_code, *mark(head.tb_next))
    assert _guards.caught_above(exc, frame) and _guards._seen.caught is None


def test_caller_that_logs_and_reraises_does_not_count_as_handling():
    ns = vaccinate(SOURCE, entries=("divide_all",))

    @daifu.on(ZeroDivisionError)
    def fix(crash):
        crash.vars["x"] = 30
        return daifu.RETRY

    log = []
    assert ns["caller_logs_and_reraises"]([0], log) == [2]
    assert log == []


@pytest.mark.daifu_errors
def test_internal_error_falls_back_to_the_original_exception(m, monkeypatch):
    def explode(*args, **kwargs):
        raise RuntimeError("daifu bug")

    monkeypatch.setattr(ENGINE, "_decide", explode)
    with capture_logs() as logs:
        with crashes(ZeroDivisionError) as info:
            m["divide_all"]([0])
    frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert frames[-1] == "divide_all"
    assert not any("/daifu/" in f.filename for f in traceback.extract_tb(info.value.__traceback__))
    assert "daifu.internal_error" in [e["event"] for e in logs]


@pytest.mark.daifu_errors
def test_barrier_failure_falls_back_to_the_original_exception(m, monkeypatch):
    monkeypatch.setattr(ENGINE, "on_exception", lambda *a: 1 / 0)
    with crashes(ZeroDivisionError) as info:
        m["divide_all"]([0])
    assert "60 // x" in "".join(traceback.format_exception(info.value))


def test_crash_in_a_thread_is_recovered(m):
    @daifu.on(ZeroDivisionError)
    def fix(crash):
        crash.vars["x"] = 60
        return daifu.RETRY

    results = {}

    def worker(n):
        results[n] = m["divide_all"]([n, 0])

    threads = [threading.Thread(target=worker, args=(n,)) for n in (1, 2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {1: [60, 1], 2: [30, 1], 3: [20, 1]}


def test_nested_crash_while_a_rule_runs_is_not_intercepted(m):
    inner = []

    @daifu.on(ZeroDivisionError)
    def fix(crash):
        try:
            m["divide_all"]([0])  # crashes again, inside the rule
        except ZeroDivisionError:
            inner.append("raised normally")
        crash.vars["x"] = 1
        return daifu.RETRY

    assert m["divide_all"]([0]) == [60]
    assert inner == ["raised normally"]


def test_given_up_exception_is_not_intercepted_again_by_outer_frames():
    ns = vaccinate('''
def inner(xs):
    for x in xs:
        1 // x

def outer(batches):
    for b in batches:
        inner(b)
''')
    seen = []

    @daifu.on(ZeroDivisionError)
    def give_up(crash):
        seen.append(crash.function)
        return daifu.ABORT

    with crashes(ZeroDivisionError):
        ns["outer"]([[1], [0]])
    assert seen == ["inner"]


def test_unfixed_crash_passes_to_a_vaccinated_caller():
    ns = vaccinate('''
def inner(xs):
    for x in xs:
        1 // x

def outer(batches):
    done = []
    for b in batches:
        inner(b)
        done.append(b)
    return done
''')

    @daifu.on(ZeroDivisionError, where="outer")
    def skip_batch(crash):
        return daifu.SKIP

    with capture_logs() as logs:
        assert ns["outer"]([[1], [0], [2]]) == [[1], [0], [2]]
    assert [e["event"] for e in logs][:4] == [
        "crash.intercepted", "crash.passed", "crash.intercepted", "patch.applied"]


REPLACED_RUNNING = '''
calls = []

def scale(v, k):
    calls.append(("scale", v))
    return v / k            # the bug: k is 0 for some items

def step(v, k):
    return scale(v, k) + 1

def train(items):
    out = []
    for v, k in items:
        out.append(step(v, k))
    return out
'''


def test_replace_of_the_function_that_raised_then_retry_reruns_its_call_in_the_caller():
    ns = vaccinate(REPLACED_RUNNING)

    def safe_scale(v, k):
        calls.append(("safe", v))  # noqa: F821 (runs with scale's globals)
        return v / (k or 1)

    @daifu.on(ZeroDivisionError)
    def fix(crash):
        fix.seen.append((crash.function, crash.attempt))
        daifu.replace(crash.globals["scale"], safe_scale)
        return daifu.RETRY

    fix.seen = []
    with capture_logs() as logs:
        assert ns["train"]([(4, 2), (6, 0), (8, 4)]) == [3.0, 7.0, 3.0]
    # one crash, fixed once: the retry called step -> scale anew with the new code
    assert fix.seen == [("scale", 1)]
    assert ns["calls"] == [("scale", 4), ("scale", 6), ("safe", 6), ("safe", 8)]
    applied = [e for e in logs if e["event"] == "patch.applied" and e["kind"] == "decision"]
    assert "re-executed in caller frame 1 (step)" in applied[0]["summary"]


def test_replace_of_a_caller_on_the_crashed_stack_then_retry_reruns_the_callers_call():
    ns = vaccinate(REPLACED_RUNNING)

    def safe_step(v, k):
        return scale(v, k or 1) + 1  # noqa: F821 (scale: the replaced function's global)

    @daifu.on(ZeroDivisionError)
    def fix(crash):
        assert crash.function == "scale"
        daifu.replace(crash.globals["step"], safe_step)
        return daifu.RETRY

    assert ns["train"]([(6, 0), (8, 4)]) == [7.0, 3.0]
    assert ns["calls"] == [("scale", 6), ("scale", 6), ("scale", 8)]


def test_a_replacement_that_fails_the_same_way_is_given_up_after_max_attempts():
    ns = vaccinate(REPLACED_RUNNING)

    def still_bad(v, k):
        return v / k

    @daifu.on(ZeroDivisionError)
    def fix(crash):
        fix.n += 1
        daifu.replace(crash.globals["scale"], still_bad)
        return daifu.RETRY

    fix.n = 0
    ENGINE.max_attempts = 2
    with crashes(ZeroDivisionError):
        ns["train"]([(6, 0)])
    assert fix.n == ENGINE.max_attempts + 1


def test_replace_while_running_with_no_vaccinated_caller_refuses_the_retry():
    ns = vaccinate(REPLACED_RUNNING, entries=("scale",))

    def zero(v, k):
        return 0.0

    @daifu.on(ZeroDivisionError)
    def fix(crash):
        daifu.replace(crash.globals["scale"], zero)
        return daifu.RETRY

    with capture_logs() as logs, crashes(ZeroDivisionError):
        ns["train"]([(6, 0)])
    rejected = [e for e in logs if e["event"] == "patch.rejected"]
    assert "none of its callers is vaccinated" in rejected[0]["reason"]
    assert ns["train"]([(6, 2)]) == [1.0]  # the replacement is installed for later calls


def test_a_multi_line_statement_is_the_crash_statement_whole():
    ns = vaccinate('''
def f(xs):
    total = sum(
        10 // x
        for x in xs)
    return total
''')

    @daifu.on(ZeroDivisionError)
    def fix(crash):  # a rule that matches on the statement's later lines fires
        if "for x in xs" not in crash.statement:
            return None
        fix.seen = crash.statement
        return daifu.ABORT

    fix.seen = None
    with crashes(ZeroDivisionError):
        ns["f"]([0])
    assert fix.seen == "total = sum(\n        10 // x\n        for x in xs)"


def test_a_crash_nobody_is_asked_about_says_how_to_make_it_wait(m):
    with capture_logs() as logs, crashes(ZeroDivisionError):
        m["divide_all"]([0])
    reason = next(e["reason"] for e in logs if e["event"] == "crash.gave_up")
    assert reason.startswith("no fix available")
    assert "run with --wait SECONDS (DAIFU_WAIT), then: python -m daifu attach PID" in reason


def test_an_event_emitted_while_the_logger_is_built_is_written_after_it(monkeypatch):
    # building daifu's logger imports structlog, which imports rich, which
    # imports attr: with --modules attr, vaccinating attr emitted an event whose
    # write waited for the lock the build held in the same thread -- the job
    # hung at its first event (attrs' suite, vaccinated, in CI)
    import io
    import threading

    from daifu.engine import _events
    from daifu.engine.persist._journal import JournalOpened

    stream = io.StringIO()
    _events.configure(stream, "info", json=True)
    real_build = _events._build

    def build_that_imports_a_vaccinated_module(sink):
        _events.emit(JournalOpened(path="inner"))
        return real_build(sink)

    monkeypatch.setattr(_events, "_build", build_that_imports_a_vaccinated_module)
    done = threading.Event()

    def first_event():
        _events.emit(JournalOpened(path="outer"))
        done.set()

    thread = threading.Thread(target=first_event, daemon=True)
    thread.start()
    assert done.wait(10), "the first event's write hung"
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [line["path"] for line in lines] == ["outer", "inner"]
    _events.configure()


def test_the_preload_waits_while_daifu_code_called_by_the_program_runs():
    # the preload's imports run on the main thread between two instructions:
    # inside daifu's own code (an event being written, a barrier) they could
    # wait for a lock that very thread holds -- they wait for a later moment
    from daifu.engine import _events, _preload

    assert not _preload._busy(sys._getframe())  # the program's own code
    seen = []
    _events._state.listeners.append(lambda ev: seen.append(_preload._busy(sys._getframe())))
    try:
        from daifu.engine.persist._journal import JournalOpened

        _events.emit(JournalOpened(path="x"))
    finally:
        _events._state.listeners.pop()
    assert seen == [True]


def test_the_preload_compiles_what_the_engine_makes_at_a_crash(tmp_path):
    # a record class compiles its __init__ at its first instance (~0.1 ms):
    # at the first crash that was five of them between the rule's answer and
    # the retried statement; the preload compiles them before any crash
    import subprocess

    probe = tmp_path / "probe.py"
    probe.write_text(
        "from daifu import _record\n"
        "from daifu.engine import _decision, _engine, _queue, _preload, _repeats, _rules\n"
        "mods = (_decision, _engine, _queue, _repeats, _rules)\n"
        "lazy = lambda: sorted(c.__qualname__ for m in mods for c in vars(m).values()\n"
        "    if isinstance(c, type) and c.__module__ == m.__name__\n"
        "    and vars(c).get('__init__') is _record._init)\n"
        "before = lazy()\n"
        "_preload._imports()\n"
        "print(bool(before), lazy(), _queue.Applied.__init__.__qualname__)\n")
    out = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.split("\n")[0] == "True [] Applied.__init__", out.stderr
