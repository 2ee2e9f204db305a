"""With default settings every function runs in its own frame, from its
first call on, and the code daifu installs holds only plain constants.

Each program here prints what a tool that looks at frames or code objects
sees; under ``python -m daifu`` (defaults) it must print exactly what it
prints under python.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from .support import run_daifu

#: helpers without a loop (the default selection's "every other function"),
#: first called from a loop; each looks at frames, code or a profiler
PROGRAMS = {
    "caller_frame": '''
        import sys

        def who_called():
            return sys._getframe(1).f_code.co_name

        def main():
            for _ in range(2):
                print(who_called())

        main()
    ''',
    "inspect_stack": '''
        import inspect

        def depth():  # (the runner's own frames below <module> are like runpy's)
            return [f.function for f in inspect.stack()[:2]]

        for _ in range(2):
            print(depth())
    ''',
    "warning_stacklevel": '''
        import warnings

        def deprecated():
            warnings.warn("old", DeprecationWarning, stacklevel=2)

        warnings.simplefilter("always")
        warnings.showwarning = lambda m, c, f, line, *a: print(c.__name__, m, line)
        for _ in range(2):
            deprecated()
    ''',
    "cprofile_counts": '''
        import cProfile
        import pstats

        def f(x):
            return x * 2

        def run():
            for i in range(20):
                f(i)

        prof = cProfile.Profile()
        prof.runcall(run)
        stats = pstats.Stats(prof).stats
        print(sorted((k[2], v[1]) for k, v in stats.items() if k[2] in ("f", "run")))
    ''',
    # an exception raised through vaccinated frames and handled by the program:
    # the barrier runs with the profiler off and puts it back as it was
    # (3.11's cProfile is a C profiler: sys.setprofile(obj) broke it)
    "cprofile_handled_exceptions": '''
        import cProfile
        import pstats
        import sys

        def lookup(d, k):
            return d[k]

        def get(d, k):
            try:
                return lookup(d, k)
            except KeyError:
                return -1

        def run():
            return sum(get({1: 1}, i % 3) for i in range(30))

        prof = cProfile.Profile()
        print(prof.runcall(run))
        stats = pstats.Stats(prof).stats
        print(sorted((k[2], v[1]) for k, v in stats.items() if k[0] == __file__))
        # 3.12+: cProfile is a sys.monitoring tool, which sees every frame
        # (docs/limitations.md); 3.11's C profiler is suspended around daifu
        print([k for k in stats if "daifu" in k[0]] if sys.version_info < (3, 12) else [])
    ''',
    "setprofile_handled_exceptions": '''
        import sys

        def lookup(d, k):
            return d[k]

        def get(d, k):
            try:
                return lookup(d, k)
            except KeyError:
                return -1

        seen = []
        sys.setprofile(lambda frame, event, arg: seen.append((event, frame.f_code.co_name))
                       if event in ("call", "return") else None)
        get({}, 1)
        get({}, 2)
        sys.setprofile(None)
        print(seen)
    ''',
    "setprofile_events": '''
        import sys

        def g(x):
            return x + 1

        seen = []
        sys.setprofile(lambda frame, event, arg: seen.append((event, frame.f_code.co_name))
                       if event in ("call", "return") else None)
        g(1)
        g(2)
        sys.setprofile(None)
        print(seen)
    ''',
    "settrace_lines": '''
        import sys

        def h(x):
            y = x + 1
            return y * 2

        lines = []
        def tracer(frame, event, arg):
            if frame.f_code.co_name == "h":
                lines.append((event, frame.f_lineno - frame.f_code.co_firstlineno))
            return tracer
        sys.settrace(tracer)
        h(1)
        sys.settrace(None)
        print(lines)
    ''',
    "marshal_roundtrip": '''
        import marshal
        import types

        def k(x):
            y = 10 // x
            return y

        code = marshal.loads(marshal.dumps(k.__code__))
        print(types.FunctionType(code, globals())(2))
    ''',
    # a sys.monitoring tool answering DISABLE to an exception event (which
    # CPython refuses: ValueError, callback removed) sees the program's own
    # events only: daifu's reading of exception tables, on the path of an
    # exception the program handles, raises nothing it could see
    "monitoring_exception_events": '''
        import sys
        if not hasattr(sys, "monitoring"):  # (3.12+)
            print("no sys.monitoring")
            raise SystemExit
        E = sys.monitoring.events
        seen = []

        def disable(code, *args):
            seen.append(code.co_name)
            return sys.monitoring.DISABLE

        def raise_handle_reraise():
            try:
                1/0
            except:
                raise

        def handled():
            try:
                {}["k"]
            except KeyError:
                return 1

        sys.monitoring.use_tool_id(2, "test")
        for event in (E.RAISE, E.PY_UNWIND, E.EXCEPTION_HANDLED):
            sys.monitoring.register_callback(2, event, disable)
            sys.monitoring.set_events(2, event)
            try:
                handled()
                raise_handle_reraise()
            except Exception as exc:
                print(event, type(exc).__name__)
            finally:
                sys.monitoring.set_events(2, 0)
                sys.monitoring.register_callback(2, event, None)
        print(seen)
    ''',
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_tools_see_what_they_see_under_python(tmp_path, name):
    (tmp_path / "prog.py").write_text(textwrap.dedent(PROGRAMS[name]))
    plain = subprocess.run([sys.executable, "prog.py"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=60)
    assert plain.returncode == 0, plain.stderr
    got = run_daifu(["--log-file", "events.jsonl", "prog.py"], tmp_path, timeout=60)
    assert (got.returncode, got.stdout) == (0, plain.stdout), got.stderr
    assert "crash.intercepted" not in ((tmp_path / "events.jsonl").read_text()
                                       if (tmp_path / "events.jsonl").exists() else "")


def test_vaccinated_code_shipped_by_value_runs_unprotected_without_daifu(tmp_path):
    """The code of a vaccinated function, marshalled (as cloudpickle, Ray or
    Dask ship it) into a process where daifu never ran, runs; its exception
    is the plain one, with the plain traceback."""
    (tmp_path / "prog.py").write_text(textwrap.dedent('''
        import marshal

        def div(a, b):
            c = a / b
            return c

        for _ in range(2):
            div(1, 2)
        from daifu.cells import is_vaccinated
        assert is_vaccinated(div.__code__)
        with open("code.bin", "wb") as fh:
            fh.write(marshal.dumps(div.__code__))
    '''))
    shipped = run_daifu(["prog.py"], tmp_path, timeout=60)
    assert shipped.returncode == 0, shipped.stderr
    worker = textwrap.dedent('''
        import marshal, sys, types
        code = marshal.loads(open("code.bin", "rb").read())
        div = types.FunctionType(code, {"__name__": "w", "__builtins__": __builtins__})
        print(div(6, 3))
        assert not any(m.startswith("daifu") for m in sys.modules)
        div(1, 0)
    ''')
    got = subprocess.run([sys.executable, "-c", worker], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60)
    assert got.returncode == 1 and got.stdout == "2.0\n", got.stderr
    assert got.stderr.rstrip().endswith("ZeroDivisionError: division by zero")
    assert "c = a / b" in got.stderr and "daifu" not in got.stderr


@pytest.mark.torch
@pytest.mark.slow
def test_torch_compile_fullgraph_before_the_first_call(tmp_path):
    """Under --lazy, ``torch.compile(f, fullgraph=True)`` before ``f``'s first
    call met the stub and killed the program; by default ``f`` is its
    vaccinated code from the start, and Dynamo traces it into one graph."""
    pytest.importorskip("torch", reason="PyTorch not available")
    (tmp_path / "prog.py").write_text(textwrap.dedent('''
        import torch
        from daifu.cells import is_vaccinated

        def f(x):
            y = torch.sin(x) * 2
            return y + 1

        assert is_vaccinated(f.__code__)
        g = torch.compile(f, backend="eager", fullgraph=True)
        x = torch.linspace(0, 1, 5)
        assert torch.equal(g(x), torch.sin(x) * 2 + 1)
        print("ok")
    '''))
    got = run_daifu(["prog.py"], tmp_path, timeout=300)
    assert (got.returncode, got.stdout.strip()) == (0, "ok"), got.stderr[-3000:]
