"""Regression tests for daifu's central promises on programs nobody wrote for
daifu: reload installs the right code, nothing is kept alive that the program
freed, the program's own handling is respected, tracers and the program's
logging do not see daifu.  Each test is named after the bug it pins."""

from __future__ import annotations

import gc
import sys
import textwrap
import weakref

import pytest

import daifu
from daifu import cells as _registry
from daifu.engine import ENGINE
from daifu.engine._events import capture

from .support import crashes, run_daifu, vaccinate

# -- reload ------------------------------------------------------------------------------

NANOGPT_SHAPED = '''
def GPTConfig(**kw):
    return kw

model_args = dict(n_layer=2)
config = GPTConfig(**model_args)


def main():
    return "main"


def train(data):
    total = 0
    for x in data:
        total += 10 // x
    return total
'''


@pytest.fixture
def reload_module(tmp_path, monkeypatch):
    def load(source: str, name: str, entry: str = "*"):
        path = tmp_path / f"{name}.py"
        path.write_text(textwrap.dedent(source))
        monkeypatch.syspath_prepend(str(tmp_path))
        daifu.install(modules=name, entry=entry)
        __import__(name)
        loaded.append((name, path))
        return sys.modules[name], path

    loaded: list = []
    yield load
    daifu.uninstall()
    for name, path in loaded:
        sys.modules.pop(name, None)
        _registry.forget(str(path))


def test_reload_pairs_functions_by_source_not_by_constant_position(reload_module):
    # a module-level f(**kw) call before the defs makes the rewrite of the
    # module's code (a script's, here any module's) reorder its constants;
    # pairing by position gave train() the code of main()
    mod, path = reload_module(NANOGPT_SHAPED, "nanogpt_shaped", entry="*,<module>")
    path.write_text(path.read_text().replace("10 // x", "10 // (x or 1)"))

    @daifu.on(ZeroDivisionError)
    def reload_now(crash):
        return daifu.RELOAD

    with capture() as events:
        assert mod.train([1, 0, 2]) == 10 + 10 + 5
    assert mod.main() == "main"
    summary = next(e["summary"] for e in events if e["event"] == "patch.applied")
    assert "changed  nanogpt_shaped.py: train()" in summary
    assert "removed" not in summary and "main()" not in summary


def test_reload_that_changes_nothing_is_rejected_and_does_not_burn_retries(reload_module):
    mod, _ = reload_module(NANOGPT_SHAPED, "nothing_changed")
    answers = []

    @daifu.on(ZeroDivisionError)
    def reload_then_skip(crash):
        if not answers:
            answers.append("reload")
            return daifu.RELOAD
        answers.append("skip")
        return daifu.SKIP

    with capture() as events:
        # the reload is rejected (nothing was edited): no retry runs in the
        # unchanged code, and the crash gives up at its first attempt
        with crashes(ZeroDivisionError):
            mod.train([0])
    rejected = [e for e in events if e["event"] == "patch.rejected"]
    assert len(rejected) == 1 and "nothing was changed" in rejected[0]["reason"]
    assert answers == ["reload"]
    assert [e["attempt"] for e in events if e["event"] == "crash.intercepted"] == [1]
    assert not [e for e in events if e["event"] == "patch.applied"]


MODULE_LEVEL_SCRIPT = '''
import daifu

@daifu.on(ZeroDivisionError)
def fix(crash):
    src = open(__file__).read().replace("10 // d\\n", "10 // (d or 1)\\n")
    open(__file__, "w").write(src)
    return daifu.RELOAD

data = [1, 0, 2]
total = 0
for d in data:
    total += 10 // d
print("total", total)
'''


def test_reload_at_a_crash_in_module_level_code_continues_in_the_new_code(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(MODULE_LEVEL_SCRIPT)
    proc = run_daifu([script], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "total 25"
    assert "continues in the new code at line 13" in proc.stderr


# -- memory --------------------------------------------------------------------------


def test_a_recovered_crash_does_not_keep_the_frames_variables_alive():
    # reading frame.f_locals (3.11) left a snapshot dict on the frame: the
    # crashed step's batch stayed alive until the function returned
    ns = vaccinate('''
        import gc, weakref
        class Batch:
            pass
        def train(n, refs):
            alive = []
            for i in range(n):
                batch = Batch()
                refs.append(weakref.ref(batch))
                if i == 1:
                    alive.append(1 // 0)
                del batch
                gc.collect()
                alive.append(sum(r() is not None for r in refs))
            return alive
    ''')

    @daifu.on(ZeroDivisionError)
    def skip(crash):
        assert crash.vars["i"] == 1 and "batch" in crash.vars  # read, and written below
        crash.vars["i"] = 1
        return daifu.SKIP

    assert ns["train"](4, []) == [0, 0, 0, 0]


def test_a_handled_exception_does_not_keep_the_callers_locals_alive():
    # CPython's test_exceptions.testExceptionCleanupState: evaluating the
    # caller's `except MyException` read the caller's f_locals, and the
    # snapshot kept `obj` alive after the caller set it to None
    ns = vaccinate('''
        import gc, weakref

        def check():
            class MyException(Exception):  # a local: the clause reads the frame
                def __init__(self, obj):
                    self.obj = obj

            class MyObj:
                pass

            def inner_raising_func():
                local_ref = obj
                raise MyException(obj)

            obj = MyObj()
            wr = weakref.ref(obj)
            try:
                inner_raising_func()
            except MyException:
                pass
            obj = None
            gc.collect()
            return wr()
    ''')
    assert ns["check"]() is None


STEP = '''
    def step(payload):
        data = payload
        result = data.missing
        return result
'''


def _payloads():
    refs = []

    class Payload:
        pass

    def make():
        p = Payload()
        refs.append(weakref.ref(p))
        return p

    return refs, make


def test_give_ups_do_not_keep_exceptions_and_their_frames_alive():
    # the engine remembered the last 32 given-up exceptions with their
    # tracebacks: 40 steps of big tensors caught by a library kept 32 alive
    ns = vaccinate(STEP)
    refs, make = _payloads()

    @daifu.on(AttributeError)
    def decline(crash):
        return None

    caught = 0
    for _ in range(40):  # "the library": its catch-all reports, it does not fix
        try:
            ns["step"](make())
        except Exception:
            caught += 1
    gc.collect()
    assert caught == 40
    assert ENGINE.stats["gave_up"] == 40
    assert sum(r() is not None for r in refs) == 0


def test_a_new_exception_at_a_recycled_address_is_a_new_crash():
    # give-ups are remembered by address: the same failure again (whose
    # exception, traceback and frame reuse the freed addresses) must not be
    # taken for the exception given up before
    ns = vaccinate(STEP)
    refs, make = _payloads()
    asked = []

    @daifu.on(AttributeError)
    def abort(crash):
        asked.append(crash.attempt)
        return daifu.ABORT

    for _ in range(50):
        try:
            ns["step"](make())
        except Exception:  # a library's catch-all: the exception is still a crash
            pass
    assert len(asked) == 50


def test_more_than_32_give_ups_in_flight_are_all_remembered():
    # more than 32 exceptions given up on at once evicted each other: the
    # rules were asked again for an exception a rule had aborted
    ns = vaccinate('''
        def fail(k):
            for _ in range(1):
                return {}[k]

        def middle(k, hook):
            try:
                fail(k)
            finally:
                hook(k)

        def outer(k, hook):
            for _ in range(1):
                middle(k, hook)
    ''')
    asked = []

    @daifu.on(KeyError)
    def abort(crash):
        asked.append(crash.function)
        return daifu.ABORT

    def hook(k):  # while KeyError(k) is in flight, k more are given up
        if k > 0:
            try:
                ns["outer"](k - 1, hook)
            except Exception:  # a catch-all: each is still a crash
                pass

    depth = 40
    with crashes(KeyError):
        ns["outer"](depth, hook)
    assert asked == ["fail"] * (depth + 1)


# -- the program's own handling ------------------------------------------------------


def test_an_exception_handled_more_than_512_frames_up_is_not_a_crash():
    ns = vaccinate('''
        def down(n):
            for _ in range(1):
                if n == 0:
                    return {}["missing"]
                return down(n - 1)

        def top(n):
            try:
                return down(n)
            except KeyError:
                return "handled at the top"
    ''')
    asked = []

    @daifu.on(KeyError)
    def rule(crash):
        asked.append(crash.function)

    assert ns["top"](600) == "handled at the top"
    assert asked == []


ASYNC_PROGRAM = '''
    import asyncio

    def compute(d):
        total = 0
        for i in range(3):
            total += 10 // d
        return total

    async def worker(d):
        return compute(d)

    async def awaits_a_task():
        task = asyncio.create_task(worker(0))
        try:
            await task
        except ZeroDivisionError:
            return "handled by the awaiting coroutine"

    async def awaits_a_gather():
        try:
            await asyncio.gather(worker(1), worker(0))
        except ZeroDivisionError:
            return "handled around gather"

    async def keeps_results():
        return await asyncio.gather(worker(0), return_exceptions=True)

    async def does_not_handle():
        return await asyncio.create_task(worker(0))
'''


def test_a_handler_in_a_coroutine_that_awaits_the_task_is_respected():
    # `try: await task` -- the handler is in a coroutine that is suspended,
    # not on the stack of the task that raises
    import asyncio

    ns = vaccinate(ASYNC_PROGRAM, entries=("compute",))
    asked = []

    @daifu.on(ZeroDivisionError)
    def fix(crash):
        asked.append(crash.function)
        crash.vars["d"] = 5
        return daifu.RETRY

    assert asyncio.run(ns["awaits_a_task"]()) == "handled by the awaiting coroutine"
    assert asyncio.run(ns["awaits_a_gather"]()) == "handled around gather"
    result = asyncio.run(ns["keeps_results"]())
    assert isinstance(result[0], ZeroDivisionError)
    assert asked == []
    # nobody awaiting it handles it: a crash, fixed in the task's live frame
    assert asyncio.run(ns["does_not_handle"]()) == 6
    assert asked == ["compute"]


def test_except_a_virtual_abc_runs_no_user_code_and_matches_like_cpython():
    # CPython matches `except V:` on the MRO: a class V.register()ed is not
    # caught; daifu used isinstance(), which ran V's __instancecheck__ and
    # wrongly concluded that the program handles the exception
    from abc import ABCMeta

    calls = []

    class Meta(ABCMeta):
        def __instancecheck__(cls, inst):
            calls.append("__instancecheck__")
            return super().__instancecheck__(inst)

        def __subclasscheck__(cls, sub):
            calls.append("__subclasscheck__")
            return super().__subclasscheck__(sub)

    class Virtual(Exception, metaclass=Meta):
        pass

    Virtual.register(ZeroDivisionError)
    calls.clear()
    ns = vaccinate('''
        def work(d):
            for _ in range(1):
                x = 1 // d
            return x

        def run(exc_class, d):
            try:
                return work(d)
            except exc_class:
                return "caught"
    ''')

    @daifu.on(ZeroDivisionError)
    def fix(crash):
        crash.vars["d"] = 1
        return daifu.RETRY

    assert ns["run"](Virtual, 0) == 1
    assert calls == []
    with crashes(ZeroDivisionError):  # what CPython does without daifu
        _plain_run(Virtual)


def _plain_run(exc_class):
    try:
        return 1 // 0
    except exc_class:
        return "caught"


# -- tracers and profilers -------------------------------------------------------------

TRACED = '''
    def eafp(xs):
        out = []
        for x in xs:
            try:
                out.append(10 // x)
            except ZeroDivisionError:
                out.append(None)
        return out

    def crashy(d):
        total = 0
        for i in range(2):
            total += 10 // d
        return total
'''


def _record(fn, *args):
    """Run fn under a tracer and a profiler; return (result, trace, profile events)."""
    trace, profile = [], []

    def tracer(frame, event, arg):
        trace.append((event, frame.f_code.co_filename, frame.f_code.co_name, frame.f_lineno))
        return tracer

    def profiler(frame, event, arg):
        profile.append((event, frame.f_code.co_filename, frame.f_code.co_name,
                        getattr(arg, "__qualname__", None) if event.startswith("c_") else None))

    old_trace, old_profile = sys.gettrace(), sys.getprofile()
    sys.settrace(tracer)
    sys.setprofile(profiler)
    try:
        result = fn(*args)
        still = (sys.gettrace() is tracer, sys.getprofile() is profiler)
    finally:
        sys.settrace(old_trace)
        sys.setprofile(old_profile)
    assert still == (True, True), "daifu did not restore the tracer and profiler exactly"
    return result, trace, profile


def _daifu_frames(events):
    import daifu as pkg

    root = pkg.__file__.rsplit("/", 1)[0]
    return [e for e in events if e[1].startswith(root)]


def test_a_tracer_sees_the_same_events_for_an_exception_the_program_handles():
    # the exception passes a crash barrier (the engine decides it is handled):
    # a tracer (pdb, coverage) and a profiler must see nothing of that
    vaccinated = vaccinate(TRACED, name="traced")["eafp"]
    original = __import__("tests.support", fromlist=["plain"]).plain(TRACED, name="traced")["eafp"]
    got, trace, profile = _record(vaccinated, [1, 0, 2])
    want, plain_trace, plain_profile = _record(original, [1, 0, 2])
    assert got == want == [10, None, 5]
    assert [e[0] + str(e[3]) for e in trace] == [e[0] + str(e[3]) for e in plain_trace]
    assert not _daifu_frames(trace) and not _daifu_frames(profile)
    # a profiler sees the two builtins that suspend it, nothing else of daifu
    called = {e[3] for e in profile if e[0] == "c_call" and e[2] == "eafp"}
    assert called <= {"list.append", "getprofile", "setprofile"}


PASSING = '''
    def lookup(d, k):
        return d[k]

    def via(d, k):
        return lookup(d, k)

    def caller(n):
        hits = 0
        for i in range(n):
            try:
                via({}, i)
            except KeyError:
                hits += 1
        return hits

    class Lazy:
        @property
        def value(self):
            return self._value  # never set: AttributeError, which hasattr swallows

    def through_c(obj):
        try:
            return hasattr(obj, "value")
        except AttributeError:  # (what a walk of the callers finds)
            return "caught"

    class MyError(Exception):
        pass

    NotAClass = 3

    def other(n):
        for i in range(n):
            try:
                {}[i]
            except MyError:  # not what is raised: it goes on up
                pass

    def undefined():
        try:
            {}[0]
        except Undefined:  # noqa: F821 (plain python raises NameError here)
            pass

    def not_a_class():
        try:
            {}[0]
        except NotAClass:
            pass
'''


def test_an_exception_c_code_swallows_is_not_held():
    # hasattr (C) swallows the property's exception although a caller
    # further up would catch it: the stubs between never see it pass, so
    # nothing may be left waiting for it
    from daifu.engine import _barrier

    ns = vaccinate(PASSING, name="passing_c")
    for _ in range(3):
        assert ns["through_c"](ns["Lazy"]()) is False  # as under plain python
        assert _barrier.passing[:2] == [None, None]


def test_an_exception_the_functions_own_handler_catches_calls_no_barrier(barrier_calls):
    # ``try: 10 // x`` / ``except ZeroDivisionError``: the stub sends the
    # exception straight to the function's own handler while the engine is
    # quiet, and asks its barrier when it is not
    from daifu.engine import _barrier

    eafp = vaccinate(TRACED, name="own_handler")["eafp"]
    _mode, calls, _ = barrier_calls  # (no route here: every barrier call is judged)
    assert eafp([1, 0, 0, 2]) == [10, None, None, 5]
    assert calls == []
    _barrier.passing[2] = False  # (a retry or decision in flight, a pause requested)
    assert eafp([0]) == [None]
    assert calls == ["eafp"]
    assert _barrier.passing[2] is True  # (the barrier found the engine quiet again)
    assert eafp([0]) == [None] and calls == ["eafp"]


def test_a_handler_that_does_not_match_leaves_the_exception_to_the_barrier(barrier_calls):
    ns = vaccinate(PASSING, name="own_handler_other")
    _mode, calls, _ = barrier_calls
    with pytest.raises(KeyError):
        ns["other"](1)
    assert calls == ["other"]


@pytest.mark.parametrize("fn, error", [("undefined", NameError), ("not_a_class", TypeError)])
def test_an_except_clause_that_fails_fails_as_under_plain_python(fn, error):
    # the stub's own test of the clause fails: it leaves the exception to the
    # handler, which fails the same way python's does
    ns = vaccinate(PASSING, name=f"own_handler_{fn}")
    plain_ns = __import__("tests.support", fromlist=["plain"]).plain(PASSING)
    for namespace in (ns, plain_ns):
        with pytest.raises(error) as info:
            namespace[fn]()
        assert isinstance(info.value.__context__, KeyError)


def test_a_tracer_and_profiler_see_the_same_events_for_an_exception_passing_stubs(
        barrier_calls):
    vaccinated = vaccinate(PASSING, name="passing_traced")["caller"]
    original = __import__("tests.support", fromlist=["plain"]).plain(
        PASSING, name="passing_traced")["caller"]
    mode, judged, called = barrier_calls
    got, trace, profile = _record(vaccinated, 3)
    # via's stub let it pass, caller's took it to its handler; the next two
    # took the route the first found
    assert judged == ["lookup"]
    assert called == (["lookup"] * 3 if mode == "python" else [])
    want, plain_trace, plain_profile = _record(original, 3)
    assert got == want == 3
    assert [e[0] + e[2] + str(e[3]) for e in trace] == [
        e[0] + e[2] + str(e[3]) for e in plain_trace]
    assert not _daifu_frames(trace) and not _daifu_frames(profile)
    called = {e[3] for e in profile if e[0] == "c_call"}
    assert called <= {"list.append", "getprofile", "setprofile"} | {
        e[3] for e in plain_profile if e[0] == "c_call"}


def test_a_tracer_and_profiler_see_no_daifu_frame_while_a_crash_is_fixed():
    ns = vaccinate(TRACED)

    @daifu.on(ZeroDivisionError)
    def fix(crash):
        crash.vars["d"] = 5
        return daifu.RETRY

    result, trace, profile = _record(ns["crashy"], 0)
    assert result == 4
    assert not _daifu_frames(trace), _daifu_frames(trace)
    assert not _daifu_frames(profile), _daifu_frames(profile)
    assert not [e for e in trace if e[2] == "fix"]  # rules run untraced, like daifu itself
    lines = [e[3] for e in trace if e[0] == "line" and e[2] == "crashy"]
    assert lines == [12, 13, 14, 14, 13, 14, 13, 15]  # the failing line, then its retry


# -- decisions -----------------------------------------------------------------------------


def test_continue_at_a_failing_for_header_goes_on_with_the_next_item():
    # CONTINUE at `for batch in loader:` (the loader's __next__ raised) was
    # refused as "not inside a loop"; it means the loop's next item
    ns = vaccinate('''
        class Loader:
            def __init__(self, items):
                self.items = list(items)
            def __iter__(self):
                return self
            def __next__(self):
                if not self.items:
                    raise StopIteration
                item = self.items.pop(0)
                if item is None:
                    raise ValueError("corrupt sample")
                return item

        def train(items):
            seen = []
            for batch in Loader(items):
                seen.append(batch)
            return seen
    ''', entries=("train",))

    @daifu.on(ValueError)
    def next_item(crash):
        assert crash.kind == "loop-header" and crash.can_continue, crash.continue_reason
        return daifu.CONTINUE

    assert ns["train"]([1, None, 2, None, 3]) == [1, 2, 3]


def test_skip_of_the_last_statement_of_a_function_works():
    # the last statement (a report line, usually) shares its location with
    # the implicit `return None`: skip was refused ("no single continuation")
    ns = vaccinate('''
        def report(log, results):
            log.append("start")
            log.append(f"accuracy {results['accuracy']:.2f}")
    ''')

    @daifu.on(KeyError)
    def skip(crash):
        assert crash.can_skip, crash.skip_reason
        return daifu.SKIP

    log = []
    assert ns["report"](log, {}) is None
    assert log == ["start"]


EXITING = '''
import sys
import daifu

@daifu.on(ZeroDivisionError)
def give_up_the_job(crash):
    print("rule: exiting with 9", flush=True)
    raise SystemExit(9)

def train():
    for step in range(3):
        try:
            x = 10 // (step - 1)
        finally:
            print("finally of step", step, flush=True)

train()
print("not reached")
'''


def test_a_rules_system_exit_exits_with_its_status(tmp_path):
    script = tmp_path / "exiting.py"
    script.write_text(EXITING)
    proc = run_daifu([script], cwd=tmp_path)
    assert proc.returncode == 9, proc.stderr
    assert proc.stdout.splitlines() == ["finally of step 0", "rule: exiting with 9",
                                        "finally of step 1"]
    assert "Traceback" not in proc.stderr


# -- handled by a library ------------------------------------------------------------------

LIBRARY_HANDLES = {
    # argparse calls a type= function and turns its ValueError into a usage error
    "argparse_type": '''
        import argparse

        def positive(text):
            value = int(text)
            if value <= 0:
                raise ValueError("not positive")
            return value

        parser = argparse.ArgumentParser(prog="train")
        parser.add_argument("--n", type=positive, default=1)
        try:
            parser.parse_args(["--n", "-3"])
        except SystemExit as exit_:
            print("refused", exit_.code)
    ''',
    # unittest: a with-block in the test, and the callable form (a with in unittest)
    "unittest_assert_raises": '''
        import unittest

        def divide(x):
            return 1 / x

        class T(unittest.TestCase):
            def test_with_block(self):
                with self.assertRaises(ZeroDivisionError):
                    divide(0)

            def test_callable(self):
                self.assertRaises(ZeroDivisionError, divide, 0)

            def test_regex(self):
                with self.assertRaisesRegex(ZeroDivisionError, "zero"):
                    divide(0)

        result = unittest.main(argv=["t"], exit=False).result
        print("ran", result.testsRun, "failed", len(result.failures) + len(result.errors))
    ''',
    # pytest.raises in a test (not vaccinated) around a call into vaccinated
    # code: a test that expects the exception is not crashing
    "pytest_raises": '''
        import contextlib, io, pathlib, pytest

        def divide(x):  # (vaccinated: the script's own function)
            y = 1 // x
            return y

        pathlib.Path("test_div.py").write_text(
            "import pytest\\n"
            "from __main__ import divide\\n"
            "def test_plain():\\n"
            "    with pytest.raises(ZeroDivisionError):\\n"
            "        divide(0)\\n"
            "def test_match_and_tuple():\\n"
            "    with pytest.raises((KeyError, ZeroDivisionError), match='division'):\\n"
            "        divide(0)\\n")
        with contextlib.redirect_stdout(io.StringIO()) as out:
            code = pytest.main(["-q", "-p", "no:cacheprovider", "test_div.py"])
        print("exit", int(code), "2 passed" in out.getvalue())
    ''',
    # a library's exception, through a vaccinated helper, caught by the program
    "caught_above_the_helper": '''
        import json

        def parse(text):
            return json.loads(text)

        for text in ['{"a": 1}', '{bad']:
            try:
                print(parse(text))
            except json.JSONDecodeError:
                print("not json")
    ''',
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(LIBRARY_HANDLES))
def test_an_exception_a_library_frame_handles_is_not_a_crash(case, tmp_path):
    """Each frame's handlers count, a library's as well: with --wait a crash
    would make the job wait (and log crash.intercepted)."""
    (tmp_path / "prog.py").write_text(textwrap.dedent(LIBRARY_HANDLES[case]))
    _runs_as_plain_python_with_no_crash(tmp_path)


def _runs_as_plain_python_with_no_crash(tmp_path, timeout=120):
    """prog.py under daifu (with --wait: a crash would make it wait) prints and
    exits as under python, and no crash was intercepted."""
    import subprocess

    plain = subprocess.run([sys.executable, "prog.py"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=timeout)
    got = run_daifu(["--wait", "30", "--log-file", "events.jsonl", "prog.py"], tmp_path,
                    timeout=timeout)
    assert (got.returncode, got.stdout) == (plain.returncode, plain.stdout)
    assert not (tmp_path / "events.jsonl").exists() or \
        "crash.intercepted" not in (tmp_path / "events.jsonl").read_text()


@pytest.mark.slow
@pytest.mark.torch
def test_checkpoint_without_reentrant_recomputation_is_not_a_crash(tmp_path):
    """torch.utils.checkpoint(use_reentrant=False) stops the recomputation of
    the program's block by raising its own exception through it, and catches
    it: every backward pass, never a crash."""
    pytest.importorskip("torch", reason="PyTorch not available")
    (tmp_path / "prog.py").write_text(textwrap.dedent('''
        import torch
        from torch.utils.checkpoint import checkpoint

        def block(x, w):
            y = x @ w
            return torch.relu(y)

        torch.manual_seed(0)
        w = torch.randn(4, 4, requires_grad=True)
        for step in range(3):
            out = checkpoint(block, torch.randn(2, 4), w, use_reentrant=False)
            out.sum().backward()
        print(w.grad.sum().item())
    '''))
    _runs_as_plain_python_with_no_crash(tmp_path)
