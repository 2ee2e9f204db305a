from __future__ import annotations

import os
import shutil
import sys
import tempfile

import pytest

from daifu.cells import options
from daifu.engine import ENGINE


@pytest.fixture(autouse=True)
def _fresh_engine():
    ENGINE.reset()
    saved = (options.strict, options.dump, options.cache)
    options.strict = True  # tests want transform failures to be loud
    options.cache = None  # tests that use the code cache say so (tests/test_cache.py)
    yield ENGINE
    ENGINE.reset()
    options.strict, options.dump, options.cache = saved


@pytest.fixture
def engine():
    return ENGINE


@pytest.fixture(params=["c", "python"])
def barrier_calls(request, monkeypatch):
    """The stubs call the C barrier (``_routes``), then in a second run the
    Python one (``_barrier.barrier``, what runs where the extension is not
    built); yields the list of the names of the frames whose barrier went on
    to judge the exception (``_barrier.judge``: no remembered route taken),
    and, for the Python barrier, also those of every barrier call, as
    ``(mode, judged, called)``."""
    from daifu.cells import RAISE_CODE
    from daifu.cells._cell import P_BARRIER, P_QUICK
    from daifu.engine import _barrier, _fastpath

    judged: list[str] = []
    called: list[str] = []
    real = _barrier.judge

    def judge(exc, ref, lasti, stack, frame):
        judged.append(frame.f_code.co_name)
        return real(exc, ref, lasti, stack, frame)

    entry, quick = _fastpath.passing[P_BARRIER], _fastpath.passing[P_QUICK]
    if request.param == "c":
        routes = speedups()
        c_barrier, c_quick = routes.install(_fastpath.ROUTES, _fastpath.passing, judge, RAISE_CODE)
        _fastpath.passing[P_BARRIER], _fastpath.passing[P_QUICK] = c_barrier, c_quick.__call__
    else:
        _fastpath.passing[P_BARRIER] = _barrier.barrier
        _fastpath.passing[P_QUICK] = _barrier.NO_QUICK_CHECK.__call__
        monkeypatch.setattr(_barrier, "judge", judge)
        monkeypatch.setattr(_barrier, "_getframe", lambda depth: called.append(
            sys._getframe(depth + 1).f_code.co_name) or sys._getframe(depth + 1))
    try:
        yield request.param, judged, called
    finally:
        if request.param == "c":
            routes.install(_fastpath.ROUTES, _fastpath.passing, real, RAISE_CODE)
        _fastpath.passing[P_BARRIER], _fastpath.passing[P_QUICK] = entry, quick


def speedups():
    """daifu's C extension (``daifu.engine._routes``); the test is skipped
    where it is not built, and fails under ``DAIFU_REQUIRE_SPEEDUPS=1``
    (``make test``)."""
    try:
        from daifu.engine import _routes  # type: ignore[attr-defined]
    except ImportError:
        if os.environ.get("DAIFU_REQUIRE_SPEEDUPS") == "1":
            raise
        pytest.skip("daifu's C extension (daifu/engine/_routes.c) is not built")
    return _routes


@pytest.fixture(autouse=True)
def _no_silent_daifu_errors(request):
    """A rule that fails (an ``assert`` inside a rule is swallowed and
    reported as ``rule.failed``) or an internal error of daifu fails the test,
    unless the test says it expects one (``@pytest.mark.daifu_errors``)."""
    from daifu.engine import _events

    seen: list = []

    def listen(ev) -> None:
        if ev.event in ("rule.failed", "daifu.internal_error"):
            seen.append(ev)

    _events._state.listeners.append(listen)
    yield
    _events._state.listeners.remove(listen)
    if seen and request.node.get_closest_marker("daifu_errors") is None:
        details = "\n".join(f"{ev.event}: {ev.fields().get('error')}\n"
                            f"{ev.fields().get('traceback', '')}" for ev in seen)
        pytest.fail(f"the test emitted {len(seen)} daifu error event(s):\n{details}")


def pytest_configure(config):
    # journals and control sockets of the jobs the tests start stay out of $HOME
    state = tempfile.mkdtemp(prefix="daifu-test-state-")
    config.add_cleanup(lambda: shutil.rmtree(state, ignore_errors=True))
    os.environ["XDG_STATE_HOME"] = state
    runtime = os.path.join(state, "run")
    os.mkdir(runtime, 0o700)
    os.environ["DAIFU_RUNTIME_DIR"] = runtime
    # the key that seals commands through a distributed job's store (_seal)
    os.environ["XDG_CONFIG_HOME"] = os.path.join(state, "config")
    # every job the tests start rewrites its code; the cache has its own tests
    os.environ["DAIFU_CACHE"] = "0"
    if os.environ.get("DAIFU_REQUIRE_TORCH") == "1":
        # `make test` (CI): a broken torch must fail, not skip the torch tests
        # (nor a missing tqdm the DataLoader tests and scenarios)
        import torch  # noqa: F401
        import tqdm  # noqa: F401
    if os.environ.get("DAIFU_REQUIRE_SPEEDUPS") == "1":
        # the C check of remembered routes, the C signal handlers and the
        # C walk of flat code are built (pip needs a C compiler)
        import daifu.cells._rewrite._cflat  # noqa: F401
        import daifu.engine._csignals  # noqa: F401
        import daifu.engine._routes  # noqa: F401
        import daifu.hooks._cmain  # noqa: F401
    if os.environ.get("DAIFU_REQUIRE_FRAMEWORKS") == "1":
        # the crash benchmark's Lightning and HF Trainer cases need them,
        # the StatefulDataLoader's resume torchdata
        import lightning  # noqa: F401
        import torchdata.stateful_dataloader  # noqa: F401
        import transformers  # noqa: F401
