"""Options, from the command line or the environment (children inherit them).

Every option of ``python -m daifu`` is declared once, in ``OPTIONS``: an
``Option`` is one command-line option, the ``DAIFU_*`` variable that means the
same and the ``Config`` field both set.  The runner's argparse parser, its
split of ``[options] script.py [args]`` (which options take the next word as
their value), the variables' part of ``--help``, ``Config.from_env``,
``Config.override`` and ``Config.export`` read it; nothing else lists them.
A new option is one entry there (plus what it does).

Both ``--opt VALUE`` and ``--opt=VALUE`` work; an option with an optional
value (``--dump [FILE]``) takes the next word only if it is neither an option
nor a ``.py`` file (``--dump train.py`` dumps to stderr and runs train.py).
An option overrides its variable; a blank variable is unset.

Variables no option sets: ``DAIFU_MAIN`` (the main script, set by the runner,
so that spawned children vaccinate it), ``DAIFU_PEER_TIMEOUT`` (checked here,
used by ``engine/remote/_distributed.py``), ``DAIFU_RUNTIME_DIR`` (``engine/remote/_rundir.py``)
and ``DAIFU_PRELOAD`` (``engine/_preload.py``; in ``OPTIONS`` for ``--help``).
"""

from __future__ import annotations

import os
import sys

from .._errors import ConfigError
from .._private import check_file
from .._record import field, record, replace
from ..cells import CodeCache, Selection, default_directory, options
from ..engine import ENGINE, EngineSettings, Journal, JournalError, Replay, Waiter, rank_unknown_yet
from ..engine import journal_path as default_path
from ._logging import expand_path
from ._patterns import ModuleMatcher

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_ON_OFF = "1 or 0 (also true/false, yes/no, on/off)"


def _switch(text: str) -> bool:
    """An on/off variable: 1/true/yes/on or 0/false/no/off, nothing else (a
    ``ValueError``, not a guess)."""
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(text)


def parse_wait(text: str) -> float | None:
    """Seconds to wait for a remote fix: a number, or ``inf``/``forever`` (None)."""
    if text.strip().lower() in ("inf", "forever", "infinity"):
        return None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if value != value or value < 0:  # not a number, NaN, negative
        raise ConfigError(f"--wait/DAIFU_WAIT must be a number of seconds >= 0 or 'inf', "
                          f"not {text!r}")
    if value == float("inf"):
        return None
    return value


def _split(text: str, sep: str = ",") -> tuple[str, ...]:
    """The non-blank items of a ``sep``-separated list, stripped."""
    return tuple(x.strip() for x in text.split(sep) if x.strip())


def _entries(text: str) -> tuple[str, ...]:
    return _split(text) or ("*",)


def _files(text: str) -> tuple[str, ...]:
    return _split(text, os.pathsep)


def _text(text: str) -> str:
    return text


def parse_hang_after(text: str) -> str:
    """``--hang-after``: ``auto`` (3 x the slowest step), ``off`` (or 0), or
    seconds > 0; kept as text (the watchdog reads ``DAIFU_HANG_AFTER``)."""
    value = text.strip().lower()
    if value in ("auto", "off") or value in _FALSE:
        return "off" if value != "auto" else "auto"
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):  # (NaN too)
        raise ValueError(text)
    return f"{seconds:g}"


def _text_or_none(text: str) -> str | None:
    return text or None


def _absolute(path: str | None) -> str | None:
    return os.path.abspath(path) if path else None


def _user_path(path: str | None) -> str | None:
    return os.path.abspath(os.path.expanduser(path)) if path else None


def _cache(cache: str) -> str | None:
    """``DAIFU_CACHE``: a keyword as it is, a directory absolute (children run
    elsewhere), unset as it is."""
    if not cache:
        return None
    return cache if cache.lower() in _TRUE | _FALSE else _user_path(cache)


class Option:
    """One option of ``python -m daifu``: its command-line spellings, its
    ``DAIFU_*`` variable and the ``Config`` field they set.

    (A plain class: a ``@record`` compiles its ``__init__`` at the first
    instance, ~0.25 ms of every start, and the table is made at every start.)"""

    #: the spellings on the command line (``()``: a variable without an option)
    flags: tuple[str, ...]
    #: what ``--help`` says of it
    help: str
    #: the name of the value it takes; None: a flag, given or not
    metavar: str | None
    #: the value it has when given without one: the value is optional
    #: (``--dump`` alone is ``--dump -``, stderr)
    bare: str | None
    #: the values it accepts (argparse checks them)
    choices: tuple[str, ...] | None
    #: given again, its values add up (``--fixes a.py --fixes b.py``)
    repeat: bool
    #: the environment variable that means the same
    env: str | None
    #: how ``--help`` writes the variable's value: for a flag, the value that
    #: means the flag (``DAIFU_STRICT=1``); None: ``metavar``
    env_value: str | None
    #: what the variable does besides what the option does (``--help``)
    env_note: str
    #: the ``Config`` field it sets; None: the runner reads it from argparse
    field: str | None
    #: what a flag sets its field to
    const: Any
    #: other fields it sets, to these values (``--lazy``: ``eager`` False)
    also: tuple[tuple[str, Any], ...]
    #: text -> the field's value, for the option's value and the variable's
    #: (a flag's: only the variable's); a bad text raises ``ValueError``
    parse: Callable[[str], Any]
    #: what a good text is, for the error about a bad one (``ValueError``)
    expects: str
    #: the variable's text for child processes, from the ``Config``; None:
    #: the variable is left as it is.  A flag's default: ``env_value`` when
    #: its field is ``const``
    export: Callable[[Config], str | None] | None
    #: ``-V``/``--version``: the parser prints the version line and exits
    version: bool

    def __init__(self, flags: tuple[str, ...], help: str, *, metavar: str | None = None,
                 bare: str | None = None, choices: tuple[str, ...] | None = None,
                 repeat: bool = False, env: str | None = None, env_value: str | None = None,
                 env_note: str = "", field: str | None = None, const: Any = None,
                 also: tuple[tuple[str, Any], ...] = (), parse: Callable[[str], Any] = _text,
                 expects: str = "", export: Callable[[Config], str | None] | None = None,
                 version: bool = False) -> None:
        self.flags, self.help, self.metavar, self.bare = flags, help, metavar, bare
        self.choices, self.repeat, self.env, self.env_value = choices, repeat, env, env_value
        self.env_note, self.field, self.const, self.also = env_note, field, const, also
        self.parse, self.expects, self.export, self.version = parse, expects, export, version

    def __repr__(self) -> str:
        return f"Option({'/'.join(self.flags) or self.env})"

    @property
    def dest(self) -> str:
        """Its attribute in argparse's namespace (the first long flag's name)."""
        long = next((f for f in self.flags if f.startswith("--")), self.flags[0])
        return long.lstrip("-").replace("-", "_")

    @property
    def takes_value(self) -> bool:
        return self.metavar is not None

    def parsed(self, text: str, source: str) -> Any:
        """``parse(text)``; a bad text is one ``ConfigError`` naming ``source``
        (the flag or the variable it came from)."""
        try:
            return self.parse(text)
        except ConfigError:
            raise
        except ValueError:
            raise ConfigError(f"{source} must be {self.expects}, got {text!r}") from None

    def set(self, cfg: Config, value: Any) -> None:
        """Set its field (and ``also``'s) of ``cfg``."""
        assert self.field is not None
        setattr(cfg, self.field, value)
        for name, other in self.also:
            setattr(cfg, name, other)

    def from_command_line(self, cfg: Config, ns: Any) -> None:
        """Set ``cfg`` from argparse's namespace ``ns`` if the command line gave it."""
        if self.field is None or not self.flags:
            return
        given = getattr(ns, self.dest)
        if given is None or given is False or given == []:  # (argparse's defaults)
            return
        if not self.takes_value:
            self.set(cfg, self.const)
        elif self.repeat:
            self.set(cfg, (*getattr(cfg, self.field), *given))
        else:
            self.set(cfg, self.parsed(given, self.flags[0]))

    def default_export(self, cfg: Config) -> str | None:
        """A flag's variable when the flag's value is set, else as it is."""
        assert self.field is not None
        return self.env_value if getattr(cfg, self.field) == self.const else None


def _lazy(cfg: Config) -> str | None:
    if cfg.lazy and cfg.eager:  # neither --lazy, --no-lazy nor DAIFU_LAZY
        return None
    return "1" if cfg.lazy else "0"


def _journal(cfg: Config) -> str | None:
    # a journal per process ({rank}, {pid}): spawned children keep one too; a
    # single file stays the parent's (children journal apart)
    return _absolute(cfg.journal) if cfg.journal and "{" in cfg.journal else None


#: every option of ``python -m daifu``, in ``--help``'s order (argparse adds -h)
OPTIONS: tuple[Option, ...] = (
    Option(("--fixes",), "load rules from FILE before the script starts (repeatable)",
           metavar="FILE", repeat=True, env="DAIFU_FIXES", env_value=f"FILE{os.pathsep}FILE...",
           field="fixes", parse=_files,
           export=lambda cfg: os.pathsep.join(os.path.abspath(f) for f in cfg.fixes)
           if cfg.fixes else None),
    Option(("--modules",), "the modules to vaccinate besides the script (comma-separated "
           "dotted globs); by default, the modules under the script's directory (the -m "
           "package's); '+PATTERNS': those and these; '-': none",
           metavar="PATTERNS", env="DAIFU_MODULES", field="modules",
           export=lambda cfg: cfg.modules),
    Option(("--explain",), "say what is vaccinated and why (the project, each module "
           "vaccinated or not), on stderr",
           env="DAIFU_EXPLAIN", env_value="1", field="explain", const=True, parse=_switch,
           expects=_ON_OFF),
    Option(("--entry",), "functions to vaccinate (qualname globs; '*' = every function with a "
           "loop, the default; '<module>' = module code); every other function and method is "
           "vaccinated at import", metavar="PATTERNS", env="DAIFU_ENTRY", field="entry",
           parse=_entries, export=lambda cfg: ",".join(cfg.entry)),
    Option(("--lazy",), "vaccinate the functions --entry does not select at their first call "
           "instead of at import (faster imports; that one call runs under a stub frame that "
           "debuggers and profilers see)",
           env="DAIFU_LAZY", env_value="1", field="lazy", const=True, also=(("eager", False),),
           parse=_switch, expects=_ON_OFF, export=_lazy),
    Option(("--no-lazy",), "vaccinate only the functions --entry selects (by default every "
           "other function and method of a vaccinated module is vaccinated at import)",
           env="DAIFU_LAZY", env_value="0", field="lazy", const=False,
           also=(("eager", False),)),
    Option(("--max-attempts",), "give up after N failed retries of one statement (default 5)",
           metavar="N", env="DAIFU_MAX_ATTEMPTS", field="max_attempts", parse=int,
           expects="an integer", export=lambda cfg: str(cfg.max_attempts)),
    Option(("--log-file", "--log"), "write daifu's events as JSON lines to FILE ({rank}, "
           "{local_rank} and {pid} in the name: one file per rank; --log is the same, but "
           "launchers such as torchrun take --log for their own --log-dir)",
           metavar="FILE", env="DAIFU_LOG", field="log", parse=_text_or_none,
           export=lambda cfg: _absolute(cfg.log)),
    Option(("--log-level",), "debug, info (default), warning or error", metavar="LEVEL",
           choices=("debug", "info", "warning", "error"), env="DAIFU_LOG_LEVEL",
           field="log_level", parse=str.lower, export=lambda cfg: cfg.log_level),
    Option(("--log-format",), "json (JSON lines), console (lines for people) or auto (the "
           "default: JSON in a file or a pipe, for people on a terminal)", metavar="FORMAT",
           choices=("json", "console", "auto"), env="DAIFU_LOG_FORMAT", field="log_format",
           parse=str.lower, export=lambda cfg: cfg.log_format),
    Option(("--arm",), "arm each function at import (its own instructions and a trap per "
           "group of statements) and rewrite it in full, in its running frame, at its first "
           "crash (the default)",
           env="DAIFU_ARM", env_value="1", field="armed", const=True, parse=_switch,
           expects=_ON_OFF, export=lambda cfg: "1" if cfg.armed else "0"),
    Option(("--no-arm",), "rewrite every vaccinated function in full at import instead of "
           "arming it (a slower first start; what daifu did before arming)",
           env="DAIFU_ARM", env_value="0", field="armed", const=False),
    Option(("--strict",), "fail if a selected function cannot be vaccinated",
           env="DAIFU_STRICT", env_value="1", field="strict", const=True, parse=_switch,
           expects=_ON_OFF),
    Option(("--dump",), "print the rewritten bytecode to stderr (or FILE)", metavar="FILE",
           bare="-", env="DAIFU_DUMP", env_value="1|FILE", field="dump", parse=_text_or_none,
           export=lambda cfg: cfg.dump or None),
    Option(("--wait",), "without a terminal: wait for a fix from `python -m daifu attach/send` "
           "(SECONDS between commands, or 'inf'); default 0: give up at once",
           metavar="SECONDS", env="DAIFU_WAIT", field="wait", parse=parse_wait,
           export=lambda cfg: "inf" if cfg.wait is None else f"{cfg.wait:g}"),
    Option(("--notify",), "run the shell command CMD when the job starts waiting for a fix "
           "(who crashed, where and how to attach are in its environment: DAIFU_PID, "
           "DAIFU_WHERE, DAIFU_EXCEPTION, DAIFU_ATTACH, ...)",
           metavar="CMD", env="DAIFU_NOTIFY", field="notify", parse=_text_or_none,
           export=lambda cfg: cfg.notify or None),
    Option(("--no-console",), "never open the interactive console, even on a terminal",
           env="DAIFU_CONSOLE", env_value="0", field="console", const=False, parse=_switch,
           expects=_ON_OFF),
    Option(("--journal",), "record crashes and patches here (JSON lines, mode 0600)",
           metavar="FILE", env="DAIFU_JOURNAL", field="journal", parse=_text_or_none,
           export=_journal),
    Option(("--replay",), "re-apply the patches recorded in JOURNAL when the same crash recurs",
           metavar="JOURNAL", env="DAIFU_REPLAY", field="replay", parse=_text_or_none,
           export=lambda cfg: _absolute(cfg.replay)),
    Option(("--unprotected",), "on a Python daifu does not support, run the program anyway "
           "(without crash interception) instead of refusing"),
    Option(("--no-cache",), "rewrite vaccinated code at every start instead of using the code "
           "cache (~/.cache/daifu)",
           env="DAIFU_CACHE", env_value="0", env_note="(1: on, the default; a directory: that "
           "one)", field="cache", const="0", parse=str.strip,
           export=lambda cfg: _cache(cfg.cache)),
    Option(("--checkpoint-dir",), "where the emergency checkpoint goes when a crash is given up "
           "(default ~/.local/state/daifu/checkpoints)",
           metavar="DIR", env="DAIFU_CHECKPOINT_DIR", field="checkpoint_dir",
           export=lambda cfg: _user_path(cfg.checkpoint_dir)),
    Option(("--no-checkpoint",), "do not save the training state when a crash is given up or "
           "the job gets SIGTERM",
           env="DAIFU_CHECKPOINT", env_value="0", field="checkpoint", const=False,
           parse=_switch, expects=_ON_OFF),
    Option(("--grace",), "on SIGTERM, wait up to S seconds (default 25) for the training loop "
           "to finish its iteration, save the state, then end",
           metavar="S", env="DAIFU_GRACE", field="grace", parse=float,
           expects="a number of seconds", export=lambda cfg: f"{cfg.grace:g}"),
    Option(("--hang-after",), "a distributed job hangs when no rank moved for S seconds "
           "(default auto: 3 x the slowest step, at least 5 s; off: no watchdog); then the "
           "rank that is behind is named, and every rank saves its state and ends (status 124)",
           metavar="S", env="DAIFU_HANG_AFTER", field="hang_after", parse=parse_hang_after,
           expects="seconds > 0, auto or off", export=lambda cfg: cfg.hang_after),
    Option(("--on-hang",), "what a hang does: save (every rank saves, then the job ends; "
           "with --wait, after the wait) or report (name it only)",
           metavar="WHAT", choices=("report", "save"), env="DAIFU_ON_HANG", field="on_hang",
           expects="save or report", export=lambda cfg: cfg.on_hang),
    Option(("-V", "--version"), "show daifu's version, the Python it runs on and whether the "
           "barrier's C check is in use, and exit", version=True),
    # variables without an option
    Option((), "import what a crash needs S seconds after start (default 2; 0: at the crash)",
           env="DAIFU_PRELOAD", env_value="S"),  # (read by engine/_preload.py)
    Option((), "the project a child process vaccinates (set by python -m daifu)",
           env="DAIFU_PROJECT", env_value="DIR:NAMES", field="project",
           export=lambda cfg: cfg.project or None),
)

#: the options by spelling (the argv split)
BY_FLAG: dict[str, Option] = {flag: opt for opt in OPTIONS for flag in opt.flags}

#: the option that reads and writes each variable (``Config.from_env``,
#: ``export``): the first that names it (``--lazy``, not ``--no-lazy``)
VARIABLES: dict[str, Option] = {}
for _opt in OPTIONS:
    if _opt.env is not None and _opt.field is not None:
        VARIABLES.setdefault(_opt.env, _opt)
del _opt


def variables_help() -> str:
    """The variables' part of ``--help``: each variable, its value, the option
    it is like."""
    lines = ["environment variables (options override them; child processes inherit them):"]
    for opt in OPTIONS:
        if opt.env is None:
            continue
        name = f"{opt.env}={opt.env_value or opt.metavar}"
        what = (f"like {opt.flags[0]}" if opt.flags else opt.help) + \
            (f" {opt.env_note}" if opt.env_note else "")
        lines.append(f"  {name:<25} {what}")
    return "\n".join(lines)



@record
class Config:
    modules: str = ""
    entry: tuple[str, ...] = ("*",)
    lazy: bool = True
    #: what ``lazy`` vaccinates is rewritten at import (not at first call)
    eager: bool = True
    #: armed at import, rewritten in full at the first crash (``cells._armed``)
    armed: bool = True
    fixes: tuple[str, ...] = ()
    max_attempts: int = 5
    log: str | None = None
    log_level: str = "info"
    #: auto (JSON in a file or a pipe, for people on a terminal), json or console
    log_format: str = "auto"
    strict: bool = False
    dump: str | None = None
    main: str | None = None
    wait: float | None = 0.0  # None: forever
    console: bool = True
    notify: str | None = None
    journal: str | None = None
    replay: str | None = None
    cache: str = ""
    #: the emergency checkpoint when a crash is given up (engine/persist/_checkpoint.py)
    checkpoint: bool = True
    checkpoint_dir: str = ""
    #: seconds SIGTERM waits for the training loop's iteration to finish
    grace: float = 25.0
    #: a distributed job hangs after this (engine/_watchdog.py): auto, off or seconds
    hang_after: str = "auto"
    #: and then: save or report
    on_hang: str = "save"
    #: say what is vaccinated and why
    explain: bool = False
    #: the program's project (``_project.Project.to_env``: ``root:names``), "" for none
    project: str = ""
    matcher: ModuleMatcher = field(default_factory=lambda: ModuleMatcher(()))
    #: the project's modules are vaccinated (``--modules`` unset, or ``+...``)
    use_project: bool = True

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Config:
        """The options the ``DAIFU_*`` variables set (a blank one is unset)."""
        env = dict(os.environ if env is None else env)
        cfg = cls(main=env.get("DAIFU_MAIN") or None)
        for name, opt in VARIABLES.items():
            text = env.get(name, "")
            if text.strip():
                opt.set(cfg, opt.parsed(text, name))
        peer = env.get("DAIFU_PEER_TIMEOUT")
        if peer is not None:
            try:
                if not float(peer) >= 0:  # (NaN too)
                    raise ValueError
            except ValueError:
                raise ConfigError("DAIFU_PEER_TIMEOUT must be a number of seconds (0 or more), "
                                  f"got {peer!r}") from None
        cfg.validate()
        return cfg

    def override(self, ns) -> None:
        """Set what the command line gave (argparse's namespace): the options
        override the variables.  ``validate()`` next."""
        for opt in OPTIONS:
            opt.from_command_line(self, ns)

    def validate(self) -> None:
        text = self.modules.strip()
        self.use_project = not text or text.startswith("+")
        self.matcher = ModuleMatcher.parse("" if text == "-" else text.removeprefix("+"))
        if self.max_attempts < 1:
            raise ConfigError(f"max attempts must be at least 1, got {self.max_attempts}")
        if not self.grace >= 0:  # (NaN too)
            raise ConfigError(f"the grace (--grace, DAIFU_GRACE) must be seconds >= 0, "
                              f"not {self.grace!r}")
        if self.on_hang not in ("save", "report"):
            raise ConfigError(f"--on-hang/DAIFU_ON_HANG must be save or report, "
                              f"not {self.on_hang!r}")
        if self.log_format not in ("auto", "json", "console"):
            raise ConfigError(f"log format must be auto, json or console, not {self.log_format!r}")
        if self.log_level not in ("debug", "info", "warning", "error"):
            raise ConfigError(
                f"log level must be debug, info, warning or error, not {self.log_level!r}")
        for pattern in self.entry:
            if not pattern or any(ch.isspace() for ch in pattern):
                raise ConfigError(f"bad DAIFU_ENTRY pattern {pattern!r}")

    def the_project(self):
        """The project whose modules are vaccinated (``_project.Project``), or None."""
        if not (self.use_project and self.project):
            return None
        from ._project import Project  # lazy: 16.4 ms

        return Project.from_env(self.project)

    def selection(self, module_level: bool = False) -> Selection:
        return Selection(entries=self.entry, module_level=module_level, lazy=self.lazy,
                         eager=self.lazy and self.eager, armed=self.armed)

    def code_cache(self):
        """The ``CodeCache`` ``DAIFU_CACHE`` asks for, or None.

        Unset: ``~/.cache/daifu`` (``$XDG_CACHE_HOME/daifu``), quietly unused
        if it cannot be made private.  It is written even when Python does not
        write bytecode (``-B``, ``PYTHONDONTWRITEBYTECODE``): that setting
        keeps ``__pycache__`` out of source trees and images, and daifu's
        cache is neither (a private per-user directory, pruned after 30
        days); without it every start would rewrite every function.  ``1``:
        the same, with a warning if unusable.  ``0``: no cache.  Anything
        else: that directory."""

        value = self.cache.lower()
        if value in _FALSE:
            return None
        if value == "":
            return CodeCache(default_directory(), quiet=True)
        if value in _TRUE:
            return CodeCache(default_directory())
        return CodeCache(os.path.abspath(os.path.expanduser(self.cache)))

    def export(self) -> None:
        """Write the options to the environment so child processes inherit them."""
        for name, opt in VARIABLES.items():
            text = (opt.export or opt.default_export)(self)
            if text is not None:
                os.environ[name] = text
        if self.main:
            os.environ["DAIFU_MAIN"] = self.main

    def apply(self) -> None:
        """Configure this process's transform and engine from the options."""

        options.configure(strict=self.strict, dump=self.dump, cache=self.code_cache())
        # (the journal and the waiters, set by ``setup_engine``, are kept)
        ENGINE.configure(replace(ENGINE.settings, **self._engine_options()))

    def _engine_options(self) -> dict:
        return {"max_attempts": self.max_attempts, "checkpoint": self.checkpoint,
                "checkpoint_dir": os.path.abspath(os.path.expanduser(self.checkpoint_dir))
                if self.checkpoint_dir else None}

    def setup_engine(self, script: str | None, interactive: bool,
                     console: bool | None = None) -> None:
        """Journal, replay and the human in the loop (runner and spawned children)."""

        journal = expand_path(self.journal) if self.journal else None  # {rank}: one per rank
        if journal and self.journal and rank_unknown_yet(self.journal):
            journal = self.journal  # (named at its first record, once the rank is known)
        elif journal:
            check_file(journal, "the journal (--journal)", ConfigError)
        settings = EngineSettings(**self._engine_options(),
                                  journal=Journal(journal or default_path(script)))
        if self.replay:
            try:
                settings.replay = Replay(expand_path(self.replay))
            except JournalError as exc:
                raise ConfigError(str(exc)) from None
        if console is None:
            console = interactive and self.console and sys.stdin.isatty() and sys.stderr.isatty()
        if console or self.wait != 0:
            settings.waiters.append(Waiter(console=console, wait=self.wait, notify=self.notify))
            os.register_at_fork(after_in_child=_no_waiting_in_forked_children)
        ENGINE.configure(settings)  # the engine's whole configuration, at once


def _no_waiting_in_forked_children() -> None:
    """A forked child (a DataLoader worker, say) shares the parent's terminal:
    it applies rules but never waits for a human."""

    ENGINE.waiters[:] = []
