"""Differential suite: every corpus function, plain vs vaccinated.

Each function of ``corpus.py`` runs on its cases three times -- compiled
normally, with *every* function vaccinated (``DAIFU_ENTRY='**'``), and the same
vaccinated code stored in and loaded back from the code cache -- and must give
the same result or the same exception (type, args, traceback line numbers).
When the plain run does not raise, the engine must not have been entered at
all: exceptions a function handles itself never reach daifu.
"""

from __future__ import annotations

import copy
import inspect
import tempfile
import types
from pathlib import Path

import pytest

from daifu.cells import Selection, options, vaccinate_source
from daifu.cells._cache import CodeCache
from daifu.engine import ENGINE

CORPUS = Path(__file__).with_name("corpus.py")


_CACHE_DIR = tempfile.TemporaryDirectory(prefix="daifu-differential-")


def _load(vaccinated: bool, cached: bool = False) -> dict:
    source = CORPUS.read_text()
    name = "corpus_vaccinated" if vaccinated else "corpus_plain"
    if cached:
        saved, options.cache = options.cache, CodeCache(_CACHE_DIR.name)
        try:
            _, first = vaccinate_source(source, str(CORPUS), Selection(entries=("**",)),
                                        module=name)
            code, report = vaccinate_source(source, str(CORPUS), Selection(entries=("**",)),
                                            module=name)
        finally:
            options.cache = saved
        assert not first.cached and report.cached
    elif vaccinated:
        code, report = vaccinate_source(source, str(CORPUS), Selection(entries=("**",)),
                                        module=name)
        assert not report.skipped, report.skipped
    else:
        code = compile(source, str(CORPUS), "exec", dont_inherit=True)
    namespace = {"__name__": name, "__file__": str(CORPUS)}
    exec(code, namespace)
    return namespace


PLAIN = _load(False)
VACCINATED = _load(True)
CACHED = _load(True, cached=True)


def _tb_lines(exc: BaseException) -> list[tuple[str, int]]:
    out = []
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == str(CORPUS):
            out.append((tb.tb_frame.f_code.co_name, tb.tb_lineno))
        tb = tb.tb_next
    return out


def _outcome(fn, args):
    try:
        result = fn(*copy.deepcopy(args))
        if isinstance(result, types.GeneratorType):
            items = []
            try:
                for item in result:
                    items.append(item)
            except Exception as exc:  # noqa: BLE001 - recorded and compared
                return ("gen-raise", items, type(exc).__name__, repr(exc.args), _tb_lines(exc))
            return ("gen", items)
        return ("ok", result)
    except Exception as exc:  # noqa: BLE001 - recorded and compared
        return ("raise", type(exc).__name__, repr(exc.args), _tb_lines(exc))


def _cases():
    for name, fn in PLAIN.items():
        if inspect.isfunction(fn) and hasattr(fn, "cases") and fn.__module__ == "corpus_plain":
            for n, args in enumerate(fn.cases):
                yield pytest.param(name, args, n, id=f"{name}-{n}")


CASES = list(_cases())


def test_corpus_is_large_enough():
    functions = {c.values[0] for c in CASES}
    assert len(functions) >= 150, len(functions)


def test_every_corpus_function_was_vaccinated():
    from daifu.cells import is_vaccinated

    for namespace in (VACCINATED, CACHED):
        for name, fn in namespace.items():
            if inspect.isfunction(fn) and hasattr(fn, "cases"):
                assert is_vaccinated(fn.__code__), name


@pytest.mark.parametrize("name,args,index", CASES)
def test_plain_equals_vaccinated(name, args, index):
    ENGINE.reset()
    expected = _outcome(PLAIN[name], args)
    before = ENGINE.stats["crashes"]
    got = _outcome(VACCINATED[name], args)
    assert got == expected
    assert _outcome(CACHED[name], args) == expected, "differs when loaded from the code cache"
    known, why = getattr(PLAIN[name], "seen_by_daifu", ((), ""))
    if index in known:
        assert ENGINE.stats["crashes"] > before, f"limitation fixed? ({why}): update the corpus"
    elif expected[0] in ("ok", "gen"):
        assert ENGINE.stats["crashes"] == before, "the engine saw an exception the code handles"
