"""``python -m daifu [options] script.py [args]`` / ``-m module [args]``.

Makes the target the real ``__main__`` (``sys.argv``, ``sys.path[0]``,
``__file__``, ``__spec__``, pickling of ``__main__`` objects) as ``python
script.py`` would, vaccinates it (module-level code and every function with a
loop), installs the import hook for ``DAIFU_MODULES``, and exits with the
status the script would have.  daifu's own frames are dropped from
tracebacks of the script's uncaught exceptions.
"""

from __future__ import annotations

import atexit
import builtins
import importlib.machinery
import importlib.util
import os
import runpy
import sys
import threading
import types
import warnings

from .. import __version__
from .._errors import ConfigError, NotVaccinatedWarning
from .._runtime import RUNTIME
from ..engine._crash import is_plumbing
from . import _logging
from ._config import Config, parse_wait
from ._finder import compile_vaccinated
from ._install import install

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    import argparse
    from typing import Any, NoReturn

USAGE = """\
python -m daifu [options] script.py [args ...]
       python -m daifu [options] -m module [args ...]
       python -m daifu ps                     (your jobs: running or waiting on a crash)
       python -m daifu attach PID             (console of a waiting job; pauses a running one)
       python -m daifu send PID COMMAND ...   (one command; exit 0 if the job resumed)
       python -m daifu send --job PID COMMAND ...  (to every waiting rank of PID's job)
       python -m daifu stacks [--job] PID     (every thread's stack; --job: every rank's)
       python -m daifu journal [show N]       (journals of crashes and fixes)
       python -m daifu doctor | help [COMMAND]"""

DESCRIPTION = """\
Run a Python program so that an exception that would crash it is stopped where
it happens, inside the live process.  Rules (daifu.on, in the script or in
--fixes files) can repair the state and retry or skip the failing statement;
without a fix the exception continues exactly as without daifu."""

EPILOG = """\
environment variables (options override them; child processes inherit them):
  DAIFU_MODULES       modules to vaccinate besides the script, e.g. 'mylib.*'
  DAIFU_ENTRY         functions to vaccinate: qualname globs, '*' = every
                      function containing a loop (default), '<module>' = module code;
                      every other function and method is vaccinated at import
  DAIFU_LAZY=1        like --lazy;  DAIFU_LAZY=0  like --no-lazy
  DAIFU_FIXES         rules files, separated by ':'
  DAIFU_MAX_ATTEMPTS  retries of one statement before giving up (default 5)
  DAIFU_PRELOAD=S     import what a crash needs S seconds after start (default 2; 0: at the crash)
  DAIFU_CHECKPOINT=0  like --no-checkpoint;  DAIFU_CHECKPOINT_DIR  like --checkpoint-dir
  DAIFU_GRACE=S       like --grace
  DAIFU_LOG           write events as JSON lines to this file
  DAIFU_LOG_LEVEL     debug | info | warning | error (default info)
  DAIFU_STRICT=1      a function that cannot be vaccinated is an error
  DAIFU_DUMP=1|FILE   print the rewritten bytecode (debugging)
  DAIFU_WAIT          like --wait; DAIFU_CONSOLE=0 like --no-console
  DAIFU_JOURNAL, DAIFU_REPLAY   like --journal, --replay
  DAIFU_CACHE         code cache: a directory, 0 (off, like --no-cache) or 1;
                      default ~/.cache/daifu (written under python -B too)

examples:
  python -m daifu --fixes fixes.py train.py --epochs 3
  DAIFU_MODULES=mylib python -m daifu -m mylib.train --lr 0.1"""



#: launchers of distributed jobs: under daifu they would be protected, not their workers
LAUNCHERS = ("torch.distributed.run", "torch.distributed.launch", "torchrun")

#: ``python -m daifu COMMAND``: not a program run (see ``_commands``)
COMMANDS = ("ps", "attach", "send", "stacks", "journal", "doctor", "help")


def _parser() -> argparse.ArgumentParser:
    import argparse  # (and gettext: only when there are options to parse)

    p = argparse.ArgumentParser(
        prog="python -m daifu", usage=USAGE, description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # `--max 3` is refused, not guessed (the script follows)
    )
    p.add_argument("--fixes", action="append", default=[], metavar="FILE",
                   help="load rules from FILE before the script starts (repeatable)")
    p.add_argument("--modules", metavar="PATTERNS",
                   help="also vaccinate these modules (comma-separated dotted globs)")
    p.add_argument("--entry", metavar="PATTERNS",
                   help="functions to vaccinate (qualname globs; '*' = every function with a loop)")
    p.add_argument("--lazy", action="store_true",
                   help="vaccinate the functions --entry does not select at their first call "
                        "instead of at import (faster imports; that one call runs under a "
                        "stub frame that debuggers and profilers see)")
    p.add_argument("--no-lazy", action="store_true",
                   help="vaccinate only the functions --entry selects (by default every other "
                        "function and method of a vaccinated module is vaccinated at import)")
    p.add_argument("--max-attempts", type=int, metavar="N",
                   help="give up after N failed retries of one statement (default 5)")
    p.add_argument("--log-file", "--log", dest="log", metavar="FILE",
                   help="write daifu's events as JSON lines to FILE ({rank}, {local_rank} "
                        "and {pid} in the name: one file per rank; --log is the same, but "
                        "launchers such as torchrun take --log for their own --log-dir)")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"))
    p.add_argument("--strict", action="store_true",
                   help="fail if a selected function cannot be vaccinated")
    p.add_argument("--dump", nargs="?", const="-", metavar="FILE",
                   help="print the rewritten bytecode to stderr (or FILE)")
    p.add_argument("--wait", metavar="SECONDS",
                   help="without a terminal: wait for a fix from `python -m daifu attach/send` "
                        "(SECONDS between commands, or 'inf'); default 0: give up at once")
    p.add_argument("--notify", metavar="CMD",
                   help="run the shell command CMD when the job starts waiting for a fix "
                        "(who crashed, where and how to attach are in its environment: "
                        "DAIFU_PID, DAIFU_WHERE, DAIFU_EXCEPTION, DAIFU_ATTACH, ...)")
    p.add_argument("--no-console", action="store_true",
                   help="never open the interactive console, even on a terminal")
    p.add_argument("--journal", metavar="FILE",
                   help="record crashes and patches here (JSON lines, mode 0600)")
    p.add_argument("--replay", metavar="JOURNAL",
                   help="re-apply the patches recorded in JOURNAL when the same crash recurs")
    p.add_argument("--unprotected", action="store_true",
                   help="on a Python daifu does not support, run the program anyway "
                        "(without crash interception) instead of refusing")
    p.add_argument("--no-cache", action="store_true",
                   help="rewrite vaccinated code at every start instead of using the code "
                        "cache (~/.cache/daifu)")
    p.add_argument("--checkpoint-dir", metavar="DIR",
                   help="where the emergency checkpoint goes when a crash is given up "
                        "(default ~/.local/state/daifu/checkpoints)")
    p.add_argument("--no-checkpoint", action="store_true",
                   help="do not save the training state when a crash is given up or the "
                        "job gets SIGTERM")
    p.add_argument("--grace", type=float, metavar="S",
                   help="on SIGTERM, wait up to S seconds (default 25) for the training loop "
                        "to finish its iteration, save the state, then end")
    p.add_argument("-V", "--version", action=_version_action(argparse), nargs=0,
                   help="show daifu's version, the Python it runs on and whether the "
                        "barrier's C check is in use, and exit")
    return p


def _version_action(argparse):
    class Version(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            print(version_line())
            parser.exit()
    return Version


def version_line() -> str:
    """``daifu X (CPython Y; the barrier's route check in C|in Python: why;
    signal handlers held back in C|in Python)``."""
    from ..engine import _barrier, _signals

    held = "in C" if _signals._csignals is not None else "in Python"
    return (f"daifu {__version__} (CPython {sys.version.split()[0]}; "
            f"the barrier's route check {_barrier.check}; signal handlers held back {held})")


def _split_argv(argv: list[str]) -> tuple[list[str], str | None, str | None, list[str]]:
    """Split into (daifu options, script, module, program args)."""
    takes_value = {"--fixes", "--modules", "--entry", "--max-attempts", "--log", "--log-file",
                   "--log-level",
                   "--wait", "--journal", "--replay", "--notify"}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "-m":
            if i + 1 >= len(argv):
                return argv[:i] + ["-m"], None, None, []
            return argv[:i], None, argv[i + 1], argv[i + 2 :]
        if arg == "--":
            rest = argv[i + 1 :]
            return argv[:i], (rest[0] if rest else None), None, rest[1:]
        if not arg.startswith("-") or arg == "-":
            return argv[:i], arg, None, argv[i + 1 :]
        if arg in takes_value:
            i += 2
            continue
        if arg == "--dump" and i + 1 < len(argv) and not argv[i + 1].startswith("-") and \
                not argv[i + 1].endswith(".py"):
            i += 2
            continue
        i += 1
    return argv, None, None, []


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in COMMANDS:  # `./ps` runs a script called ps
        from ._commands import run

        raise SystemExit(run(argv[0], argv[1:]))
    options, script, module, args = _split_argv(argv)
    ns: Any
    if options:  # (argparse, and what it imports, only when there is something to parse)
        parser = _parser()
        if "-m" in options:
            parser.error("-m needs a module name")
        ns = parser.parse_args(options)
    else:
        ns = types.SimpleNamespace(fixes=[], modules=None, entry=None, max_attempts=None,
                                   log=None, log_level=None, strict=False, dump=None, wait=None,
                                   notify=None, no_console=False, journal=None, replay=None,
                                   no_cache=False, unprotected=False, no_lazy=False,
                                   lazy=False, checkpoint_dir=None, no_checkpoint=False,
                                   grace=None)
    from ..cells import backend
    from ..cells._dispatch import SUPPORTED

    back, _reason = backend()
    if back is None and not ns.unprotected:
        supported = " and ".join(f"{a}.{b}" for a, b in SUPPORTED)
        sys.stderr.write(f"python -m daifu: error: daifu supports CPython {supported}, not "
                         f"{sys.implementation.name} {sys.version_info[0]}."
                         f"{sys.version_info[1]}; use one of those, or --unprotected to run the "
                         "program without crash interception\n")
        raise SystemExit(2)
    if script is None and module is None:
        _parser().print_usage(sys.stderr)
        sys.stderr.write("python -m daifu: error: no script or -m module given (see --help)\n")
        raise SystemExit(2)
    if module in LAUNCHERS or (script is not None and os.path.basename(script) in LAUNCHERS):
        sys.stderr.write(
            f"python -m daifu: error: {'-m ' + module if module else script} would vaccinate "
            "the launcher, not the workers it starts: nothing would be protected.  Put daifu "
            "in each worker instead:\n"
            "  torchrun [torchrun options] -m daifu [daifu options] train.py [args]\n")
        raise SystemExit(2)
    try:
        cfg = Config.from_env()
        if ns.fixes:
            cfg.fixes = tuple(cfg.fixes) + tuple(ns.fixes)
        if ns.modules is not None:
            cfg.modules = ns.modules
        if ns.entry is not None:
            cfg.entry = tuple(x.strip() for x in ns.entry.split(",") if x.strip()) or ("*",)
        if ns.max_attempts is not None:
            cfg.max_attempts = ns.max_attempts
        if ns.log:
            cfg.log = ns.log
        if ns.log_level:
            cfg.log_level = ns.log_level
        if ns.strict:
            cfg.strict = True
        if ns.dump:
            cfg.dump = ns.dump
        if ns.wait is not None:
            cfg.wait = parse_wait(ns.wait)
        if ns.notify:
            cfg.notify = ns.notify
        if ns.no_console:
            cfg.console = False
        if ns.journal:
            cfg.journal = ns.journal
        if ns.replay:
            cfg.replay = ns.replay
        if ns.lazy:
            cfg.lazy, cfg.eager = True, False
        if ns.no_lazy:
            cfg.lazy = False
        if ns.no_cache:
            cfg.cache = "0"
        if ns.checkpoint_dir:
            cfg.checkpoint_dir = ns.checkpoint_dir
        if ns.no_checkpoint:
            cfg.checkpoint = False
        if ns.grace is not None:
            cfg.grace = ns.grace
        cfg.validate()
        for path in cfg.fixes:
            if not os.path.isfile(path):
                raise ConfigError(f"fixes file not found: {path}")
        if cfg.dump and cfg.dump not in ("-", "1", "stderr"):
            # (0600, never through a symbolic link: it shows the program's code)
            from .._private import open_private

            os.close(open_private(cfg.dump, "the dump (--dump)", ConfigError, sink=True))
    except ConfigError as exc:
        sys.stderr.write(f"python -m daifu: error: {exc}\n")
        raise SystemExit(2) from None
    if script is not None:
        if not os.path.exists(script):
            # what `python missing.py` says, with the same status
            sys.stderr.write(f"{sys.executable}: can't open file {os.path.abspath(script)!r}: "
                             f"[Errno 2] No such file or directory\n")
            raise SystemExit(2)
        cfg.main = os.path.abspath(script)
    cfg.export()
    try:
        _logging.configure(cfg.log, cfg.log_level)
        cfg.setup_engine(script or module, interactive=True)
    except ConfigError as exc:
        sys.stderr.write(f"python -m daifu: error: {exc}\n")
        raise SystemExit(2) from None
    install(config=cfg)
    if cfg.checkpoint and "RANK" not in os.environ and "TORCHELASTIC_RUN_ID" not in os.environ:
        # SIGTERM: save at the loop's next iteration, then end as python does.  Not
        # in a rank of a distributed job: the launcher ends the peers of a failed
        # rank with SIGTERM while they wait in a collective, where no Python
        # handler can run -- they must die at once, as without daifu
        from ..engine import _preempt

        _preempt.install(cfg.grace)
    load_fixes(cfg.fixes, fatal=True)
    _install_excepthook()
    atexit.register(_summary)
    _register_job(script, module, args, cfg)
    if module is not None:
        _run_module(module, args, cfg)
    elif script is not None:
        _run_script(script, args, cfg)


def _register_job(script, module, args, cfg) -> None:
    """A job file for ``python -m daifu ps`` (removed at exit)."""
    import time

    from ..engine._rundir import register_job, unregister_job

    program = [script] if script is not None else ["-m", module]
    import threading

    from ..engine._break import serve_break
    from ..engine._events import job_file_info
    from ..engine._rundir import serve_stacks

    info = {"state": "running", "argv": [*program, *args], "cwd": os.getcwd(),
            "started": time.time(), "python": sys.version.split()[0],
            "log": cfg.log, "journal": cfg.journal, **job_file_info(),
            "stacks_signal": serve_stacks(), "break_signal": serve_break(),
            "main_thread": f"{threading.main_thread().ident:#018x}"}
    if register_job(info) is not None:
        atexit.register(unregister_job)


def _summary(fatal: BaseException | None = None) -> None:
    """Say what daifu did, once: before the traceback of an exception the
    program dies of (so that the program's own last line stays last), or at
    exit."""
    if RUNTIME.summarised:
        return
    RUNTIME.summarised = True
    from ..engine import ENGINE
    from ..engine._events import emit

    ENGINE.report_repeats()
    summary = ENGINE.summary(fatal)
    if summary is not None:
        emit(summary)


def load_fixes(paths, fatal: bool = False) -> None:
    """Execute rules files (each as its own module ``daifu_fixes_<n>``)."""
    for n, path in enumerate(paths):
        name = f"daifu_fixes_{n}_{os.path.splitext(os.path.basename(path))[0]}"
        try:
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot load {path}")
            mod = importlib.util.module_from_spec(spec)
            sys.modules[name] = mod
            spec.loader.exec_module(mod)
        except Exception:
            sys.stderr.write(f"python -m daifu: error: the fixes file {path} failed to load:\n")
            import traceback

            traceback.print_exc()
            if fatal:
                raise SystemExit(2) from None


def _new_main(file: str | None, spec, loader) -> types.ModuleType:
    """``__main__`` as ``python script.py`` and ``python -m mod`` (runpy) leave it: the
    same names in the same order, ``__annotations__`` an empty dict even in a script
    without annotations, ``__cached__`` the spec's for ``-m``."""
    main = types.ModuleType("__main__")
    main.__dict__.update(
        __package__=spec.parent if spec is not None else None, __loader__=loader,
        __spec__=spec, __annotations__={}, __builtins__=builtins, __file__=file,
        __cached__=spec.cached if spec is not None else None,
    )
    if file is None:
        del main.__file__
    sys.modules["__main__"] = main
    return main


def _compile_main(source: bytes, filename: str, cfg: Config) -> types.CodeType:
    return compile_vaccinated(source, filename, cfg.selection(module_level=True), "__main__")


def _check_entries(cfg: Config) -> None:
    """Warn about ``--entry`` names that select nothing: now, when only the
    script can match; at exit when modules imported later could."""
    def warn(when: str) -> None:
        missing = cfg.selection().unmatched()
        if missing:
            sys.stderr.write(f"daifu: warning: --entry/DAIFU_ENTRY {', '.join(map(repr, missing))} "
                             f"matched no function {when}; nothing was vaccinated for it\n")

    if cfg.matcher:
        atexit.register(warn, "in the script or the DAIFU_MODULES modules")
    else:
        warn("in the script")


def _syntax_error(exc: SyntaxError) -> NoReturn:
    """What ``python bad.py`` prints: the error, its line and caret, no traceback."""
    import traceback  # (traceback imports linecache, tokenize, textwrap: not at start-up)

    traceback.print_exception(type(exc), exc, None)
    raise SystemExit(1)


def _run_script(script: str, args: list[str], cfg: Config) -> None:
    path = os.path.abspath(script)
    if os.path.isdir(path):  # a directory with __main__.py, as Python runs it
        main_file = os.path.join(path, "__main__.py")
        if not os.path.isfile(main_file):  # named as python names it
            sys.stderr.write(f"{sys.executable}: can't find '__main__' module in "
                             f"{os.path.join(os.getcwd(), script)!r}\n")
            raise SystemExit(1)
        sys.argv[:] = [script, *args]
        sys.path[0] = path
        _run_file(main_file, cfg)
        return
    if not path.endswith(".py") and _is_zip(path):  # a zipapp, as python runs it
        warnings.warn(f"daifu: {script} is a zip application; it runs unmodified (daifu "
                      "vaccinates source files: unzip it and run its __main__.py)",
                      NotVaccinatedWarning, stacklevel=2)
        sys.argv[:] = [script, *args]
        del sys.path[0]  # run_path puts the archive there
        runpy.run_path(script, run_name="__main__")
        return
    sys.argv[:] = [script, *args]
    sys.path[0] = os.path.dirname(path)
    _run_file(path, cfg)


def _is_zip(path: str) -> bool:
    import zipfile  # (only for a script not named .py: start-up stays lean)

    try:
        return os.path.isfile(path) and zipfile.is_zipfile(path)
    except OSError:
        return False


def _run_file(path: str, cfg: Config) -> None:
    try:
        with open(path, "rb") as fh:
            source = fh.read()
    except OSError as exc:
        sys.stderr.write(f"{sys.executable}: can't open file {path!r}: [Errno {exc.errno}] "
                         f"{exc.strerror}\n")
        raise SystemExit(2) from None
    if b"\0" in source:  # what python says, with the file and line (compile() names neither)
        lineno = source.count(b"\n", 0, source.index(b"\0")) + 1
        text = source.splitlines()[lineno - 1].split(b"\0")[0].decode("utf-8", "replace")
        _syntax_error(SyntaxError("source code cannot contain null bytes",
                                  (path, lineno, None, text)))
    loader = importlib.machinery.SourceFileLoader("__main__", path)
    main = _new_main(path, None, loader)
    try:
        code = _compile_main(source, path, cfg)
    except SyntaxError as exc:
        _syntax_error(exc)
    _check_entries(cfg)
    exec(code, main.__dict__)


def _run_module(name: str, args: list[str], cfg: Config) -> None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as exc:  # a parent package is missing, ...
        sys.stderr.write(f"{sys.executable}: Error while finding module specification for "
                         f"{name!r} ({type(exc).__name__}: {exc})\n")
        raise SystemExit(1) from None
    if spec is None:
        sys.stderr.write(f"{sys.executable}: No module named {name}\n")
        raise SystemExit(1)
    if spec.submodule_search_locations is not None:  # a package: run pkg.__main__
        name = name + ".__main__"
        spec = importlib.util.find_spec(name)
        if spec is None:
            sys.stderr.write(f"{sys.executable}: No module named {name}; '{name[:-9]}' is a "
                             "package and cannot be directly executed\n")
            raise SystemExit(1)
    loader = spec.loader
    origin = spec.origin
    get_data = getattr(loader, "get_data", None)
    if origin is None or get_data is None or not origin.endswith(".py"):
        warnings.warn(f"daifu: {name} is not a source module; it runs unmodified",
                      NotVaccinatedWarning, stacklevel=2)
        sys.argv[:] = [origin or name, *args]
        runpy.run_module(name, run_name="__main__", alter_sys=True)
        return
    cfg.main = origin
    os.environ["DAIFU_MAIN"] = origin
    sys.argv[:] = [origin, *args]
    main = _new_main(origin, spec, loader)
    try:
        code = _compile_main(get_data(origin), origin, cfg)
    except SyntaxError as exc:
        _syntax_error(exc)
    _check_entries(cfg)
    exec(code, main.__dict__)


def strip_traceback(tb: types.TracebackType | None) -> types.TracebackType | None:
    """Drop daifu's runner frames (and runpy's) from the head of a traceback,
    and the frame of a first-call stub (``cells._lazy``) wherever it is: an
    exception in a function's first call shows the traceback it would show
    without daifu."""
    from ..cells._lazy import pending_of

    while tb is not None and is_plumbing(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    while tb is not None and pending_of(tb.tb_frame.f_code) is not None:
        tb = tb.tb_next
    entry = tb
    while entry is not None:
        after = entry.tb_next
        while after is not None and pending_of(after.tb_frame.f_code) is not None:
            after = after.tb_next
        if after is not entry.tb_next:
            entry.tb_next = after
        entry = after
    return tb


def _exit_by_sigint() -> None:
    """Keep python's exit through SIGINT after an uncaught ``KeyboardInterrupt``.

    CPython records it in a flag (``unhandled_keyboard_interrupt``) that it
    reads after finalising, and that every ``exec`` of a string clears
    (``run_eval_code_obj`` resets it first), in any thread: the preload's
    imports (dataclasses, namedtuples) or this hook's own would turn the exit
    into status 1.  So: stop the preload, then set the flag again, the one
    way CPython sets it -- a string exec that raises ``KeyboardInterrupt``."""
    try:
        from ..engine import _preload

        _preload.settle()
        exec("raise KeyboardInterrupt", {})  # noqa: S102 (a constant)
    except KeyboardInterrupt:
        pass
    except Exception:  # never worse than without daifu
        pass


def _install_excepthook() -> None:
    previous = sys.excepthook

    def excepthook(etype, value, tb):
        try:
            _summary(value)
        except Exception:
            pass
        stripped = strip_traceback(tb)
        if stripped is not tb and value is not None:
            value.__traceback__ = stripped
        previous(etype, value, stripped)
        if etype is KeyboardInterrupt and threading.current_thread() is threading.main_thread():
            _exit_by_sigint()

    excepthook._daifu = True  # type: ignore[attr-defined]
    sys.excepthook = excepthook
