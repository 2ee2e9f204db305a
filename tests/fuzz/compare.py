"""One program, plain and vaccinated, in one forked child: the same?

The child (``os.fork()`` of the calling process: no interpreter start-up, and
a program that corrupts the interpreter, eats the memory or crashes it takes
only the child along) compiles the program plainly and runs it twice, then
vaccinates it (``vaccinate_source``, every function and the module code:
``Selection(entries=("**",), module_level=True)``) and runs it once more, each
time in a fresh namespace with stdout captured.  Each run's outcome (stdout,
exception type and message, the program's lines in its traceback, the types of
its context and cause, exit status)
goes back to the parent over a pipe as soon as it is known; the parent kills
the child when a run takes longer than its budget.

Verdicts: ``same``; ``differs`` (the plain runs agree, the vaccinated one does
not); ``unstable`` (the two plain runs differ: ids, addresses that survive the
normalisation, ... -- not compared; where the vaccinated run differs, the
plain program is run up to ``RECHECKS`` times more, each on a heap laid out
otherwise, and one of those differing from the first makes it unstable too);
``slow`` (a plain run over budget -- not compared).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import resource
import select
import signal
import sys
import time
import traceback

# (imported before the fork: each child starts with daifu loaded)
from daifu.cells import Selection, options, vaccinate_source
from daifu.engine import ENGINE

FILENAME = "/daifu-fuzz/program.py"
STEPS = 5000  # loop iterations and function calls (__guard__) per run
RECHECKS = 8  # plain runs more, each on another heap, before "differs"
MEMORY = 1 << 30  # the child's address space (bytes) on top of what it has at fork


# how the program is vaccinated: every function and the module code (the
# default); or as `python -m daifu` does by default (functions with a loop,
# the module code, every other function at import: "eager"), or with --lazy
# (every other function at its first call: "lazy")
SELECTIONS = {
    "all": Selection(("**",), True),
    "eager": Selection(("*",), True, lazy=True, eager=True),
    "lazy": Selection(("*",), True, lazy=True),
}


class Budget(BaseException):
    """A run used its ``STEPS``."""


_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")


def _outcome(code, exc_limit: int = 2000) -> dict:
    steps = [0]

    def guard():
        steps[0] += 1
        if steps[0] > STEPS:
            raise Budget("steps")

    def caught(line, exc):
        print("!", line, type(exc).__name__, _message(exc)[:200], _lines(exc), _chain(exc))

    def probe(*args, **kwargs):
        frame, chain = sys._getframe(1), []
        caller = frame
        while frame is not None and frame.f_code.co_filename == FILENAME:
            chain.append((frame.f_code.co_name, frame.f_lineno))
            frame = frame.f_back
        handling = sys.exc_info()[1]
        print("probe", chain, sorted(k for k in caller.f_locals if k.startswith("name_")),
              type(handling).__name__ if handling is not None else None, len(args) + len(kwargs))
        return len(args) + len(kwargs)

    namespace = {"__name__": "__main__", "__file__": FILENAME, "__guard__": guard,
                 "__caught__": caught, "__probe__": probe, "__builtins__": __builtins__}
    out = io.StringIO()
    exc = None
    with contextlib.redirect_stdout(out):
        try:
            exec(code, namespace)
        except BaseException as caught:  # noqa: BLE001 - compared
            exc = caught
    result = {"stdout": _ADDRESS.sub("0x?", out.getvalue())[:20000]}
    if exc is None:
        result.update(exception=None, status=0)
        return result
    if isinstance(exc, SystemExit):
        code_ = exc.code
        status = 0 if code_ is None else code_ if isinstance(code_, int) else 1
    else:
        status = 1
    result.update(exception=type(exc).__name__, message=_message(exc)[:exc_limit],
                  lines=_lines(exc), chain=_chain(exc), status=status)
    return result


def _message(exc: BaseException) -> str:
    try:
        return _ADDRESS.sub("0x?", str(exc))
    except BaseException as bad:  # noqa: BLE001 - str() of a generated exception may fail
        return f"<str() raised {type(bad).__name__}>"


def _lines(exc: BaseException) -> list[int]:
    """The program's lines in the exception's traceback."""
    return [line for frame, line in traceback.walk_tb(exc.__traceback__)
            if frame.f_code.co_filename == FILENAME]


def _chain(exc: BaseException) -> list[str]:
    """The types of its context and cause, and theirs (``!`` where the context
    is suppressed)."""
    out: list[str] = []
    seen = {id(exc)}
    while len(out) < 10:
        nxt = exc.__cause__ or exc.__context__
        if nxt is None or id(nxt) in seen:
            break
        out.append(("!" if exc.__suppress_context__ else "") + type(nxt).__name__)
        seen.add(id(nxt))
        exc = nxt
    return out


def _child(source: str, write_fd: int, selection: Selection) -> None:
    os.setpgid(0, 0)  # (the parent kills the group)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # (python's, not the parent's)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    usage = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    limit = usage + MEMORY
    resource.setrlimit(resource.RLIMIT_AS, (limit if hard == -1 else min(limit, hard), hard))
    # no console, no waiting, no checkpoint for a crash daifu gives up
    os.environ.update(DAIFU_CONSOLE="0", DAIFU_WAIT="0", DAIFU_CHECKPOINT="0")
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)  # (daifu's reports of the crashes it gives up)
    sys.stderr = open(os.devnull, "w")  # noqa: SIM115

    def send(obj):
        os.write(write_fd, (json.dumps(obj) + "\n").encode())

    import warnings

    warnings.simplefilter("ignore")
    sys.setrecursionlimit(1000)
    try:
        code = compile(source, FILENAME, "exec", dont_inherit=True)
        plain = _outcome(code)
        send(plain)
        # the second plain run with the heap laid out otherwise: a program
        # whose output hangs on addresses (a set of functions: hashed by id,
        # iterated in address order) differs from itself, not compared
        perturb = [bytearray(n) for n in range(1, 4000, 7)] + [object() for _ in range(3000)]
        send(_outcome(code))
        del perturb
        # as `python -m daifu` has it (the test suite's conftest makes a
        # function that cannot be vaccinated an error, and turns off the cache)
        options.strict, options.dump, options.cache = False, None, None
        ENGINE.reset()
        vcode, report = vaccinate_source(source, FILENAME, selection, module="__main__")
        if report.skipped:
            send({"skipped": [list(s) for s in report.skipped]})
        vaccinated = _outcome(vcode)
        send(vaccinated)
        if vaccinated != plain:
            # before "differs": the plain program again, the heap laid out
            # another way each time -- one whose output hangs on addresses
            # (a set of functions, iterated in address order) comes out
            # otherwise now and then even when the two runs above agreed
            for n in range(1, 1 + RECHECKS):
                perturb = [bytearray(size) for size in range(n, 2000 * n, 5 + n)]
                perturb += [type(f"T{i}", (), {}) for i in range(n * 7)]
                again = _outcome(code)
                del perturb
                send({"recheck": again})
                if again != plain:
                    break
    except BaseException as exc:  # noqa: BLE001 - the harness failed: said, never hidden
        send({"harness": f"{type(exc).__name__}: {exc}",
              "traceback": traceback.format_exc()[-3000:]})
    finally:
        os._exit(0)


_WARM = "def f():\n    return name_9\n\ntry:\n    f()\nexcept NameError:\n    pass\nname_9\n"


def _warm_up() -> None:
    """One crash that daifu gives up, here in the parent: the first one of a
    process loads what the engine needs (~0.3 s), each child inherits it."""
    global _WARM
    if not _WARM:
        return
    import importlib.metadata  # noqa: F401 - what daifu's first event imports (~0.3 s)

    import structlog  # noqa: F401
    options.strict, options.dump, options.cache = False, None, None
    saved = {k: os.environ.get(k) for k in ("DAIFU_CONSOLE", "DAIFU_WAIT", "DAIFU_CHECKPOINT")}
    os.environ.update(DAIFU_CONSOLE="0", DAIFU_WAIT="0", DAIFU_CHECKPOINT="0")
    try:
        ENGINE.reset()
        code, _ = vaccinate_source(_WARM, "/daifu-fuzz/warm.py", Selection(("**",), True),
                                   module="__main__")
        with contextlib.redirect_stderr(io.StringIO()), contextlib.suppress(NameError):
            exec(code, {"__name__": "__main__"})
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        ENGINE.reset()
        _WARM = ""


def run(source: str, budget: float = 2.0, mode: str = "all") -> dict:
    """Run ``source`` plain twice and vaccinated once; ``{"verdict": ...,
    "plain": outcome, "vaccinated": outcome}``.  ``budget``: seconds a plain
    run may take (the vaccinated one gets 3 times as much, plus a second);
    ``mode``: a key of SELECTIONS."""
    import linecache

    _warm_up()
    linecache.cache[FILENAME] = (len(source), None, source.splitlines(True), FILENAME)
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _child(source, write_fd, SELECTIONS[mode])
    os.close(write_fd)
    try:
        results, killed = _collect(read_fd, budget)
    except BaseException:  # (interrupted: the child goes too)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
    if killed:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    return _verdict(results, killed, status)


def _collect(read_fd: int, budget: float) -> tuple[list[dict], bool]:
    """The child's outcomes as they come, until it ends or is over budget."""
    results: list[dict] = []
    buffer = b""
    started = time.monotonic()
    killed = False
    with os.fdopen(read_fd, "rb", buffering=0) as pipe:
        while True:
            phase = len([r for r in results if "stdout" in r])
            rechecks = len([r for r in results if "recheck" in r])
            limit = (budget * (1 + phase) if phase < 2
                     else budget * 5 + 1 + budget * (rechecks + (phase > 2)))
            left = started + limit - time.monotonic()
            if left <= 0:
                killed = True
                break
            ready, _, _ = select.select([pipe], [], [], left)
            if not ready:
                continue
            chunk = pipe.read(1 << 16)
            if not chunk:
                break
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            results.extend(json.loads(line) for line in lines if line)
    return results, killed


def _verdict(results: list[dict], killed: bool, status: int) -> dict:
    harness = [r for r in results if "harness" in r]
    skipped = [r["skipped"] for r in results if "skipped" in r]
    runs = [r for r in results if "stdout" in r]
    signalled = os.WIFSIGNALED(status) and not killed
    end = (f"killed by signal {os.WTERMSIG(status)}" if signalled
           else "over its time budget" if killed else None)
    verdict: dict = {"plain": runs[0] if runs else None,
                     "vaccinated": runs[2] if len(runs) > 2 else None}
    if skipped:
        verdict["skipped"] = skipped[0]
    if len(runs) < 2:
        verdict["verdict"] = "slow" if killed else "harness"
        verdict["why"] = end or (harness[0] if harness else "no result")
    elif runs[0] != runs[1]:
        verdict["verdict"] = "unstable"
    elif len(runs) < 3:
        # the plain runs ended, the vaccinated one did not: its harness failed
        # (daifu's rewrite raised), it died, or it took far longer
        verdict["verdict"] = "differs"
        verdict["why"] = end or (harness[0] if harness else "no result")
    elif runs[2] != runs[0]:
        rechecks = [r["recheck"] for r in results if "recheck" in r]
        if any(again != runs[0] for again in rechecks):
            # the plain program differed from itself on another heap
            verdict["verdict"] = "unstable"
        else:
            verdict["verdict"] = "differs"
            verdict["why"] = "outcome"
    else:
        verdict["verdict"] = "same"
    return verdict


def explain(verdict: dict, limit: int = 1500) -> str:
    """Plain vs vaccinated, for a failure message."""
    def show(outcome):
        if outcome is None:
            return "None"
        return json.dumps({k: v[:limit] + "..." * (len(v) > limit) if isinstance(v, str) else v
                           for k, v in outcome.items()}, indent=1)

    return (f"{verdict['verdict']} ({str(verdict.get('why', ''))[:limit]})\n"
            f"plain:      {show(verdict['plain'])}\n"
            f"vaccinated: {show(verdict['vaccinated'])}")
