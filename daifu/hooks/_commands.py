"""``python -m daifu COMMAND``: the commands that are not a program run.

``ps``, ``attach``, ``send`` reach a job waiting on a crash, ``stacks`` a
running one (``_remote``);
``journal`` lists and shows journals; ``doctor`` checks this machine's set-up;
``help`` prints the usage.  Each takes ``-h``/``--help``.  A script with one
of these names runs as ``./ps``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable

from .._private import check_private, open_private
from .._version import __version__
from ..cells import backend
from ..cells import default_directory as cache_directory
from ..engine import EndpointError, JournalError, journals, runtime_dir
from ..engine import journal_directory as default_directory
from . import _remote

USAGE = {
    "ps": ("python -m daifu ps [--json]\n  list this user's daifu jobs on this machine: "
           "those that wait on a crash first, then those running"),
    "attach": "python -m daifu attach PID\n  the console of a job waiting on a crash",
    "send": ("python -m daifu send [--job] PID COMMAND ...\n"
             "python -m daifu send --job PID --rank N COMMAND ...\n  one console "
             "command (retry, skip, next, abort, reload, exec CODE, p EXPR, vars, where);\n"
             "  --job: to every waiting rank of PID's distributed job at once, a decision for "
             "all ranks;\n  --job PID --rank N: to rank N of PID's job alone, on any node;\n"
             "  exit 0: the job resumed, 1: it still waits, 2: the command failed (or was not "
             "delivered: it will never run), 3: no such job"),
    "stacks": ("python -m daifu stacks [--job] PID\n  every thread's Python stack of a "
               "running job (also while it is blocked in C);\n  --job: of every rank of its "
               "distributed job on this machine, and which rank is behind"),
    "journal": ("python -m daifu journal [show JOURNAL|N]\n  list the journals (newest first, "
                "numbered), or show one: its crashes, patches and outcomes"),
    "doctor": "python -m daifu doctor\n  check Python, the private directories and the cache",
    "help": "python -m daifu help [COMMAND]\n  this help",
}


def _wants_help(args: list[str]) -> bool:
    return any(a in ("-h", "--help") for a in args)


def journal(args: list[str]) -> int:
    if not args:
        found = journals()
        if not found:
            print(f"no journals in {default_directory()}")
            return 0
        print(f"journals in {default_directory()} (newest first):")
        for n, entry in enumerate(found, 1):
            st = entry.stat(follow_symlinks=False)
            stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime(st.st_mtime))
            print(f"  {n:3d}  {stamp}  {st.st_size:>9,d} B  {entry.name}")
        return 0
    if args[0] != "show" or len(args) != 2:
        print(USAGE["journal"], file=sys.stderr)
        return 2
    target = args[1]
    if target.isdigit() and not os.path.exists(target):
        found = journals()
        if not 1 <= int(target) <= len(found):
            print(f"daifu journal: there is no journal number {target} "
                  f"({len(found)} in {default_directory()})", file=sys.stderr)
            return 2
        target = found[int(target) - 1].path
    return _show(target)


def _show(path: str) -> int:
    try:
        fd = open_private(path, "the journal", JournalError, os.O_RDONLY)
        with os.fdopen(fd, "rb") as fh:
            text = fh.read().decode("utf-8", errors="replace")
    except JournalError as exc:
        print(f"daifu journal: {exc}", file=sys.stderr)
        return 2
    print(path)
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            kind = rec.get("type")
        except (ValueError, AttributeError):
            print(f"  {n:4d}  (not a journal record)")
            continue
        when = rec.get("time", "")
        if kind == "crash":
            key = rec.get("key", {})
            print(f"  crash #{rec.get('crash')}  {when}  {key.get('exc_type')} at "
                  f"{rec.get('where')} in {key.get('function')}() (attempt {rec.get('attempt')})")
            print(f"      {key.get('statement')}")
            print(f"      {str(rec.get('message', ''))[:200]}")
        elif kind == "patch":
            print(f"    patch  {rec.get('status')}  {rec.get('kind')}  from {rec.get('origin')}: "
                  f"{rec.get('summary')}" + (f" -- {rec['error']}" if rec.get("error") else ""))
            if rec.get("kind") == "exec":
                for code_line in str(rec.get("code", "")).splitlines():
                    print(f"           | {code_line}")
        elif kind == "outcome":
            print(f"    outcome  {rec.get('action')}" +
                  (f" ({rec['reason']})" if rec.get("reason") else ""))
        elif kind == "repeat":
            print(f"  crash #{rec.get('crash')} again, handled the same way: "
                  f"{rec.get('count')} more time(s)")
        else:
            print(f"  {n:4d}  {kind}")
    return 0


def doctor(args: list[str]) -> int:
    """Check what daifu needs; exit 1 if something would keep it from working."""

    problems = 0

    def check(ok: bool, what: str, detail: str = "") -> None:
        nonlocal problems
        problems += not ok
        print(f"  [{'ok' if ok else 'FAIL'}] {what}" + (f": {detail}" if detail else ""))

    print(f"daifu {__version__}, Python {sys.version.split()[0]} ({sys.executable})")
    back, reason = backend()
    check(back is not None, "bytecode backend", reason or f"CPython {back.PYTHON[0]}."
          f"{back.PYTHON[1]}" if back is not None else reason or "")
    try:
        import bytecode  # lazy: 15.2 ms

        check(True, "bytecode library", getattr(bytecode, "__version__", "?"))
    except ImportError as exc:
        check(False, "bytecode library", str(exc))

    try:
        check(True, "private directory for control sockets", runtime_dir())
    except EndpointError as exc:
        check(False, "private directory for control sockets", str(exc))

    found = journals()
    size = sum(e.stat(follow_symlinks=False).st_size for e in found)
    check(True, "journals", f"{len(found)} in {default_directory()} ({size / 1e6:.1f} MB)")

    cache = cache_directory()
    if os.path.isdir(cache):
        try:
            check_private(cache, "the code cache", ValueError)
            check(True, "code cache", cache)
        except ValueError as exc:
            check(False, "code cache", str(exc))
    else:
        check(True, "code cache", f"{cache} (not created yet)")
    try:
        import torch  # lazy: 1.4 s

        check(True, "torch", f"{torch.__version__} (CUDA: {torch.cuda.is_available()})")
    except ImportError:
        check(True, "torch", "not installed (not needed by daifu itself)")
    print("all good" if not problems else f"{problems} problem(s)")
    return 1 if problems else 0


def help_(args: list[str], print_help: Callable[[], None]) -> int:
    """``python -m daifu help [COMMAND]`` (``print_help``: the runner's options)."""
    if args and args[0] in USAGE:
        print(USAGE[args[0]])
        return 0
    print_help()
    print("\ncommands:")
    for text in USAGE.values():
        print("  " + text.replace("\n", "\n  "))
    return 0


def run(name: str, args: list[str], print_help: Callable[[], None]) -> int:
    try:
        code = _run(name, args, print_help)
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader went away (``daifu ps | head``): quiet, as a shell tool
        # is; stdout now points nowhere, so the exit's flush does not raise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # (128 + SIGPIPE, what a shell reports for such a command)
    return code


def _run(name: str, args: list[str], print_help: Callable[[], None]) -> int:
    if _wants_help(args):
        print(USAGE[name])
        return 0

    table: dict[str, Callable[[list[str]], int]] = {
        "ps": _remote.ps, "attach": _remote.attach, "send": _remote.send,
        "stacks": _remote.stacks,
        "journal": journal, "doctor": doctor,
        "help": lambda args: help_(args, print_help)}
    return table[name](args)
