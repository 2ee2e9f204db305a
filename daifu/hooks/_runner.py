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
import time
import types
import warnings
import zipimport

from .._errors import ConfigError, NotVaccinatedWarning
from .._private import open_private
from .._runtime import RUNTIME
from .._version import __version__
from ..cells import SUPPORTED, backend, flat_arming, pending_of
from ..engine import (
    ENGINE,
    emit,
    install_preemption,
    is_plumbing,
    job_file_info,
    register_job,
    serve_break,
    serve_stacks,
    settle_preload,
    speedups,
    unregister_job,
)
from . import _logging
from ._config import BY_FLAG, OPTIONS, Config, variables_help
from ._finder import compile_vaccinated
from ._install import install
from ._project import Project

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    import argparse
    from typing import Any, NoReturn

USAGE = """\
python -m daifu [options] script.py [args ...]
       python -m daifu [options] -m module [args ...]
       python -m daifu ps                     (your jobs: running or waiting on a crash)
       python -m daifu attach PID             (console of a waiting job; pauses a running one)
       python -m daifu send PID COMMAND ...   (one command; exit 0: the job resumed,
                                              1: it still waits, 2: refused, 3: no such job)
       python -m daifu send --job PID COMMAND ...  (to every waiting rank of PID's job)
       python -m daifu stacks [--job] PID     (every thread's stack; --job: every rank's)
       python -m daifu journal [show N]       (journals of crashes and fixes)
       python -m daifu doctor | help [COMMAND]"""

DESCRIPTION = """\
Run a Python program so that an exception that would crash it is stopped where
it happens, inside the live process.  Rules (daifu.on, in the script or in
--fixes files) can repair the state and retry or skip the failing statement;
without a fix the exception continues exactly as without daifu."""

EXAMPLES = """\
examples:
  python -m daifu --fixes fixes.py train.py --epochs 3
  DAIFU_MODULES=mylib python -m daifu -m mylib.train --lr 0.1"""


#: launchers of distributed jobs: under daifu they would be protected, not their workers
LAUNCHERS = ("torch.distributed.run", "torch.distributed.launch", "torchrun")

#: tools that run the program named on their command line (``python -m daifu
#: -m cProfile -s tottime train.py``): the tool runs as it is, and the program it
#: compiles is vaccinated as a script is (``_run_tool``)
TOOLS = ("cProfile", "profile", "pdb", "trace")

#: ``python -m daifu COMMAND``: not a program run (see ``_commands``)
COMMANDS = ("ps", "attach", "send", "stacks", "journal", "doctor", "help")


def _parser() -> argparse.ArgumentParser:
    import argparse  # (and gettext: only when there are options to parse)  # lazy: 2.9 ms

    p = argparse.ArgumentParser(
        prog="python -m daifu", usage=USAGE, description=DESCRIPTION,
        epilog=variables_help() + "\n\n" + EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # `--max 3` is refused, not guessed (the script follows)
    )
    for opt in OPTIONS:  # (each option is declared there, once)
        if not opt.flags:
            continue
        kw: dict[str, Any] = {"dest": opt.dest, "help": opt.help}
        if opt.version:
            kw.update(action=_version_action(argparse), nargs=0)
        elif not opt.takes_value:
            kw.update(action="store_true")
        else:
            kw.update(metavar=opt.metavar, choices=opt.choices)
            if opt.repeat:
                kw.update(action="append", default=[])
            if opt.bare is not None:
                kw.update(nargs="?", const=opt.bare)
        p.add_argument(*opt.flags, **kw)
    return p


def _version_action(argparse):
    class Version(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            print(version_line())
            parser.exit()
    return Version


def version_line() -> str:
    """``daifu X (CPython Y; the barrier's route check in C|in Python: why;
    signal handlers held back in C|in Python; flat code armed in C|in
    Python, its trap laid out ahead of time|by the rewrite)``."""

    check, held = speedups()
    return (f"daifu {__version__} (CPython {sys.version.split()[0]}; "
            f"the barrier's route check {check}; signal handlers held back {held}; "
            f"flat code armed {flat_arming()})")


def _split_argv(argv: list[str]) -> tuple[list[str], str | None, str | None, list[str]]:
    """Split into (daifu options, script, module, program args): the first
    word that is neither an option nor the value of one (``--grace 5``) is the
    script."""
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
        opt = BY_FLAG.get(arg)  # (None for --opt=VALUE: one word)
        if opt is not None and opt.takes_value and (
                opt.bare is None  # the value is the next word, whatever it is
                # an optional value: the next word unless an option or the script
                or (i + 1 < len(argv) and not argv[i + 1].startswith("-")
                    and not argv[i + 1].endswith(".py"))):
            i += 2
            continue
        i += 1
    return argv, None, None, []


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in COMMANDS:  # `./ps` runs a script called ps
        from ._commands import run  # lazy: 96.3 ms

        raise SystemExit(run(argv[0], argv[1:], lambda: _parser().print_help()))
    options, script, module, args = _split_argv(argv)
    ns: Any = None  # argparse's namespace (argparse only when there is something to parse)
    if options:
        parser = _parser()
        if "-m" in options:
            parser.error("-m needs a module name")
        ns = parser.parse_args(options)
    _refuse_what_cannot_run(ns, script, module)
    cfg = _configured(ns, script)
    if module in TOOLS:  # the program the tool runs is the one daifu is for
        cfg.main, tool_module = _tool_program(args)
        # cProfile counts a call under its code object: a frame moved onto its
        # vaccinated code at its first exception (armed code) would lose it
        cfg.armed = cfg.armed and module != "cProfile"
        project = (cfg.main, tool_module)
    else:
        project = (script, module)
    if cfg.use_project and not cfg.project:
        found = _project_of(*project)
        cfg.project = found.to_env() if found is not None else ""
    cfg.export()
    try:
        _logging.configure(cfg.log, cfg.log_level, cfg.log_format)
        cfg.setup_engine(script or module, interactive=True)
    except ConfigError as exc:
        sys.stderr.write(f"python -m daifu: error: {exc}\n")
        raise SystemExit(2) from None
    install(config=cfg)
    if cfg.checkpoint:
        # SIGTERM: save at the loop's next iteration, then end as python does; in
        # a distributed job, every rank at the one iteration they agree on
        install_preemption(ENGINE, cfg.grace, boundary=_job_boundary)
    if cfg.explain:
        _explain(script, module, cfg)
    load_fixes(cfg.fixes, fatal=True)
    atexit.register(_summary)
    _register_job(script, module, args, cfg)
    try:
        if module is not None:
            _run_module(module, args, cfg)
        elif script is not None:
            _run_script(script, args, cfg)
    except SystemExit:
        raise
    except BaseException as exc:  # the program dies of it, as under python
        _died(exc)


def _job_boundary():
    """This rank's part in a preempted job's agreement (None outside a job
    of several ranks): imported at SIGTERM only."""
    from ..engine import job_boundary  # lazy: 41.1 ms

    return job_boundary()


def _refuse_what_cannot_run(ns: Any, script: str | None, module: str | None) -> None:
    """Exit 2, saying why, on an unsupported Python (without --unprotected),
    no program, or a launcher (torchrun) given as the program."""

    back, _reason = backend()
    if back is None and not (ns is not None and ns.unprotected):
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


def _configured(ns: Any, script: str | None) -> Config:
    """The run's ``Config``: the environment, then the options; exit 2 on a
    bad one, or on a script that does not exist (as python does)."""
    try:
        cfg = Config.from_env()
        if ns is not None:
            cfg.override(ns)
        cfg.validate()
        for path in cfg.fixes:
            if not os.path.isfile(path):
                raise ConfigError(f"fixes file not found: {path}")
        if cfg.dump and cfg.dump not in ("-", "1", "stderr"):
            # (0600, never through a symbolic link: it shows the program's code)
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
    return cfg


def _project_of(script: str | None, module: str | None):
    """The program's project (``_project.Project``): the modules under the
    script's directory (a directory's own, for a directory with
    ``__main__.py``; none for a zip application), or for ``-m pkg.mod`` the
    package ``pkg`` (for ``-m mod``, the modules beside ``mod``)."""

    if script is not None:
        path = os.path.abspath(script)
        if os.path.isdir(path):
            return Project.of_script(os.path.join(path, "__main__.py"))
        return None if _is_zip(path) and not path.endswith(".py") else Project.of_script(path)
    if module is None:
        return None
    top = module.partition(".")[0]
    try:  # (the top-level name alone: nothing is imported)
        spec = importlib.machinery.PathFinder.find_spec(top, sys.path)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Project.of_package(list(spec.submodule_search_locations)[0], top)
    return Project.of_script(spec.origin) if spec.origin else None


def _explain(script: str | None, module: str | None, cfg: Config) -> None:
    """``--explain``: what is vaccinated, and why, before the program runs
    (each module as it is imported: ``DaifuFinder``)."""
    project = cfg.the_project()
    what = [f"the {'script ' + script if script else 'module ' + str(module)} (__main__)"]
    if project is not None:
        what.append(f"the project's modules: those under {project.describe()}, "
                    "not installed ones")
    elif not cfg.use_project:
        what.append("no project module (--modules/DAIFU_MODULES without '+')")
    if cfg.matcher:
        what.append(f"the modules --modules/DAIFU_MODULES names: {cfg.modules.lstrip('+')}")
    sys.stderr.write("daifu: vaccinating " + "; ".join(what) + "\n")


def _register_job(script, module, args, cfg) -> None:
    """A job file for ``python -m daifu ps`` (removed at exit)."""

    program = [script] if script is not None else ["-m", module]

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
            import traceback  # lazy: 4.2 ms

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
    # lazy: 4.2 ms
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
        _path0(path, always=True)
        _run_file(main_file, cfg)
        return
    if not path.endswith(".py") and _is_zip(path):  # a zipapp, as python runs it
        sys.argv[:] = [script, *args]
        _path0(path, always=True)
        _run_zip(script, path, cfg)
        return
    sys.argv[:] = [script, *args]
    _path0(os.path.dirname(path))
    _run_file(path, cfg)


def _path0(entry: str, always: bool = False) -> None:
    """``sys.path[0]`` as python makes it for the program: ``python -m
    daifu`` put the current directory there, python would put the script's
    (or the directory's, the archive's) -- except under ``-P``/``-I``
    (``sys.flags.safe_path``), where it puts nothing for a script, and for
    ``-m daifu`` put nothing either; a directory or an archive it always
    puts first."""
    if not sys.flags.safe_path:
        sys.path[0] = entry
    elif always:
        sys.path.insert(0, entry)


def _run_zip(script: str, archive: str, cfg: Config) -> None:
    """A zip application: its ``__main__`` vaccinated from the source that
    zipimport reads out of the archive, as ``python app.zip`` runs it
    (``__file__`` inside the archive, the zipimporter its loader)."""

    try:
        importer = zipimport.zipimporter(archive)
        spec = importer.find_spec("__main__")
        source = importer.get_data("__main__.py") if spec is not None else None
    except (zipimport.ZipImportError, OSError):
        spec = source = None
    if spec is None or source is None or spec.origin is None:  # no __main__.py in it
        sys.stderr.write(f"{sys.executable}: can't find '__main__' module in "
                         f"{os.path.join(os.getcwd(), script)!r}\n")
        raise SystemExit(1)
    main = _new_main(spec.origin, spec, importer)
    try:
        code = _compile_main(source, spec.origin, cfg)
    except SyntaxError as exc:
        _syntax_error(exc)
    _check_entries(cfg)
    _exec_main(code, main)


def _is_zip(path: str) -> bool:
    """A zip archive python would run (``python app.pyz``), read as python
    reads it: by ``zipimport`` (loaded with the interpreter; ``zipfile``
    would cost every start ~6 ms of imports)."""
    if not os.path.isfile(path):
        return False
    try:
        zipimport.zipimporter(path)
    except (zipimport.ZipImportError, OSError, ValueError):
        return False
    return True


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
    _exec_main(code, main)


def _exec_main(code: types.CodeType, main: types.ModuleType) -> None:
    """Run the program's main code as python runs it: with no frame of
    runpy's or daifu's below its ``<module>`` frame (``_cmain``, where built:
    ``f_back`` None, ``inspect.stack()``, tracebacks, faulthandler and
    ``warnings`` stack levels as under python, the recursion limit counted
    from it); else through ``exec`` (docs/limitations.md)."""
    try:
        from . import _cmain  # type: ignore[attr-defined,unused-ignore]  # (C)  # lazy: 25.6 ms
    except ImportError:
        exec(code, main.__dict__)
        return
    _cmain.run(code, main.__dict__)


def _tool_program(args: list[str]) -> tuple[str | None, str | None]:
    """The program a tool of ``TOOLS`` will run, as (script, module): its
    first argument that names a ``.py`` file (``-o out.prof``, ``-c
    continue`` don't), or the module of its ``-m module``.  (None, None):
    ``_run_tool`` then takes the first file the tool compiles."""
    for i, arg in enumerate(args):
        if arg == "-m" and i + 1 < len(args):
            return None, args[i + 1]
        if arg.endswith(".py") and os.path.isfile(arg):
            return os.path.abspath(arg), None
    return None, None


def _run_tool(name: str, args: list[str], cfg: Config) -> None:
    """``python -m daifu -m cProfile train.py``: run the tool unmodified, as
    ``python -m cProfile train.py`` does, and vaccinate the program when the
    tool compiles it (each of ``TOOLS`` reads the file and calls
    ``compile(source, path, "exec")``).  ``compile`` is wrapped until that
    one call, then put back.  A tool's ``-m pkg.mod`` is imported by it: the
    project (the package) is vaccinated as for ``python -m daifu -m``, its
    module-level code is not."""
    wanted = cfg.main
    sys.argv[:] = [name, *args]
    if wanted is None:
        if "-m" not in args:
            sys.stderr.write(f"daifu: warning: no program file (.py) among {name}'s arguments: "
                             "only the modules --modules/DAIFU_MODULES names are vaccinated\n")
        runpy.run_module(name, run_name="__main__", alter_sys=True)
        return
    original = builtins.compile

    def compile(source, filename, mode, flags=0, dont_inherit=False, optimize=-1, **kwargs):
        if (mode == "exec" and not flags and optimize == -1 and not kwargs
                and isinstance(filename, str) and os.path.abspath(filename) == wanted):
            builtins.compile = original
            code = _compile_main(source, filename, cfg)
            _check_entries(cfg)
            return code
        return original(source, filename, mode, flags, dont_inherit, optimize, **kwargs)

    builtins.compile = compile
    try:
        runpy.run_module(name, run_name="__main__", alter_sys=True)
    finally:
        builtins.compile = original


def _run_module(name: str, args: list[str], cfg: Config) -> None:
    if name in TOOLS:
        _run_tool(name, args, cfg)
        return
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
    _exec_main(code, main)


def strip_traceback(tb: types.TracebackType | None) -> types.TracebackType | None:
    """Drop daifu's runner frames (and runpy's) from the head of a traceback,
    and the frame of a first-call stub (``cells._lazy``) wherever it is: an
    exception in a function's first call shows the traceback it would show
    without daifu."""

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
        settle_preload()
        exec("raise KeyboardInterrupt", {})  # noqa: S102 (a constant)
    except KeyboardInterrupt:
        pass
    except Exception:  # never worse than without daifu
        pass


def _died(exc: BaseException) -> NoReturn:
    """The program dies of ``exc``: what python does for an exception that
    reaches the top (``PyErr_Print``) -- ``sys.last_exc``/``last_type``/
    ``last_value``/``last_traceback`` set, the ``sys.excepthook`` audit
    event, the program's own ``sys.excepthook`` called (an error in it
    reported as python reports it), exit status 1, and for
    ``KeyboardInterrupt`` the exit through SIGINT -- with a traceback that
    starts at the program's frame: neither the hook nor ``sys.last_traceback``
    sees runpy or daifu.  daifu's summary comes first."""
    tb = strip_traceback(exc.__traceback__) or exc.__traceback__  # (daifu's own failure: all)
    exc.__traceback__ = tb
    try:
        _summary(exc)
    except Exception:
        pass
    etype = type(exc)
    sys.last_type, sys.last_value, sys.last_traceback = etype, exc, tb
    if sys.version_info >= (3, 12):
        sys.last_exc = exc  # (3.12+)
    hook = getattr(sys, "excepthook", None)
    sys.audit("sys.excepthook", hook, etype, exc, tb)
    if hook is None:
        sys.stderr.write("sys.excepthook is missing\n")
        _display(exc)
    else:
        try:
            hook(etype, exc, tb)
        except SystemExit:
            raise
        except BaseException as err:
            sys.stderr.write("Error in sys.excepthook:\n")
            _display(err)
            sys.stderr.write("\nOriginal exception was:\n")
            _display(exc)
    if etype is KeyboardInterrupt:
        _exit_by_sigint()
    raise SystemExit(1)


def _display(exc: BaseException) -> None:
    """``PyErr_Display``: the default hook's output, whatever the hook is now."""
    sys.__excepthook__(type(exc), exc, exc.__traceback__)
