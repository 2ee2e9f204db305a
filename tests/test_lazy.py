"""Vaccination at first call (``Selection.lazy``, the runner's default).

Every function and method defined at a module's top level or in a class body
gets a stub at import and its vaccinated code when first called: a crash in a
function without a loop (a framework's ``training_step``) is recoverable with
default settings, and the import costs microseconds per function."""

from __future__ import annotations

import inspect
import linecache
import os
import subprocess
import sys
import textwrap
import warnings

import pytest

import daifu
from daifu.cells import Selection, is_vaccinated, original_code, vaccinate_source

from .support import vaccinate

SOURCE = '''
import functools

class Base:
    def name(self):
        return "base"

class Model(Base):
    scale = 2

    def step(self, x, y=2, *rest, k=3, **kw):
        return (super().name(), x * self.scale, y, rest, k, kw)

    @staticmethod
    def add(a, /, b):
        return a + b

    @classmethod
    def make(cls):
        return cls()

    @property
    def size(self):
        return 7

def double(n):
    """Twice n."""
    return n * 2

def outer(a, *, b=1):
    def inner(z):
        return z + a
    return inner(b)

def loop(n):
    total = 0
    for i in range(n):
        total += double(i)
    return total

@functools.lru_cache(maxsize=None)
def cached(x):
    return x + 1

def gen():
    yield 1

async def coro():
    return 1

lam = lambda v: v + 1
'''


@pytest.fixture(autouse=True)
def _not_strict():
    """Strict mode rewrites every function at import (it must report them all
    then); these tests are about the default."""
    from daifu.cells import options

    options.strict = False
    yield


def load(source: str = SOURCE, name: str = "lazymod", lazy: bool = True):
    ns = vaccinate(source, entries=("*",), name=name, lazy=lazy)
    return ns, ns["__report__"]


def test_which_functions_get_a_stub_and_which_are_rewritten_at_import():
    ns, report = load()
    assert sorted(report.lazy) == sorted(
        ["Base.name", "Model.step", "Model.add", "Model.make", "Model.size", "double", "outer",
         "cached"])
    assert [c.qualname for c in report.vaccinated] == ["loop"]
    # generators, coroutines, nested functions and lambdas keep the import-time rule
    for fn in (ns["gen"], ns["coro"], ns["lam"]):
        assert not is_vaccinated(fn.__code__) and original_code(fn.__code__) is fn.__code__
    assert inspect.isgeneratorfunction(ns["gen"]) and inspect.iscoroutinefunction(ns["coro"])


def test_a_stub_behaves_like_the_function_and_installs_the_vaccinated_code():
    ns, _ = load()
    Model = ns["Model"]
    m = Model()
    before = Model.step.__code__
    assert not is_vaccinated(before)
    assert original_code(before).co_qualname == "Model.step"
    assert inspect.signature(Model.step) == inspect.signature(
        compile_plain()["Model"].step)
    assert m.step(1, 5, 6, 7, k=9, z=1) == ("base", 2, 5, (6, 7), 9, {"z": 1})
    assert is_vaccinated(Model.step.__code__)
    assert m.step(3) == ("base", 6, 2, (), 3, {})
    assert Model.add(1, b=2) == 3 and is_vaccinated(Model.add.__code__)
    with pytest.raises(TypeError, match="positional-only"):
        Model.add(a=1, b=2)
    assert isinstance(Model.make(), Model) and m.size == 7
    assert ns["outer"](1, b=4) == 5 and ns["loop"](4) == 12 and ns["cached"](1) == 2
    assert inspect.getsource(ns["double"]).startswith("def double(n):")
    assert ns["double"].__doc__ == "Twice n." and Model.step.__doc__ is None


def compile_plain():
    ns: dict = {"__name__": "plainmod"}
    exec(compile(textwrap.dedent(SOURCE), "/daifu-tests/plainmod.py", "exec"), ns)
    return ns


def test_a_crash_in_the_first_call_of_a_function_without_a_loop_is_recovered():
    ns, _ = load('''
        table = {}

        def lookup(key):
            value = table[key]
            return value * 2
    ''', name="lazycrash")

    @daifu.on(KeyError, where="lookup")
    def fill(crash):
        crash.globals["table"][crash.vars["key"]] = 21
        return daifu.RETRY

    assert ns["lookup"]("x") == 42
    ns["table"].clear()
    assert ns["lookup"]("y") == 42  # and a later call, in the installed code


def test_a_function_that_cannot_be_vaccinated_warns_at_first_call_and_runs_unmodified():
    ns, report = load('''
        def f(x):
            return x + 1
    ''', name="lazyfallback")
    assert report.lazy == ["f"]
    from daifu.cells import _lazy

    stub = ns["f"].__code__
    p = _lazy.pending_of(stub)
    p.source = None
    from daifu.cells import _registry

    _registry.forget("/daifu-tests/lazyfallback.py")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert ns["f"](1) == 2
    assert any("not vaccinated" in str(w.message) for w in seen)
    assert ns["f"].__code__ is p.original and ns["f"](2) == 3


def test_strict_mode_rewrites_at_import():
    from daifu.cells import options

    options.strict = True
    ns, report = load(name="strictmod")
    assert report.lazy == [] and is_vaccinated(ns["double"].__code__)


def test_no_lazy_keeps_the_import_time_selection():
    ns, report = load(name="eagermod", lazy=False)
    assert report.lazy == [] and not is_vaccinated(ns["double"].__code__)
    assert original_code(ns["double"].__code__) is ns["double"].__code__


def test_stubs_survive_the_code_cache(tmp_path):
    from daifu.cells import CodeCache, options

    source = textwrap.dedent(SOURCE)
    filename = str(tmp_path / "cachedmod.py")
    (tmp_path / "cachedmod.py").write_text(source)
    linecache.checkcache(filename)
    options.cache = CodeCache(str(tmp_path / "cache"))
    try:
        _, first = vaccinate_source(source, filename, Selection(lazy=True), module="cachedmod")
        code, second = vaccinate_source(source, filename, Selection(lazy=True),
                                        module="cachedmod")
    finally:
        options.cache = None
    assert not first.cached and second.cached and second.lazy == first.lazy
    ns = {"__name__": "cachedmod"}
    exec(code, ns)
    assert ns["Model"]().step(1) == ("base", 2, 2, (), 3, {})
    assert is_vaccinated(ns["Model"].step.__code__)


def test_the_runner_recovers_a_crash_in_a_method_with_default_settings(tmp_path):
    (tmp_path / "train.py").write_text(textwrap.dedent('''
        import daifu

        @daifu.on(ZeroDivisionError, where="Module.training_step")
        def fix(crash):
            crash.vars["self"].divisor = 1
            return daifu.RETRY

        class Module:
            divisor = 0

            def training_step(self, batch):
                loss = batch / self.divisor
                return loss

        class Trainer:  # a framework: the loop is not in the user's file
            pass

        def fit(module, batches):
            return [module.training_step(b) for b in batches]

        print(fit(Module(), [1, 2, 3]))
    '''))
    run = subprocess.run([sys.executable, "-m", "daifu", "train.py"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, env=os.environ.copy())
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[1.0, 2.0, 3.0]"
    off = subprocess.run([sys.executable, "-m", "daifu", "--no-lazy", "train.py"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, env=os.environ.copy())
    assert off.returncode == 1 and "ZeroDivisionError" in off.stderr


@pytest.mark.slow
def test_torch_compile_and_torchscript_of_stubbed_functions(tmp_path):
    pytest.importorskip("torch", reason="PyTorch not available")
    (tmp_path / "compiled.py").write_text(textwrap.dedent('''
        import torch, torch.nn as nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(4, 2)

            def forward(self, x):
                return torch.relu(self.lin(x)) * 2

        def f(x):
            return torch.sin(x) + 1

        torch.manual_seed(0)
        net, x = Net(), torch.randn(3, 4)
        fast = torch.compile(f, backend="eager")
        assert torch.equal(fast(x), torch.sin(x) + 1) and torch.equal(fast(x), f(x))
        assert torch.equal(torch.compile(net, backend="eager")(x), net(x))
        assert torch.jit.script(Net())(x).shape == (3, 2)
        print("ok")
    '''))
    run = subprocess.run([sys.executable, "-m", "daifu", "compiled.py"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300, env=os.environ.copy())
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "ok"


def test_an_uncaught_exception_in_a_first_call_shows_no_stub_frame(tmp_path):
    (tmp_path / "s.py").write_text(textwrap.dedent('''
        def fails(x):
            return 1 // x

        def caller():
            return fails(0)

        caller()
    '''))
    run = subprocess.run([sys.executable, "-m", "daifu", "s.py"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, env=os.environ.copy())
    plain = subprocess.run([sys.executable, "s.py"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=120)
    tail = run.stderr[run.stderr.index("Traceback"):]
    assert tail == plain.stderr


def test_a_rule_for_a_caller_gets_the_crash_before_a_human_is_asked():
    # the crash is taken first in the helper that raises it (stubbed, so
    # vaccinated now); the rule is for its caller: nobody is asked at the helper
    from daifu.engine import ENGINE

    ns, _ = load('''
        def helper(d):
            return 10 // d

        def caller(d):
            total = 0
            for _ in range(1):
                total += helper(d)
            return total
    ''', name="lazyrules")
    asked = []

    class Human:
        def wait(self, crash, engine):
            asked.append(crash.function)
            return None

    @daifu.on(ZeroDivisionError, where="caller")
    def fix(crash):
        crash.vars["d"] = 5
        return daifu.RETRY

    ENGINE.waiters.append(Human())
    assert ns["caller"](0) == 2
    assert asked == []
