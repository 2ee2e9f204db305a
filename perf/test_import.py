"""Import cost: the finder on names it does not claim, and transform time."""

from __future__ import annotations

import dis
import importlib.machinery
import statistics
import time
import types
from pathlib import Path

from conftest import ASSERT, record, size

from daifu.cells import Selection, options, vaccinate_source
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


def _instructions(code: types.CodeType) -> int:
    total = sum(1 for _ in dis.get_instructions(code))
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            total += _instructions(const)
    return total


def test_transform_time_per_function_and_instruction():
    source = (ROOT / "tests" / "differential" / "corpus.py").read_text()
    options.strict = False
    runs = []
    for _ in range(size(5, 1)):
        t0 = time.perf_counter()
        code, report = vaccinate_source(source, "corpus.py", Selection(("**",)))
        runs.append(time.perf_counter() - t0)
    t1 = time.perf_counter()
    for _ in range(size(5, 1)):
        compile(source, "corpus.py", "exec")
    plain = (time.perf_counter() - t1) / size(5, 1)
    seconds = statistics.median(runs) - plain
    functions = len(report.vaccinated)
    instructions = sum(_instructions(info.original) for info in report.vaccinated)
    record("Import cost", f"transform: {functions} functions, {instructions} instructions",
           seconds * 1e3, "ms", "", f"plus {plain * 1e3:.1f} ms to compile the module")
    record("Import cost", "  per vaccinated function", seconds / functions * 1e6, "us")
    record("Import cost", "  per bytecode instruction", seconds / instructions * 1e6, "us", "",
           "no cache: rewritten code holds live objects and is rebuilt at each import")
    assert functions > 200
