"""Import cost: the finder on names it does not claim, and transform time."""

from __future__ import annotations

import dis
import functools
import importlib.machinery
import statistics
import time
import types
from pathlib import Path

import pytest
from conftest import ASSERT, fresh, record, size

from daifu.cells import Selection, options, vaccinate_source
from daifu.cells._cache import CodeCache
from daifu.hooks import DaifuFinder, ModuleMatcher

ROOT = Path(__file__).resolve().parents[1]
NAMES = ["json.decoder", "email.mime.text", "torch.nn.functional", "numpy.linalg", "mylibrary",
         "xml.etree.ElementTree", "concurrent.futures.thread", "collections.abc"]


def _per_call(fn, n: int) -> float:
    best = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best.append((time.perf_counter() - t0) / n)
    return min(best)


def test_find_spec_on_names_it_does_not_claim(benchmark):
    finder = DaifuFinder(ModuleMatcher.parse("mylib,train,experiments.*"), Selection())
    names = NAMES * 10

    def reject():
        for name in names:
            finder.find_spec(name, None)

    benchmark.group = "import"
    benchmark(reject)
    ours = _per_call(reject, size(200, 5)) / len(names)
    # what a normal lookup of those modules costs (file-system search by PathFinder)
    stdlib = [n for n in NAMES if n.split(".")[0] in ("json", "email", "xml", "concurrent",
                                                      "collections")]

    def lookup():
        for name in stdlib:
            importlib.machinery.PathFinder.find_spec(name.split(".")[0])

    theirs = _per_call(lookup, size(20, 2)) / len(stdlib)
    record("Import cost", "find_spec for a module daifu does not claim", ours * 1e9, "ns")
    record("Import cost", "  the regular path lookup of a top-level module (for scale)",
           theirs * 1e6, "us", "daifu adds < 5%",
           f"daifu adds {ours / theirs:.2%} to it")
    if ASSERT:
        assert ours < 0.05 * theirs


def _median_time(fn, rounds: int) -> float:
    """Median wall time of ``rounds`` calls of ``fn``."""
    runs = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def _instructions(code: types.CodeType) -> int:
    total = sum(1 for _ in dis.get_instructions(code))
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            total += _instructions(const)
    return total


def test_transform_time_per_function_and_instruction(tmp_path):
    source = (ROOT / "tests" / "differential" / "corpus.py").read_text()
    options.strict = False
    selection = Selection(("**",))
    rounds = size(5, 1)
    timed = functools.partial(_median_time, rounds=rounds)

    plain = timed(lambda: compile(source, "corpus.py", "exec"))
    # without a cache: what the first import of a module costs
    options.cache = None
    rewrite = timed(lambda: vaccinate_source(source, "corpus.py", selection))
    # with the code cache warm: what every later import costs
    options.cache = CodeCache(str(tmp_path / "cache"))
    try:
        _, report = vaccinate_source(source, "corpus.py", selection)
        assert not report.cached
        cached = timed(lambda: vaccinate_source(source, "corpus.py", selection))
        assert vaccinate_source(source, "corpus.py", selection)[1].cached
    finally:
        options.cache = None
    entry = sum(p.stat().st_size for p in (tmp_path / "cache").iterdir())
    seconds = rewrite - plain
    functions = len(report.vaccinated)
    instructions = sum(_instructions(info.original) for info in report.vaccinated)
    record("Import cost", f"transform: {functions} functions, {instructions} instructions",
           seconds * 1e3, "ms", "", f"plus {plain * 1e3:.1f} ms to compile the module")
    record("Import cost", "  per vaccinated function", seconds / functions * 1e6, "us")
    record("Import cost", "  per bytecode instruction", seconds / instructions * 1e6, "us", "",
           "no cache: the first import of a module")
    record("Import cost", "  the same module from the code cache", cached * 1e3, "ms", "",
           f"{rewrite / cached:.0f}x faster than rewriting, {cached / plain:.2f}x a plain "
           f"compile; entry {entry / 1e6:.1f} MB on disk")
    record("Import cost", "  per vaccinated function, cached", cached / functions * 1e6, "us")
    assert functions > 200
    if ASSERT:
        assert cached < rewrite / 10


def test_import_cost_with_the_lazy_selection(tmp_path):
    """``--lazy``: functions with a loop rewritten at import, every other
    function and method given a first-call stub.  Cold (no cache) and
    cached, against a plain compile of the same module."""
    source = _model_like(40)
    options.strict = False
    selection = Selection(("*",), lazy=True)
    eager = Selection(("**",))
    rounds = size(5, 1)
    timed = functools.partial(_median_time, rounds=rounds)

    options.cache = None
    plain = timed(lambda: compile(source, "corpus.py", "exec"))
    cold = timed(lambda: vaccinate_source(source, "corpus.py", selection))
    everything = timed(lambda: vaccinate_source(source, "corpus.py", eager))
    # stubs alone: no function selected for the import-time rewrite
    stubs_only = timed(lambda: vaccinate_source(source, "corpus.py",
                                                Selection(("-",), lazy=True)))
    _, report = vaccinate_source(source, "corpus.py", selection)
    options.cache = CodeCache(str(tmp_path / "cache"))
    try:
        vaccinate_source(source, "corpus.py", selection)
        cached = timed(lambda: vaccinate_source(source, "corpus.py", selection))
        assert vaccinate_source(source, "corpus.py", selection)[1].cached
    finally:
        options.cache = None
    eager_n, lazy_n = len(report.vaccinated), len(report.lazy)
    record("Import cost", f"--lazy: {eager_n} loop functions rewritten, {lazy_n} "
           "stubs", cold * 1e3, "ms", "", f"{cold / plain:.1f}x a plain compile "
           f"({plain * 1e3:.1f} ms); every function rewritten: {everything * 1e3:.0f} ms")
    record("Import cost", f"  stubs only ({eager_n + lazy_n} functions, none rewritten)",
           stubs_only * 1e3, "ms", "", f"{stubs_only / plain:.2f}x a plain compile; "
           f"{(stubs_only - plain) / (eager_n + lazy_n) * 1e6:.0f} us per stub")
    record("Import cost", "  the same, from the code cache", cached * 1e3, "ms", "",
           f"{cached / plain:.2f}x a plain compile")
    # the first call of a stubbed function: its rewrite, once
    ns: dict = {"__name__": "models"}
    exec(vaccinate_source(source, "models.py", selection)[0], ns)
    import linecache

    linecache.cache["models.py"] = (len(source), None, source.splitlines(True), "models.py")
    blocks = [ns[f"Block{i}"](i) for i in range(40)]
    t0 = time.perf_counter()
    for b in blocks:
        b.forward(1.0)
    first = (time.perf_counter() - t0) / len(blocks)
    record("Import cost", "  first call of a stubbed function (its rewrite)", first * 1e6, "us")
    assert lazy_n >= 200
    if ASSERT:
        assert cold < everything / 2


def _model_like(classes: int) -> str:
    """A module shaped like model code: classes of short methods, few loops."""
    out = ["import math\n"]
    for i in range(classes):
        out.append(f"""
class Block{i}:
    def __init__(self, width, depth=2, *, scale=1.0):
        self.width = width
        self.depth = depth
        self.scale = scale

    def forward(self, x):
        y = self.norm(x) * self.scale
        y = y + self.width
        return self.act(y)

    def norm(self, x):
        return x / math.sqrt(self.depth + 1)

    def act(self, x):
        return max(x, 0.0)

    def extra_repr(self):
        return f"width={{self.width}}, depth={{self.depth}}"

    def reset(self):
        for _ in range(self.depth):
            self.width += 0
""")
    return "".join(out)


def _long_function(statements: int) -> str:
    body = "\n".join(f"    x{i} = x{i - 1} + {i}" if i else "    x0 = a" for i in range(statements))
    head = "def big(a):\n    for _ in range(1):\n        pass\n"
    return f"{head}{body}\n    return x{statements - 1}\n"


def linearity(small: int, large: int, rounds: int) -> tuple[float, float]:
    """Seconds to vaccinate a function of ``small`` and of ``large`` statements
    (best of ``rounds``; run in a fresh interpreter by the test)."""
    options.strict = False
    options.cache = None

    def seconds(n: int) -> float:
        source = _long_function(n)
        runs = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            vaccinate_source(source, f"big{n}.py", Selection(("*",)))
            runs.append(time.perf_counter() - t0)
        return min(runs)

    seconds(small)  # warm-up
    return seconds(small), seconds(large)


def test_transform_time_is_linear_in_function_size():
    """A 4x longer function costs ~4x, not 16x (the statement lookup was a
    linear scan per instruction: 2.5k statements took 7.5 s, 10k 119 s).
    Measured in a fresh interpreter (``fresh``)."""
    small, large = size(500, 50), size(2000, 200)
    a, b = fresh("test_import", "linearity", small, large, size(3, 1))
    ratio = b / a
    record("Import cost", f"transform of one function: {small} statements", a * 1e3, "ms")
    record("Import cost", f"  {large} statements", b * 1e3, "ms", "ratio < 6 (linear: 4)",
           f"ratio {ratio:.1f}")
    if ASSERT:
        assert ratio < 6


def test_runner_start_up(tmp_path):
    """What ``python -m daifu script.py`` adds to a program's start: wall time
    (median, side by side with plain ``python``), daifu's own import time, and
    the modules loaded before the program's first line."""
    import os
    import subprocess
    import sys

    script = tmp_path / "empty.py"
    script.write_text("import sys\nprint(len(sys.modules))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    plain, daifu = [sys.executable, str(script)], [sys.executable, "-m", "daifu", str(script)]

    def once(argv) -> tuple[float, int]:
        t0 = time.perf_counter()
        out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120).stdout
        return time.perf_counter() - t0, int(out.strip().splitlines()[-1])

    once(plain), once(daifu)  # warm-up: .pyc files written
    runs = size(11, 3)
    p, d = [], []
    for n in range(runs):
        for argv, acc in ((plain, p), (daifu, d)) if n % 2 == 0 else ((daifu, d), (plain, p)):
            acc.append(once(argv))
    wall_p = statistics.median(t for t, _ in p)
    wall_d = statistics.median(t for t, _ in d)
    importtime = subprocess.run([sys.executable, "-X", "importtime", "-m", "daifu", str(script)],
                                capture_output=True, text=True, env=env, timeout=120).stderr
    own = max((int(line.split("|")[1]) for line in importtime.splitlines()
               if line.rstrip().endswith("| daifu")), default=0)
    record("Start-up", "python -m daifu script.py (an empty script)", wall_d * 1e3, "ms",
           "<= 2x plain", f"{wall_d / wall_p:.1f}x plain python ({wall_p * 1e3:.0f} ms)")
    record("Start-up", "  importing daifu", own / 1e3, "ms", "", "python -X importtime")
    record("Start-up", "  modules loaded before the program runs", d[0][1], "", "",
           f"plain python {p[0][1]}")


def yardstick(classes: int, rounds: int) -> tuple[float, float, int]:
    """Median seconds of vaccinating a module of model-like classes and of
    ``bytecode``'s decode + assemble of its methods, alternating, and how many
    methods (run in a fresh interpreter by the test)."""
    import bytecode

    source = _model_like(classes)
    options.strict = False
    options.cache = None
    plain = compile(source, "models.py", "exec")
    codes = [c for k in plain.co_consts if isinstance(k, types.CodeType)
             for c in k.co_consts if isinstance(c, types.CodeType)]

    def ours():
        vaccinate_source(source, "models.py", Selection(("**",)))

    def theirs():
        for code in codes:
            bytecode.Bytecode.from_code(code).to_code()

    a: list[float] = []
    b: list[float] = []
    for r in range(rounds):
        for fn, acc in ((ours, a), (theirs, b)) if r % 2 == 0 else ((theirs, b), (ours, a)):
            t0 = time.perf_counter()
            fn()
            acc.append(time.perf_counter() - t0)
    return statistics.median(a), statistics.median(b), len(codes)


def test_rewrite_against_the_bytecode_yardstick():
    """The rewrite of one function, side by side with what the ``bytecode``
    library itself takes to decode and assemble the same function (the
    yardstick: the rewrite is both, plus the analysis and the stubs).
    Measured in a fresh interpreter (``fresh``)."""
    ours, theirs, n = fresh("test_import", "yardstick", size(40, 4), size(5, 1))
    ratio = ours / theirs
    record("Import cost", f"rewrite of one function ({n} methods)", ours / n * 1e6, "us",
           "<= 2x the yardstick",
           f"{ratio:.1f}x the yardstick (the whole module: its code, class bodies, methods)")
    record("Import cost", "  yardstick: bytecode's decode + assemble of it", theirs / n * 1e6,
           "us")
    if ASSERT:
        assert ratio <= 2.0, f"the rewrite takes {ratio:.1f}x bytecode's decode + assemble"


def _small_functions(n: int) -> str:
    body = "".join(f"def f{i}(a, b=2):\n    x = a + b * {i}\n    if x > 10:\n"
                   f"        y = [x, a]\n    else:\n        y = (x, b)\n    return len(y) + x\n"
                   for i in range(n))
    return body + f"s = 0\nfor i in range({n}):\n    s += globals()[f'f{{i}}'](i)\nprint(s)\n"


#: what the children run first (``sitecustomize``, on ``PYTHONPATH``): their
#: peak RSS, written at exit.  The kernel's ``ru_maxrss`` of a child counts
#: the memory of the process it was forked from (pytest's, before ``exec``);
#: ``VmHWM`` is the high-water mark of the program's own address space.
_HWM = """import atexit, os
def _hwm(path=os.environ.get("DAIFU_PERF_HWM")):
    if path:
        with open("/proc/self/status") as f:
            kb = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
        with open(path, "w") as out:
            out.write(kb)
atexit.register(_hwm)
"""


def _run(argv: list[str], env: dict, tmp: Path) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of one child process."""
    import os
    import subprocess

    (tmp / "site").mkdir(exist_ok=True)
    (tmp / "site" / "sitecustomize.py").write_text(_HWM)
    hwm = tmp / "hwm"
    hwm.unlink(missing_ok=True)
    path = os.pathsep.join(p for p in (str(tmp / "site"), env.get("PYTHONPATH")) if p)
    env = {**env, "DAIFU_PERF_HWM": str(hwm), "PYTHONPATH": path}
    t0 = time.perf_counter()
    out = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         timeout=600)
    wall = time.perf_counter() - t0
    assert out.returncode == 0, out.stderr.decode()[-4000:]
    return wall, int(hwm.read_text()) / 1024


#: issue 33.3's workloads: name, program, daifu's options, and the targets of
#: the first start's time and peak RSS and of the later starts' time (a
#: target not met yet, or met at the edge of this machine's noise, is
#: reported, not asserted).  The programs run with
#: ``PYTHONDONTWRITEBYTECODE=1``, daifu's own ``.pyc`` files written (as pip
#: writes them).
COLD = [
    ("print('hello')", "print('hello')\n", [],
     "<= 1.5x plain (not met)", "", "<= 2x plain (not met)"),
    ("600 small functions, each called once", None, [],
     "<= 4x plain", "", "<= 2x plain"),
    ("3000 module-level statements", "".join(f"v{i} = {i} * 2 + len('abc')\n"
                                              for i in range(3000)) + "print(v2999)\n", [],
     "<= 3x plain", "<= 1.3x plain", "<= 2x plain"),
    ("import networkx, --modules 'networkx.*'", "import networkx\nprint(networkx.__version__)\n",
     ["--modules", "networkx.*"], "", "", ""),
]


@pytest.mark.parametrize("case", range(len(COLD)), ids=[c[0] for c in COLD])
def test_cold_start(tmp_path, case):
    """A program's first start under ``python -m daifu`` (no code cache for
    it yet) and its later starts (the code cache), against ``python prog.py``,
    side by side in one run: wall time and peak RSS (the median run's)."""
    import compileall
    import os
    import sys

    import daifu

    name, program, opts, time_target, rss_target, warm_target = COLD[case]
    # daifu's own .pyc, as an installed daifu has them (an editable install
    # under PYTHONDONTWRITEBYTECODE has none: every start compiles daifu)
    compileall.compile_dir(str(Path(daifu.__file__).parent), quiet=1)
    script = tmp_path / "prog.py"
    script.write_text(program if program is not None else _small_functions(size(600, 60)))
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    plain = [sys.executable, str(script)]
    under = [sys.executable, "-m", "daifu", *opts, str(script)]
    p, cold, warm, full = [], [], [], []
    for r in range(size(5, 1)):
        cache = str(tmp_path / f"cache{r}")
        p.append(_run(plain, {**env, "DAIFU_CACHE": "0"}, tmp_path))
        cold.append(_run(under, {**env, "DAIFU_CACHE": cache}, tmp_path))
        warm.append(_run(under, {**env, "DAIFU_CACHE": cache}, tmp_path))
        full.append(_run(under, {**env, "DAIFU_CACHE": cache + "f", "DAIFU_ARM": "0"},
                         tmp_path))
    (p_s, p_mb), (c_s, c_mb), (w_s, w_mb), (f_s, f_mb) = (
        (statistics.median(t for t, _ in x), statistics.median(m for _, m in x))
        for x in (p, cold, warm, full))
    section = "Cold start (PYTHONDONTWRITEBYTECODE=1)"
    record(section, f"{name}: python", p_s * 1e3, "ms", "", f"peak RSS {p_mb:.0f} MB")
    record(section, "  python -m daifu, first start (no code cache; armed)", c_s * 1e3, "ms",
           time_target, f"{c_s / p_s:.1f}x plain")
    record(section, "    its peak RSS", c_mb, "MB", rss_target, f"{c_mb / p_mb:.1f}x plain")
    record(section, "  python -m daifu --no-arm, first start (all rewritten)", f_s * 1e3, "ms",
           "", f"{f_s / p_s:.1f}x plain; peak RSS {f_mb:.0f} MB, {f_mb / p_mb:.1f}x")
    record(section, "  python -m daifu, later starts (code cache)", w_s * 1e3, "ms",
           warm_target, f"{w_s / p_s:.1f}x plain; peak RSS {w_mb:.0f} MB")
    # (a target met with room is asserted; one "(not met)" or "(at the edge)"
    # is reported only)
    for what, target, ratio in (("first start", time_target, c_s / p_s),
                                ("its peak RSS", rss_target, c_mb / p_mb),
                                ("later starts", warm_target, w_s / p_s)):
        bound = _bound(target)
        if ASSERT and bound is not None:
            assert ratio <= bound, (name, what, ratio)


def _bound(target: str) -> float | None:
    """The ratio a target such as ``<= 3x plain`` asserts (None: a target
    reported only -- none, or one marked as not met or at the edge)."""
    if not target.startswith("<= ") or not target.endswith("x plain"):
        return None
    return float(target[3:-len("x plain")])
