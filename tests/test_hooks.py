"""The import hook: patterns, what it claims, and what keeps working."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
import threading
import warnings
import zipfile
from pathlib import Path

import pytest

import daifu
from daifu.cells import Selection, is_vaccinated, options, vaccinate_source
from daifu.hooks import DaifuFinder, ModuleMatcher, install, uninstall
from daifu.hooks._config import Config
from daifu.hooks._install import current

ROOT = Path(__file__).resolve().parents[1]


# -- patterns ------------------------------------------------------------------


@pytest.mark.parametrize(
    "patterns,name,expected",
    [
        ("ha", "ha", True),
        ("ha", "ha.sub.mod", True),
        ("ha", "haystack", False),
        ("ha", "haystack.sub", False),
        ("mylib.trainer.*", "mylib.trainer.loop", True),
        ("mylib.trainer.*", "mylib.trainer.loop.deep", True),
        ("mylib.trainer.*", "mylib.trainer", False),
        ("mylib.trainer.*", "mylib.data", False),
        ("train,exp_?", "exp_1", True),
        ("train,exp_?", "exp_12", False),
        ("*", "anything.at.all", True),
        ("*", "daifu.engine", False),  # never itself
        ("*", "bytecode", False),
        ("*.models", "proj.models", True),
        ("[ab]pkg", "apkg.x", True),
        ("[ab]pkg", "cpkg", False),
    ],
)
def test_patterns_match_on_package_boundaries(patterns, name, expected):
    assert ModuleMatcher.parse(patterns).matches(name) is expected


@pytest.mark.parametrize("bad", ["a..b", ".rel", "a.", "a b", "mod$", "a[b", "x/y"])
def test_bad_pattern_is_a_clear_error(bad):
    with pytest.raises(daifu.ConfigError, match="bad DAIFU_MODULES pattern"):
        ModuleMatcher.parse(bad)


def test_bad_pattern_at_runner_startup_exits_2(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("print('ran')\n")
    proc = subprocess.run([sys.executable, "-m", "daifu", str(script)], capture_output=True,
                          text=True, env={**os.environ, "DAIFU_MODULES": "good,bad..name"})
    assert proc.returncode == 2
    assert "bad DAIFU_MODULES pattern 'bad..name'" in proc.stderr
    assert "ran" not in proc.stdout


@pytest.mark.parametrize("name, value", [
    ("DAIFU_LAZY", "maybe"), ("DAIFU_CONSOLE", "2"), ("DAIFU_STRICT", "sure"),
    ("DAIFU_PEER_TIMEOUT", "abc"), ("DAIFU_PEER_TIMEOUT", "-1"), ("DAIFU_PEER_TIMEOUT", "nan")])
def test_a_bad_switch_or_timeout_is_one_clear_error_not_a_guess(name, value):
    from daifu.hooks._config import Config

    with pytest.raises(daifu.ConfigError, match=f"{name} must be .*got {value!r}"):
        Config.from_env({name: value})


@pytest.mark.parametrize("value, lazy", [("0", False), ("off", False), ("No", False),
                                         ("1", True), ("yes", True), ("", True)])
def test_switches_take_the_usual_spellings(value, lazy):
    from daifu.hooks._config import Config

    assert Config.from_env({"DAIFU_LAZY": value}).lazy is lazy


def test_find_spec_rejects_by_name_before_any_lookup():
    calls = []

    class Spy:
        def find_spec(self, name, path=None, target=None):
            calls.append(name)
            return None

    finder = DaifuFinder(ModuleMatcher.parse("targetpkg"), Selection())
    spy = Spy()
    sys.meta_path[:0] = [finder, spy]
    try:
        assert finder.find_spec("json.decoder", None) is None
        assert finder.find_spec("targetpkgx", None) is None
        assert calls == []
        assert finder.find_spec("targetpkg.sub", None) is None  # asked the rest, none found
        assert calls == ["targetpkg.sub"]
    finally:
        sys.meta_path.remove(finder)
        sys.meta_path.remove(spy)


# -- importing through the hook ---------------------------------------------------------


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A package on sys.path, cleaned out of sys.modules afterwards."""
    pkg = tmp_path / "hookpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .core import train\nVALUE = 1\n")
    (pkg / "core.py").write_text(textwrap.dedent('''
        from . import helpers

        def train(xs):
            out = []
            for x in xs:
                out.append(helpers.scale(x))
            return out

        def no_loop(x):
            return x + 1
    '''))
    (pkg / "helpers.py").write_text("def scale(x):\n    return 12 // x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield pkg
    uninstall()
    for name in list(sys.modules):
        if name.startswith("hookpkg"):
            del sys.modules[name]


def test_package_modules_vaccinated_and_recover(project):
    install(modules="hookpkg")
    import hookpkg

    assert is_vaccinated(hookpkg.core.train.__code__)
    # default: every top-level function too, at import (its own frame from the first call)
    assert is_vaccinated(hookpkg.core.no_loop.__code__)
    assert hookpkg.VALUE == 1

    @daifu.on(ZeroDivisionError)
    def fix(crash):
        crash.vars["x"] = 4
        return daifu.RETRY

    assert hookpkg.train([1, 0, 6]) == [12, 3, 2]


def test_entry_patterns_select_functions(project):
    install(modules="hookpkg", entry="no_loop", config=Config(lazy=False))  # (--no-lazy)
    import hookpkg.core

    assert is_vaccinated(hookpkg.core.no_loop.__code__)
    assert not is_vaccinated(hookpkg.core.train.__code__)


def test_reload_revaccinates(project):
    install(modules="hookpkg")
    import hookpkg.core

    first = hookpkg.core.train.__code__
    reloaded = importlib.reload(hookpkg.core)
    assert is_vaccinated(reloaded.train.__code__)
    assert reloaded.train.__code__ is not first


def test_import_in_thread(project):
    install(modules="hookpkg")
    result = {}

    def worker():
        import hookpkg.core

        result["vaccinated"] = is_vaccinated(hookpkg.core.train.__code__)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert result == {"vaccinated": True}


def test_no_pyc_written_and_stale_pyc_not_used(project):
    # a valid pyc of the unmodified code, as a plain import would leave it ...
    import py_compile

    cache = Path(py_compile.compile(str(project / "core.py"), doraise=True))
    stamp = cache.stat().st_mtime_ns
    # ... which the hook must not load, nor overwrite
    install(modules="hookpkg")
    import hookpkg.core as again

    assert is_vaccinated(again.train.__code__)
    assert cache.stat().st_mtime_ns == stamp


def test_zip_and_namespace_imports_fall_through(tmp_path, monkeypatch):
    archive = tmp_path / "bundle.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("zipmod.py", "def f():\n    for i in range(2):\n        pass\n    return 7\n")
    (tmp_path / "nspkg" / "inner").mkdir(parents=True)
    (tmp_path / "nspkg" / "inner" / "leaf.py").write_text("X = 3\n")
    monkeypatch.syspath_prepend(str(archive))
    monkeypatch.syspath_prepend(str(tmp_path))
    install(modules="zipmod,nspkg")
    try:
        import nspkg.inner.leaf
        import zipmod

        assert zipmod.f() == 7 and not is_vaccinated(zipmod.f.__code__)
        assert nspkg.inner.leaf.X == 3
    finally:
        uninstall()
        for name in ("zipmod", "nspkg", "nspkg.inner", "nspkg.inner.leaf"):
            sys.modules.pop(name, None)


def test_install_handle_is_a_context_manager(project):
    with install(modules="hookpkg") as handle:
        assert current() is handle.finder
        assert handle.finder in sys.meta_path
    assert current() is None


def test_syntax_error_surfaces_like_a_normal_import(tmp_path, monkeypatch):
    (tmp_path / "broken_mod.py").write_text("def f(:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    install(modules="broken_mod")
    try:
        with pytest.raises(SyntaxError):
            import broken_mod  # noqa: F401
    finally:
        uninstall()
        sys.modules.pop("broken_mod", None)


# -- things daifu cannot do: warn and run the original --------------------------------

ASYNC_SOURCE = '''
async def fetch(xs):
    out = []
    for x in xs:
        out.append(x)
    return out
'''


def test_unsupported_function_warns_and_runs_original():
    options.strict = False
    with pytest.warns(daifu.NotVaccinatedWarning, match="async functions"):
        code, report = vaccinate_source(ASYNC_SOURCE, "/daifu-tests/async_mod.py",
                                        Selection(("fetch",)))
    assert report.skipped and report.skipped[0][0] == "fetch"
    ns = {}
    exec(code, ns)
    assert not is_vaccinated(ns["fetch"].__code__)


@pytest.mark.parametrize("entry", ["*", "**"])
def test_an_async_function_a_wildcard_selects_is_reported_without_a_warning(entry):
    # a known limitation: '**' selected every async function of a module, and
    # each warned into the program's own warnings (under -W error the import
    # failed: CPython's test___all__); the report keeps it
    options.strict = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        code, report = vaccinate_source(ASYNC_SOURCE, "/daifu-tests/async_wild.py",
                                        Selection((entry,)))
    assert [name for name, _ in report.skipped] == ["fetch"]
    assert "async functions" in report.skipped[0][1]


def test_strict_mode_turns_it_into_an_error():
    options.strict = True
    with pytest.raises(daifu.TransformError, match="async functions") as info:
        vaccinate_source(ASYNC_SOURCE, "/daifu-tests/async_mod.py", Selection(("fetch",)))
    assert info.value.qualname == "fetch"


def test_unknown_python_version_refuses_cleanly(monkeypatch):
    from daifu.cells import _dispatch, _transform

    monkeypatch.setattr(_transform, "backend",
                        lambda: _dispatch.backend((3, 99)))
    from daifu._runtime import RUNTIME

    monkeypatch.setattr(RUNTIME, "warned_version", False)
    options.strict = False
    with pytest.warns(daifu.UnsupportedPythonWarning, match="Python 3.99"):
        code, report = vaccinate_source("def f():\n    for i in range(2):\n        pass\n",
                                        "/daifu-tests/v.py", Selection())
    ns = {}
    exec(code, ns)
    assert not is_vaccinated(ns["f"].__code__)


def test_dump_prints_rewritten_bytecode(capsys):
    options.dump = "-"
    vaccinate_source("def f(xs):\n    for x in xs:\n        x += 1\n", "/daifu-tests/d.py",
                     Selection())
    err = capsys.readouterr().err
    assert "=== daifu: vaccinated f" in err
    assert "__daifu_passing__" in err and "RERAISE" in err  # (the stubs: see _emit._passing)


def test_vaccinate_decorator_without_the_hook(tmp_path, monkeypatch):
    (tmp_path / "decorated_mod.py").write_text(textwrap.dedent('''
        import daifu

        @daifu.vaccinate
        def work(xs):
            return [10 // x for x in xs] if False else _loop(xs)

        def _loop(xs):
            out = []
            for x in xs:
                out.append(10 // x)
            return out

        @daifu.vaccinate
        def loop(xs):
            out = []
            for x in xs:
                out.append(10 // x)
            return out
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        import decorated_mod

        assert is_vaccinated(decorated_mod.loop.__code__)
        assert not is_vaccinated(decorated_mod._loop.__code__)

        @daifu.on(ZeroDivisionError)
        def fix(crash):
            crash.vars["x"] = 5
            return daifu.RETRY

        assert decorated_mod.loop([2, 0]) == [5, 2]
    finally:
        sys.modules.pop("decorated_mod", None)


def test_vaccinate_decorator_warns_without_source():
    options.strict = False
    ns = {}
    exec("def f():\n    for i in range(2):\n        pass\n", ns)
    with pytest.warns(daifu.NotVaccinatedWarning, match="source code is not available"):
        assert daifu.vaccinate(ns["f"]) is ns["f"]


# -- child processes ---------------------------------------------------------------------

MP_SCRIPT = '''
import multiprocessing as mp
import sys
import workmod

def child(q):
    q.put(("result", workmod.compute([4, 0, 2]), workmod.vaccinated()))

if __name__ == "__main__":
    for method in ("fork", "spawn"):
        ctx = mp.get_context(method)
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(q,))
        p.start()
        print(method, q.get(timeout=60), flush=True)
        p.join(60)
        print(method, "exit", p.exitcode, flush=True)
'''

WORKMOD = '''
def compute(xs):
    out = []
    for x in xs:
        out.append(8 // x)
    return out

def vaccinated():
    from daifu.cells import is_vaccinated
    return is_vaccinated(compute.__code__)
'''

MP_FIXES = '''
import daifu

@daifu.on(ZeroDivisionError)
def fix(crash):
    crash.vars["x"] = 8
    return daifu.RETRY
'''


@pytest.mark.slow
def test_multiprocessing_children_fork_and_spawn(tmp_path):
    (tmp_path / "mp_main.py").write_text(MP_SCRIPT)
    (tmp_path / "workmod.py").write_text(WORKMOD)
    (tmp_path / "fixes.py").write_text(MP_FIXES)
    proc = subprocess.run(
        [sys.executable, "-m", "daifu", "--modules", "workmod", "--fixes", "fixes.py",
         "mp_main.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "fork ('result', [2, 1, 4], True)" in lines
    assert "spawn ('result', [2, 1, 4], True)" in lines
    assert "fork exit 0" in lines and "spawn exit 0" in lines


def test_spawn_command_line_patch_is_idempotent():
    import multiprocessing.spawn as spawn

    from daifu.hooks._install import patch_spawn

    patch_spawn()
    patch_spawn()
    cmd = spawn.get_command_line(pipe_handle=5)
    assert cmd[cmd.index("-c") + 1].count("_daifu_child.activate()") == 1


def test_warnings_are_filterable_by_class():
    assert issubclass(daifu.NotVaccinatedWarning, daifu.DaifuWarning)
    assert issubclass(daifu.UnsupportedPythonWarning, daifu.NotVaccinatedWarning)
    with warnings.catch_warnings():
        warnings.simplefilter("error", daifu.NotVaccinatedWarning)
        options.strict = False
        with pytest.raises(daifu.NotVaccinatedWarning):
            vaccinate_source(ASYNC_SOURCE, "/daifu-tests/async2.py", Selection(("fetch",)))
