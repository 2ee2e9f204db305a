"""The code cache: what is stored, when it is used, and what it refuses."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
import types
import warnings
from pathlib import Path

import pytest

import daifu
from daifu import NotVaccinatedWarning, TransformError
from daifu.cells import Selection, _cache, options, vaccinate_source
from daifu.cells._cache import CodeCache
from daifu.hooks import Config

from .support import load_params, read_events, same_params

SOURCE = textwrap.dedent('''
    import daifu

    def accumulate(xs):
        total, unused = 0, (..., 1j, frozenset({1}), b"x", 1.5, None, True)
        for x in xs:
            total += 100 // x
        return total

    class Model:
        def step(self, xs):
            out = []
            for x in xs:
                out.append(x * 2)
            return out

    async def fetch():
        for _ in ():
            pass
''')

EVERYTHING = Selection(entries=("**",))


@pytest.fixture
def cache(tmp_path):
    options.cache = CodeCache(str(tmp_path / "cache"))
    options.strict = False
    return tmp_path / "cache"


def _vaccinate(source: str = SOURCE, selection: Selection = EVERYTHING,
               filename: str = "/daifu-tests/cached.py"):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, report = vaccinate_source(source, filename, selection, module="cached")
    return code, report, [w for w in caught if issubclass(w.category, NotVaccinatedWarning)]


def _same_code(a: types.CodeType, b: types.CodeType) -> None:
    assert (a.co_code, a.co_exceptiontable, a.co_linetable, a.co_stacksize, a.co_flags) == \
        (b.co_code, b.co_exceptiontable, b.co_linetable, b.co_stacksize, b.co_flags)
    assert (a.co_varnames, a.co_names, a.co_cellvars, a.co_freevars, a.co_qualname) == \
        (b.co_varnames, b.co_names, b.co_cellvars, b.co_freevars, b.co_qualname)
    assert len(a.co_consts) == len(b.co_consts)
    for x, y in zip(a.co_consts, b.co_consts):
        assert type(x) is type(y)
        if isinstance(x, types.CodeType):
            _same_code(x, y)
        elif isinstance(x, daifu.cells.Cell):
            assert (x.index, x.lineno, x.role, x.source, x.retry_reason, x.skip_reason,
                    x.with_slots, x.depth) == (y.index, y.lineno, y.role, y.source,
                                               y.retry_reason, y.skip_reason, y.with_slots,
                                               y.depth)
            assert repr(x.guards) == repr(y.guards)
        elif not callable(x):
            assert x == y or (x != x and y != y)
        else:
            assert x is y  # the engine's functions, by reference


def test_second_vaccination_loads_the_same_code_from_the_cache(cache):
    code, report, warned = _vaccinate()
    assert not report.cached and len(list(cache.iterdir())) == 1
    again, cached_report, warned_again = _vaccinate()
    assert cached_report.cached
    _same_code(code, again)
    assert [i.qualname for i in cached_report.vaccinated] == [i.qualname for i in report.vaccinated]
    # the object graph is rebuilt whole: cells point at the report's CodeInfo
    info = cached_report.vaccinated[0]
    assert all(cell.info is info for cell in info.cells)
    assert info.original is not None and not daifu.cells.is_vaccinated(info.original)
    # the async function '**' selected is reported, without a warning, from the
    # cache too; named, it warns again from the cache
    assert warned == warned_again == []
    assert cached_report.skipped == report.skipped and report.skipped[0][0] == "fetch"
    named = Selection(entries=("**", "fetch"))
    _, first, warned = _vaccinate(selection=named)
    _, cached_named, warned_again = _vaccinate(selection=named)
    assert cached_named.cached and not first.cached
    assert [str(w.message) for w in warned] == [str(w.message) for w in warned_again]
    assert any("fetch" in str(w.message) for w in warned_again)


def test_cached_code_recovers_a_crash(cache):
    _vaccinate()
    code, report, _ = _vaccinate()
    assert report.cached
    namespace = {"__name__": "cached"}
    exec(code, namespace)

    @daifu.on(ZeroDivisionError)
    def fix(crash):
        crash.vars["x"] = 50
        return daifu.RETRY

    assert namespace["accumulate"]([1, 0, 4]) == 100 + 2 + 25
    assert namespace["Model"]().step([1, 2]) == [2, 4]


def test_changed_source_or_selection_is_a_miss(cache):
    _vaccinate()
    changed = SOURCE.replace("100 // x", "200 // x")
    code, report, _ = _vaccinate(changed)
    assert not report.cached
    namespace = {}
    exec(code, namespace)
    assert namespace["accumulate"]([2]) == 100  # the new source, not the cached one
    assert len(list(cache.iterdir())) == 1  # one entry per file and selection: replaced
    assert _vaccinate(changed)[1].cached
    _, other, _ = _vaccinate(changed, Selection(entries=("accumulate",)))
    assert not other.cached and [i.qualname for i in other.vaccinated] == ["accumulate"]
    assert len(list(cache.iterdir())) == 2
    _, elsewhere, _ = _vaccinate(changed, filename="/daifu-tests/elsewhere.py")
    assert not elsewhere.cached


def test_another_daifu_version_is_a_miss_and_old_entries_go(cache, monkeypatch):
    _vaccinate()
    (old,) = cache.iterdir()
    monkeypatch.setattr(_cache, "fingerprint", lambda: b"another daifu, python or bytecode")
    assert not _vaccinate()[1].cached
    assert len(list(cache.iterdir())) == 2
    stale = _cache.time.time() - _cache.MAX_AGE_S - 60
    os.utime(old, (stale, stale))
    options.cache = CodeCache(str(cache))  # a new process: its first write prunes
    _vaccinate(filename="/daifu-tests/another.py")
    assert not old.exists() and len(list(cache.iterdir())) == 2


def test_damaged_entries_are_misses_and_get_rewritten(cache):
    _vaccinate()
    (entry,) = cache.iterdir()
    data = entry.read_bytes()
    entry.write_bytes(data[: len(data) // 2])
    assert not _vaccinate()[1].cached
    assert _vaccinate()[1].cached  # rewritten whole by the miss
    entry.write_bytes(b"not a daifu cache entry")
    assert not _vaccinate()[1].cached


def test_an_entry_naming_foreign_code_is_refused_unrun(cache, tmp_path):
    _vaccinate()
    (entry,) = cache.iterdir()
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.mkdir, (str(marker),))

    head = entry.read_bytes()[: len(_cache.MAGIC) + 32]  # valid magic and source hash
    entry.write_bytes(head + pickle.dumps((Evil(), None)))
    assert not _vaccinate()[1].cached
    assert not marker.exists()

    # a dotted name inside a daifu module reaches what that module imported
    def text(value: str) -> bytes:
        return b"\x8c" + bytes([len(value)]) + value.encode()

    escape = (b"\x80\x04" + text("daifu.cells._cache") + text("os.mkdir") + b"\x93"
              + text(str(marker)) + b"\x85R.")
    entry.write_bytes(head + escape)
    assert not _vaccinate()[1].cached
    assert not marker.exists()


def test_entries_others_could_write_are_ignored(cache):
    _vaccinate()
    (entry,) = cache.iterdir()
    assert entry.stat().st_mode & 0o777 == 0o600 and cache.stat().st_mode & 0o777 == 0o700
    entry.chmod(0o666)
    assert not _vaccinate()[1].cached


def test_a_directory_others_can_use_is_refused_with_a_warning(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    options.cache = CodeCache(str(shared))
    with pytest.warns(daifu.DaifuWarning, match="not using the code cache.*chmod 700"):
        code, report = vaccinate_source(SOURCE.replace("async ", ""), "/daifu-tests/s.py",
                                        EVERYTHING)
    assert report.vaccinated and not report.cached and not list(shared.iterdir())


def test_strict_mode_raises_on_a_cached_module_with_unvaccinated_functions(cache):
    _vaccinate()
    options.strict = True
    with pytest.raises(TransformError, match="fetch"):
        _vaccinate()


def test_dump_bypasses_the_cache(cache, tmp_path):
    _vaccinate()
    options.dump = str(tmp_path / "dump.txt")
    _, report, _ = _vaccinate()
    assert not report.cached and "accumulate" in (tmp_path / "dump.txt").read_text()


def test_configuration(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert Config(cache="0").code_cache() is None
    explicit = Config(cache="~/daifu-cache").code_cache()
    assert explicit.directory == os.path.expanduser("~/daifu-cache") and explicit.write
    on = Config(cache="1").code_cache()
    assert on.directory == str(tmp_path / "xdg" / "daifu") and on.write
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    default = Config().code_cache()
    assert default.directory == on.directory and default.write and default.quiet
    # python -B keeps __pycache__ out of source trees; daifu's private cache
    # is written all the same, so only the first start pays for the rewrite
    options.cache, options.strict = default, False
    source = SOURCE.replace("async ", "")
    assert not vaccinate_source(source, "/daifu-tests/b.py", EVERYTHING)[1].cached
    assert vaccinate_source(source, "/daifu-tests/b.py", EVERYTHING)[1].cached
    assert (tmp_path / "xdg" / "daifu").is_dir()
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    assert Config().code_cache().write
    monkeypatch.chdir(tmp_path)
    cfg = Config(cache="relative")
    monkeypatch.delenv("DAIFU_CACHE", raising=False)
    cfg.export()
    assert os.environ["DAIFU_CACHE"] == str(tmp_path / "relative")


CASE = Path(__file__).parent / "scenarios" / "lm_loss_shape_running"


@pytest.mark.slow
def test_a_job_loaded_from_the_cache_reloads_its_running_loop_exactly(tmp_path):
    """End to end: the second run of the same job loads its code from the cache
    and the edit + reload of the running training loop still gives the
    corrected program's exact parameters."""
    pytest.importorskip("torch", reason="PyTorch not available")
    work = tmp_path / "job"
    shutil.copytree(CASE, work)
    shutil.copy(CASE.parent / "_common.py", tmp_path / "_common.py")
    buggy = (work / "buggy.py").read_text()
    env = dict(os.environ, PYTHONHASHSEED="0", DAIFU_CACHE=str(tmp_path / "cache"),
               DAIFU_LOG_LEVEL="debug")
    ref = subprocess.run([sys.executable, "corrected.py", "--out", "reference.pt"], cwd=work,
                         env=env, capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr[-2000:]
    cached = []
    for run in range(2):
        (work / "buggy.py").write_text(buggy)  # the fix edits the file: start from the bug
        log = tmp_path / f"run{run}.jsonl"
        proc = subprocess.run([sys.executable, "-m", "daifu", "--log", str(log),
                               "--fixes", "fix.py", "buggy.py", "--out", f"live{run}.pt"],
                              cwd=work, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        events = read_events(log)
        (main,) = [e for e in events if e["event"] == "module.vaccinated"
                   and e["module"] == "__main__"]
        cached.append(main["cached"])
        assert [e for e in events if e["event"] == "crash.resumed"]
        assert same_params(load_params(work / f"live{run}.pt"), load_params(work / "reference.pt"))
    assert cached == [False, True]


def _main_cached(tmp_path, *options, run: int) -> bool:
    log = tmp_path / f"events{run}.jsonl"
    env = dict(os.environ, DAIFU_CACHE=str(tmp_path / "cache"), DAIFU_LOG_LEVEL="debug")
    proc = subprocess.run([sys.executable, "-m", "daifu", "--log", str(log), *options, "s.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout == "6\n", proc.stderr
    (event,) = [json.loads(line) for line in log.read_text().splitlines()
                if '"module.vaccinated"' in line]
    return event["cached"]


def test_the_runner_uses_the_cache_unless_told_not_to(tmp_path):
    (tmp_path / "s.py").write_text("total = 0\nfor i in range(4):\n    total += i\nprint(total)\n")
    assert [_main_cached(tmp_path, run=n) for n in range(2)] == [False, True]
    assert _main_cached(tmp_path, "--no-cache", run=2) is False
