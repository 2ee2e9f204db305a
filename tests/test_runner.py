"""``python -m daifu``: the target behaves as if run by ``python`` itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from .test_transparency import PASSING


def daifu(args, cwd, env=None, **kw):
    return subprocess.run([sys.executable, "-m", "daifu", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})}, **kw)


def python(args, cwd, **kw):
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, **kw)


MAIN_FACTS = textwrap.dedent('''
    globals_at_start = list(globals())
    import json, os, pickle, sys

    x: int = 3

    class Point:
        def __init__(self, x):
            self.x = x

    facts = {
        "name": __name__,
        "file": __file__,
        "argv": sys.argv,
        "path0": sys.path[0],
        "spec": None if __spec__ is None else __spec__.name,
        "package": __package__,
        "main_is_module": sys.modules["__main__"].__dict__ is globals(),
        "pickled": pickle.loads(pickle.dumps(Point(3))).x,
        "doc": __doc__,
        "globals_at_start": globals_at_start,
        "annotations": {k: v.__name__ for k, v in sys.modules["__main__"].__annotations__.items()},
        "cached": __cached__,
    }
    print(json.dumps(facts))
''')


def test_script_is_the_real_main(tmp_path):
    (tmp_path / "sub").mkdir()
    script = tmp_path / "sub" / "facts.py"
    script.write_text(MAIN_FACTS)
    expected = json.loads(python(["sub/facts.py", "a", "--b"], cwd=tmp_path).stdout)
    got = json.loads(daifu(["sub/facts.py", "a", "--b"], cwd=tmp_path).stdout)
    assert got == expected
    assert got["argv"] == ["sub/facts.py", "a", "--b"]
    assert got["path0"] == str(tmp_path / "sub")
    # __annotations__ is there from the start (where python puts it) and gets x: int = 3
    assert got["globals_at_start"] == ["__name__", "__doc__", "__package__", "__loader__",
                                       "__spec__", "__annotations__", "__builtins__", "__file__",
                                       "__cached__"]
    assert got["annotations"] == {"x": "int"}
    assert got["cached"] is None
    # the -m form: runpy's __main__, __cached__ the spec's
    expected = json.loads(python(["-m", "sub.facts", "a"], cwd=tmp_path).stdout)
    got = json.loads(daifu(["-m", "sub.facts", "a"], cwd=tmp_path).stdout)
    assert got == expected
    assert got["globals_at_start"][5:7] == ["__annotations__", "__builtins__"]
    assert got["annotations"] == {"x": "int"}
    assert got["cached"].endswith(".pyc")
    # a script without annotations has an empty __annotations__ too (python's, not the compiler's)
    (tmp_path / "sub" / "plain.py").write_text(
        "import __main__\nprint(repr(getattr(__main__, '__annotations__', 'missing')))\n")
    for args in (["sub/plain.py"], ["-m", "sub.plain"]):
        assert python(args, cwd=tmp_path).stdout == "{}\n"
        assert daifu(args, cwd=tmp_path).stdout == "{}\n", args


def test_dash_m_module_and_package(tmp_path):
    pkg = tmp_path / "apppkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "facts.py").write_text(MAIN_FACTS)
    (pkg / "__main__.py").write_text(MAIN_FACTS)
    for target in ("apppkg.facts", "apppkg"):
        expected = json.loads(python(["-m", target, "x"], cwd=tmp_path).stdout)
        got = json.loads(daifu(["-m", target, "x"], cwd=tmp_path).stdout)
        assert got == expected, target


@pytest.mark.parametrize(
    "body,status",
    [
        ("import sys\nsys.exit(3)\n", 3),
        ("raise SystemExit('bye')\n", 1),
        ("def f():\n    for i in range(2):\n        {}['k']\nf()\n", 1),
        ("print('fine')\n", 0),
    ],
)
def test_exit_status_and_stderr_like_python(tmp_path, body, status):
    (tmp_path / "s.py").write_text(body)
    plain = python(["s.py"], cwd=tmp_path)
    under = daifu(["--log", str(tmp_path / "log.jsonl"), "s.py"], cwd=tmp_path)
    assert plain.returncode == under.returncode == status
    assert under.stdout == plain.stdout
    assert under.stderr == plain.stderr


def test_uncaught_exception_traceback_hides_daifu_frames(tmp_path):
    (tmp_path / "s.py").write_text("def f(xs):\n    for x in xs:\n        1 / x\nf([0])\n")
    under = daifu(["--log", "events.jsonl", "s.py"], cwd=tmp_path)
    tb = under.stderr[under.stderr.index("Traceback"):]
    assert "daifu" not in tb and "runpy" not in tb
    assert tb.rstrip().endswith("ZeroDivisionError: division by zero")


def test_missing_script_and_missing_module(tmp_path):
    expected = python(["nope.py"], cwd=tmp_path).returncode
    assert daifu(["nope.py"], cwd=tmp_path).returncode == expected
    proc = daifu(["-m", "no_such_module_xyz"], cwd=tmp_path)
    assert proc.returncode == 1 and "No module named no_such_module_xyz" in proc.stderr


def test_help_lists_options_and_environment(tmp_path):
    proc = daifu(["--help"], cwd=tmp_path)
    assert proc.returncode == 0
    for word in ("--fixes", "--modules", "DAIFU_MODULES", "DAIFU_ENTRY", "DAIFU_MAX_ATTEMPTS"):
        assert word in proc.stdout


def test_no_target_is_a_usage_error(tmp_path):
    proc = daifu([], cwd=tmp_path)
    assert proc.returncode == 2 and "no script" in proc.stderr


def test_broken_fixes_file_stops_before_running(tmp_path):
    (tmp_path / "s.py").write_text("print('ran')\n")
    (tmp_path / "fixes.py").write_text("import daifu\n@daifu.on(3)\ndef f(c): pass\n")
    proc = daifu(["--fixes", "fixes.py", "s.py"], cwd=tmp_path)
    assert proc.returncode == 2
    assert "fixes file fixes.py failed to load" in proc.stderr
    assert "TypeError: daifu.on expects exception classes" in proc.stderr
    assert "ran" not in proc.stdout


def test_options_come_from_environment(tmp_path):
    (tmp_path / "lib_mod.py").write_text(
        "def work(xs):\n    out = []\n    for x in xs:\n        out.append(6 // x)\n"
        "    return out\n")
    (tmp_path / "s.py").write_text("import lib_mod\nprint(lib_mod.work([1, 0]))\n")
    (tmp_path / "fixes.py").write_text(
        "import daifu\n@daifu.on(ZeroDivisionError)\ndef f(c):\n    c.vars['x'] = 2\n"
        "    return daifu.RETRY\n")
    proc = daifu(["s.py"], cwd=tmp_path, env={"DAIFU_MODULES": "lib_mod",
                                              "DAIFU_FIXES": "fixes.py",
                                              "DAIFU_LOG": "events.jsonl"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[6, 3]"
    events = [json.loads(line)["event"] for line in (tmp_path / "events.jsonl").read_text()
              .splitlines()]
    core = [e for e in events if e.split(".")[0] in ("crash", "patch")]
    assert core == ["crash.intercepted", "patch.applied", "crash.resumed"]
    assert events[-1] == "daifu.summary"


def test_rules_in_the_script_itself(tmp_path):
    (tmp_path / "s.py").write_text(textwrap.dedent('''
        import daifu

        @daifu.on(KeyError, where="lookup")
        def default(crash):
            crash.vars["table"][crash.vars["key"]] = 0
            return daifu.RETRY

        def lookup(keys):
            table = {"a": 1}
            out = []
            for key in keys:
                out.append(table[key])
            return out

        print(lookup(["a", "b", "a"]))
    '''))
    proc = daifu(["--log", "log.jsonl", "s.py"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[1, 0, 1]"


HANDLED_AFTER_GIVE_UP = '''
import library

def step(d):
    for _ in range(1):
        return 10 // d

print(library.loop(step))
'''

LIBRARY = '''
def loop(step):  # not vaccinated, and it catches ZeroDivisionError by name
    caught = 0
    for d in (0, 0, 0):
        try:
            step(d)
        except ZeroDivisionError:
            caught += 1
    return caught
'''


def test_exceptions_the_program_handled_are_not_crashes_in_the_summary(tmp_path):
    # a passing pytest run under daifu reported "64 gave_up"; and when nothing
    # was recovered, a JSON summary followed the program's own traceback
    (tmp_path / "handled.py").write_text(HANDLED_AFTER_GIVE_UP)
    (tmp_path / "library.py").write_text(LIBRARY)
    log = tmp_path / "log.jsonl"
    proc = daifu(["--log", str(log), "handled.py"], cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "3", proc.stderr
    events = [json.loads(line) for line in log.read_text().splitlines()]
    # a library's handler that names the exception counts: no crash at all
    assert not [e for e in events if e["event"] in ("crash.intercepted", "crash.gave_up")]
    assert not [e for e in events if e["event"] == "daifu.summary"]
    (tmp_path / "dies.py").write_text("def f(d):\n    for _ in range(1):\n        return 1 // d\n"
                                      "f(0)\n")
    proc = daifu(["dies.py"], cwd=tmp_path)
    assert proc.returncode == 1
    last = proc.stderr.rstrip().splitlines()[-1]
    assert last == "ZeroDivisionError: integer division or modulo by zero", proc.stderr


PROGRAM_WITH_STRUCTLOG = '''
import sys
import structlog

if not structlog.is_configured():  # the program's own logging, its own way
    structlog.configure(processors=[structlog.processors.KeyValueRenderer()],
                        logger_factory=structlog.PrintLoggerFactory(file=sys.stdout))
log = structlog.get_logger()
log.info("program.started")

def train(d):
    for _ in range(1):
        x = 10 // d
    return x

import daifu

@daifu.on(ZeroDivisionError)
def fix(crash):
    crash.vars["d"] = 5
    return daifu.RETRY

log.info("program.result", value=train(0))
'''


def test_daifu_never_configures_or_uses_the_programs_structlog(tmp_path):
    # daifu configured the global structlog: a program that configures it took
    # over daifu's events (--log stayed empty), and `if not is_configured()`
    # sent the program's own logs into daifu's file
    (tmp_path / "prog.py").write_text(PROGRAM_WITH_STRUCTLOG)
    log = tmp_path / "daifu.jsonl"
    proc = daifu(["--log", str(log), "prog.py"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "event='program.started'" in proc.stdout and "value=2" in proc.stdout
    assert "crash" not in proc.stdout  # daifu's events are not the program's
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert {"crash.intercepted", "crash.resumed"} <= {e["event"] for e in events}
    assert not [e for e in events if e["event"].startswith("program.")]


LEAN = '''
import sys
heavy = {"asyncio", "ssl", "socket", "structlog", "uuid", "json", "multiprocessing", "cmd"}
print(sorted(heavy & set(sys.modules)))

def f(d):
    for _ in range(1):
        return 1 // d

try:
    f(0)
except ZeroDivisionError:
    pass
print(sorted(heavy & set(sys.modules)))
'''


def test_start_up_is_lean_and_nothing_is_imported_while_the_program_runs(tmp_path):
    # the runner imported ~146 modules (asyncio, ssl, socket, ...) before the
    # program; and hasattr(structlog, "__warningregistry__") imported
    # importlib.metadata while CPython's regrtest iterated sys.modules
    (tmp_path / "lean.py").write_text(LEAN)
    proc = daifu(["lean.py"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["[]", "[]"]  # an exception the program handles
    check = ("import sys, daifu.engine._events as ev; ev.emit(ev.InternalError("
             "where='x', error='e', traceback='')); import structlog; before = set(sys.modules);"
             " hasattr(structlog, '__warningregistry__'); print(sorted(set(sys.modules) - before))")
    res = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                         timeout=60)
    assert res.stdout.strip() == "[]", res.stdout + res.stderr


# the 3-call EAFP chain of the transparency tests, run as a script
HANDLED_FROM_CACHE = ("import sys\n" + textwrap.dedent(PASSING)
                      + '\nprint(caller(5), "bytecode" in sys.modules)\n')


def test_an_exception_the_program_handles_imports_no_rewrite(tmp_path):
    # a start whose modules all come from the code cache never imports the
    # rewrite (or ``bytecode``, ~19 ms); finding the handler of an exception
    # in the vaccinated callers did, to read their cells back
    (tmp_path / "handled.py").write_text(HANDLED_FROM_CACHE)
    env = {"DAIFU_CACHE": str(tmp_path / "cache")}
    first = daifu(["handled.py"], cwd=tmp_path, env=env)  # (rewrites it: imports bytecode)
    assert first.returncode == 0 and first.stdout.split() == ["5", "True"], first.stderr
    again = daifu(["handled.py"], cwd=tmp_path, env=env)
    assert again.returncode == 0 and again.stdout.split() == ["5", "False"], again.stderr


PRELOADED = '''
import os, sys, time
heavy = {"structlog", "json", "asyncio"}
print(sorted(heavy & set(sys.modules)))
end = time.monotonic() + 1.5
while time.monotonic() < end:  # (a program at work: it allocates)
    [[] for _ in range(100)]
print(sorted(heavy & set(sys.modules)))
# a fork while the imports may still run: the child can import them
for _ in range(20):
    pid = os.fork()
    if pid == 0:
        import structlog, json
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
print("forked")
'''


@pytest.mark.slow
def test_what_the_first_crash_imports_is_imported_off_its_path(tmp_path):
    # the first crash imported ~200 modules (structlog, rich, asyncio...):
    # 80-120 ms from the raise to the first rule; now the main thread imports
    # them between two of its instructions DAIFU_PRELOAD seconds after start-up
    (tmp_path / "pre.py").write_text(PRELOADED)
    proc = daifu(["pre.py"], cwd=tmp_path, env={**os.environ, "DAIFU_PRELOAD": "0.5"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["[]", "['asyncio', 'json', 'structlog']", "forked"]
    off = daifu(["pre.py"], cwd=tmp_path, env={**os.environ, "DAIFU_PRELOAD": "0"})
    assert off.returncode == 0 and off.stdout.splitlines()[:2] == ["[]", "[]"], off.stderr


def test_the_programs_random_numbers_are_its_own_across_the_preload_and_a_crash(tmp_path):
    # rich.style calls random.getrandbits(24) when it is imported, and
    # structlog imports rich: a seeded program drew other numbers under daifu
    # from the first crash (or the preload) on than under python
    (tmp_path / "rnd.py").write_text(textwrap.dedent('''
        import random, time
        random.seed(1234)
        def main():
            out = []
            for i in range(6):
                out.append(random.random())
                if i == 2:
                    end = time.monotonic() + 0.8
                    while time.monotonic() < end:  # the preload runs meanwhile
                        [[] for _ in range(100)]
                if i == 4:
                    d = 0
                    out.append(1 / d if d else -1.0)  # (no crash: the same under python)
            try:
                int("x")
            except ValueError:
                pass
            return out
        print(main())
        def crash(k):
            for _ in range(1):
                return 1 / k
        print(crash(int(__import__("sys").argv[1])), random.random())
    '''))
    (tmp_path / "fix.py").write_text("import daifu\n@daifu.on(ZeroDivisionError)\n"
                                     "def fix(crash):\n    crash.vars['k'] = 1\n"
                                     "    return daifu.RETRY\n")
    plain = python(["rnd.py", "1"], cwd=tmp_path)
    # a crash (recovered by the rule) after the preload, and one without it
    got = daifu(["--fixes", "fix.py", "rnd.py", "0"], cwd=tmp_path,
                env={"DAIFU_PRELOAD": "0.2"})
    assert got.returncode == 0 and got.stdout == plain.stdout, got.stderr
    crashed = daifu(["--fixes", "fix.py", "rnd.py", "0"], cwd=tmp_path,
                    env={"DAIFU_PRELOAD": "0"})
    assert crashed.returncode == 0 and crashed.stdout == plain.stdout, crashed.stderr


def test_overlapping_guards_of_the_programs_random_leave_it_as_it_was():
    # the preload thread's guard and a crash's guard in the main thread can
    # overlap in any order; two independent swaps left in the wrong order kept
    # the main thread's wrapper installed for good: the program's random and
    # the emergency checkpoint's random.getstate() then read a private
    # generator (a resumed run was not the run that never crashed)
    import random
    import threading

    from daifu.engine._quietrandom import program_random_untouched

    before = {name: getattr(random, name) for name in ("random", "getstate", "getrandbits")}
    random.seed(99)
    expected = random.Random(99).random()
    entered, leave = threading.Event(), threading.Event()
    drawn: list[float] = []

    def preload():
        with program_random_untouched():
            entered.set()
            drawn.append(random.random())  # this thread's private generator
            leave.wait(5)

    with program_random_untouched():  # the main thread's (the crash's) first
        thread = threading.Thread(target=preload)
        thread.start()
        assert entered.wait(5)
        random.getrandbits(24)  # private to this thread too
    # the main thread left first; the other is still inside
    assert random.random() == expected  # the program's own generator
    leave.set()
    thread.join(5)
    assert {name: getattr(random, name) for name in before} == before
    random.seed(99)
    assert random.getstate() == random.Random(99).getstate()
    assert drawn and drawn[0] != expected


def test_a_fork_around_the_preload_leaves_the_child_able_to_import(tmp_path):
    # a fork while an import lock was held by daifu's preload (a thread, once)
    # left the child a lock nobody releases: the child of a DataLoader-style
    # fork importing those modules at its first crash hung.  The imports now
    # run on the main thread, between two of its instructions
    (tmp_path / "fork.py").write_text(textwrap.dedent('''
        import os, sys, threading, time
        from daifu.engine import _preload
        for _ in range(300):
            pid = os.fork()
            if pid == 0:
                import structlog, json
                os._exit(0)
            assert os.waitpid(pid, 0)[1] == 0
            [[] for _ in range(1000)]
            if _preload._state.done.is_set():
                break
        print("ok", _preload._state.done.is_set(), threading.active_count())
    '''))
    proc = daifu(["fork.py"], cwd=tmp_path, env={**os.environ, "DAIFU_PRELOAD": "0.001"})
    assert (proc.returncode, proc.stdout.strip()) == (0, "ok True 1"), proc.stderr


@pytest.mark.parametrize("after", ["done", "pending"])
def test_ctrl_c_around_the_preload_still_exits_by_sigint(tmp_path, after):
    # CPython exits through SIGINT after an uncaught KeyboardInterrupt, but
    # reads that from a flag every exec of a string clears: the preload's
    # imports (dataclasses) cleared it while the traceback was printed, and
    # Ctrl-C under daifu exited with status 1 (1 run in 5)
    (tmp_path / "ctrlc.py").write_text(textwrap.dedent(f'''
        import atexit, time
        from daifu.engine import _preload
        end = time.monotonic() + 5
        while {after == "done"} and not _preload._state.done.is_set() and time.monotonic() < end:
            [[] for _ in range(100)]
        atexit.register(time.sleep, 0.3)  # a writer flushing at exit
        print(_preload._state.done.is_set())
        raise KeyboardInterrupt
    '''))
    # (pending: the timer still waits at the exit)
    delay = "0.2" if after == "done" else "30"
    started = time.monotonic()
    proc = daifu(["ctrlc.py"], cwd=tmp_path, env={**os.environ, "DAIFU_PRELOAD": delay})
    assert time.monotonic() - started < 20  # (nothing waits for the timer)
    assert proc.returncode == -signal.SIGINT, proc.stderr
    assert proc.stderr.rstrip().splitlines()[-1] == "KeyboardInterrupt"
    assert proc.stdout.strip() == str(after == "done")


def test_a_module_imported_before_daifu_is_vaccinated_in_place(tmp_path):
    # DAIFU_MODULES naming a module that was already imported (by the
    # interpreter's start-up, by daifu) silently vaccinated nothing
    (tmp_path / "uses_shlex.py").write_text(
        "import shlex, sys\n"
        "from daifu.cells import cells_of\n"
        "print(cells_of(shlex.shlex.read_token.__code__) is not None)\n")
    pre = "import shlex; import runpy; runpy.run_module('daifu', run_name='__main__')"
    res = subprocess.run([sys.executable, "-c", pre, "uses_shlex.py"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "DAIFU_MODULES": "shlex"})
    assert res.stdout.strip() == "True", res.stderr


def test_an_unsupported_python_is_refused_with_one_line_unless_unprotected(tmp_path):
    (tmp_path / "prog.py").write_text("print('ran')\n")
    fake = ("import sys, daifu.cells as cells; cells.backend = lambda: (None, 'unknown'); "
            "from daifu.hooks._runner import main; main(sys.argv[1:])")
    refused = subprocess.run([sys.executable, "-c", fake, "prog.py"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and refused.stdout == ""
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "daifu supports CPython 3.11 and 3.13" in lines[0]
    assert "--unprotected" in lines[0]
    ran = subprocess.run([sys.executable, "-c", fake, "--unprotected", "prog.py"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0 and ran.stdout == "ran\n", ran.stderr


def test_a_zipapp_runs_as_with_python_and_is_vaccinated(tmp_path):
    # its __main__ is vaccinated from the source zipimport reads out of the
    # archive (it ran unmodified, with a warning): a crash there is taken
    import zipapp

    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__main__.py").write_text(textwrap.dedent("""\
        import sys
        print(sys.argv, sys.path[0].endswith('app.pyz'), __name__, __spec__.name,
              __file__.endswith('app.pyz/__main__.py'), type(__loader__).__name__)
        rows = {}
        print(rows["a"] if len(sys.argv) > 2 else "")
    """))
    (tmp_path / "fixes.py").write_text(textwrap.dedent("""\
        import daifu
        @daifu.on(KeyError)
        def add(crash):
            crash.vars["rows"]["a"] = "fixed"
            return daifu.RETRY
    """))
    zipapp.create_archive(tmp_path / "app", tmp_path / "app.pyz")
    expected = python(["app.pyz", "x"], cwd=tmp_path)
    got = daifu(["app.pyz", "x"], cwd=tmp_path)
    assert (got.returncode, got.stdout) == (expected.returncode, expected.stdout)
    assert expected.stdout == "['app.pyz', 'x'] True __main__ __main__ True zipimporter\n\n"
    assert "runs unmodified" not in got.stderr
    fixed = daifu(["--fixes", "fixes.py", "app.pyz", "x", "y"], cwd=tmp_path)
    assert (fixed.returncode, fixed.stdout.splitlines()[-1]) == (0, "fixed"), fixed.stderr


def test_a_script_with_a_nul_byte_is_named_in_the_error(tmp_path):
    (tmp_path / "nul.py").write_bytes(b"x = 1\nprint('a')\x00\n")
    expected = python(["nul.py"], cwd=tmp_path)
    got = daifu(["nul.py"], cwd=tmp_path)
    assert got.returncode == expected.returncode == 1
    assert f'File "{tmp_path / "nul.py"}", line 2' in got.stderr
    assert got.stderr.splitlines()[-1] == expected.stderr.splitlines()[-1]


def test_a_directory_without_main_is_named_as_python_names_it(tmp_path):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    expected = python(["../.."], cwd=tmp_path / "d" / "sub")
    got = daifu(["../.."], cwd=tmp_path / "d" / "sub")
    assert got.returncode == expected.returncode == 1
    assert got.stderr.split(": ", 1)[1] == expected.stderr.split(": ", 1)[1]


def test_log_to_dev_null_or_a_fifo_and_a_dump_that_is_private(tmp_path):
    # `--log /dev/null` (or a FIFO) was refused and the program never ran;
    # `--dump FILE` followed a planted symlink and wrote 0644
    import stat

    (tmp_path / "hi.py").write_text("def f():\n    for i in range(2):\n        pass\nf()\n"
                                    "print('hi')\n")
    for sink in ("/dev/null",):
        got = daifu(["--log-file", sink, "--log-level", "debug", "hi.py"], cwd=tmp_path)
        assert (got.returncode, got.stdout) == (0, "hi\n"), got.stderr
    fifo = tmp_path / "events.fifo"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE, text=True)
    got = daifu(["--log-file", str(fifo), "--log-level", "debug", "hi.py"], cwd=tmp_path)
    assert (got.returncode, got.stdout) == (0, "hi\n"), got.stderr
    assert "module.vaccinated" in reader.communicate(timeout=30)[0]
    (tmp_path / "dump.txt").symlink_to(tmp_path / "planted.txt")
    got = daifu(["--dump", "dump.txt", "hi.py"], cwd=tmp_path)
    assert got.returncode == 2 and "it is a symbolic link" in got.stderr
    assert not (tmp_path / "planted.txt").exists()
    (tmp_path / "dump.txt").unlink()
    got = daifu(["--dump", "dump.txt", "hi.py"], cwd=tmp_path)
    assert got.returncode == 0 and "vaccinated f" in (tmp_path / "dump.txt").read_text()
    assert stat.S_IMODE((tmp_path / "dump.txt").stat().st_mode) == 0o600


def test_version_says_whether_the_barriers_c_check_is_in_use(tmp_path):
    # daifu's C extension is optional (built by pip where a C compiler is);
    # DAIFU_SPEEDUPS=0 runs the same check in Python (and the EAFP program's
    # answers are the same either way)
    from .conftest import speedups

    speedups()  # (skipped where it is not built)
    (tmp_path / "eafp.py").write_text(textwrap.dedent(PASSING) + "\nprint(caller(50))\n")
    for env, check, held in (({}, "in C", "in C"),
                             ({"DAIFU_SPEEDUPS": "0"}, "in Python: DAIFU_SPEEDUPS=0", "in Python")):
        res = daifu(["--version"], tmp_path, env=env)
        assert res.returncode == 0, res.stderr
        assert res.stdout.startswith("daifu ")
        assert f"the barrier's route check {check}; signal handlers held back {held}; " \
            f"flat code armed {held}, its trap laid out ahead of time)" in res.stdout
        ran = daifu(["eafp.py"], tmp_path, env=env)
        assert (ran.returncode, ran.stdout) == (0, "50\n"), ran.stderr


TOOL_PROGRAM = textwrap.dedent('''
    import sys
    from helper import lookup

    def main():
        total = 0
        for i in range(4):
            d = 0 if i == 1 else 1
            total += lookup({"a": 1}, "b" if i == 2 else "a") // d
        print("argv", sys.argv, "total", total, flush=True)

    main()
''')


@pytest.mark.parametrize("tool", [["cProfile", "-s", "tottime"], ["profile"],
                                  ["trace", "--count", "--summary", "--missing", "--coverdir",
                                   "cover"], ["pdb"]],
                         ids=lambda t: t[0])
def test_a_program_run_by_a_profiler_or_debugger_is_the_one_vaccinated(tmp_path, tool):
    """``python -m daifu -m cProfile train.py``: the tool runs as it does
    without daifu; the program it runs (and the module beside it) is what is
    vaccinated, and a rule fixes its crash."""
    (tmp_path / "prog.py").write_text(TOOL_PROGRAM)
    (tmp_path / "helper.py").write_text("def lookup(table, key):\n    return table[key]\n")
    (tmp_path / "fixes.py").write_text(
        "import daifu\n@daifu.on(KeyError)\ndef fix(crash):\n"
        "    crash.vars['key'] = 'a'\n    return daifu.RETRY\n"
        "@daifu.on(ZeroDivisionError)\ndef fix_d(crash):\n"
        "    crash.vars['d'] = 1\n    return daifu.RETRY\n")
    stdin = "continue\n" if tool[0] == "pdb" else ""
    plain = python(["-m", *tool, "prog.py", "x"], cwd=tmp_path, input=stdin)
    assert "ZeroDivisionError" in plain.stdout + plain.stderr  # (pdb: post-mortem)
    proc = daifu(["--fixes", "fixes.py", "--log", "events.jsonl", "-m", *tool, "prog.py", "x"],
                 cwd=tmp_path, input=stdin, env={"DAIFU_CONSOLE": "0"})
    assert proc.returncode == 0, proc.stderr
    assert "argv ['prog.py', 'x'] total 4" in proc.stdout
    if tool[0] in ("cProfile", "profile"):
        assert "ncalls" in proc.stdout and "prog.py:5(main)" in proc.stdout
    elif tool[0] == "trace":
        assert "lines   cov%   module" in proc.stdout
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    resumed = [e["where"] for e in events if e["event"] == "crash.resumed"]
    prog = str(tmp_path / "prog.py") if tool[0] == "pdb" else "prog.py"  # (as the tool names it)
    assert resumed == [f"{prog}:9", f"{tmp_path / 'helper.py'}:2"], resumed


def test_a_module_run_by_a_profiler_is_vaccinated_as_its_package(tmp_path):
    """``python -m daifu -m cProfile -m app.train``: the package is the
    project, so the loop in ``app.train`` and the helper beside it are
    vaccinated when cProfile imports them."""
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__init__.py").write_text("")
    (tmp_path / "app" / "train.py").write_text(
        TOOL_PROGRAM.replace("from helper import", "from app.helper import").replace(
            "\nmain()\n", "\nif __name__ == '__main__':\n    main()\n"))
    (tmp_path / "app" / "helper.py").write_text("def lookup(table, key):\n    return table[key]\n")
    (tmp_path / "fixes.py").write_text(
        "import daifu\n@daifu.on(KeyError)\ndef fix(crash):\n"
        "    crash.vars['key'] = 'a'\n    return daifu.RETRY\n"
        "@daifu.on(ZeroDivisionError)\ndef fix_d(crash):\n"
        "    crash.vars['d'] = 1\n    return daifu.RETRY\n")
    proc = daifu(["--fixes", "fixes.py", "--log", "events.jsonl", "-m", "cProfile", "-m",
                  "app.train"], cwd=tmp_path, env={"DAIFU_CONSOLE": "0"})
    assert proc.returncode == 0, proc.stderr
    assert "total 4" in proc.stdout and "ncalls" in proc.stdout
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    resumed = [e["where"] for e in events if e["event"] == "crash.resumed"]
    assert resumed == [f"{tmp_path / 'app' / 'train.py'}:9",
                       f"{tmp_path / 'app' / 'helper.py'}:2"], resumed


def test_a_tool_given_no_program_file_says_what_is_vaccinated(tmp_path):
    (tmp_path / "prog.py").write_text("print('ran')\n")
    proc = daifu(["-m", "cProfile", "-o", "out.prof", "prog"], cwd=tmp_path,
                 env={"DAIFU_CONSOLE": "0"})
    assert "daifu: warning: no program file (.py) among cProfile's arguments" in proc.stderr
