"""Options, from the command line or the environment (children inherit them).

| variable             | option           | meaning                                             |
|----------------------|------------------|-----------------------------------------------------|
| DAIFU_MODULES        | --modules        | modules the import hook vaccinates (dotted globs)   |
| DAIFU_ENTRY          | --entry          | functions to vaccinate (qualname globs; * = loops)  |
| DAIFU_LAZY           | --lazy (=1)      | unset (default): every other function and method is |
|                      | --no-lazy (=0)   | vaccinated at import; 1: at its first call (a stub  |
|                      |                  | frame on that call); 0: not vaccinated              |
| DAIFU_FIXES          | --fixes          | rules files, separated by os.pathsep               |
| DAIFU_MAX_ATTEMPTS   | --max-attempts   | retries of one statement before giving up (5)       |
| DAIFU_LOG            | --log            | write events as JSON lines to this file             |
| DAIFU_LOG_LEVEL      | --log-level      | debug, info (default), warning, error               |
| DAIFU_STRICT         | --strict         | 1: a function daifu cannot vaccinate is an error    |
| DAIFU_DUMP           | --dump           | 1 (stderr) or a file: print the rewritten bytecode  |
| DAIFU_WAIT           | --wait           | without a terminal: wait this long (s) for a remote |
|                      |                  | fix between commands; 0 (default) = do not wait     |
| DAIFU_CONSOLE        | --no-console     | 0: no console even on a terminal                    |
| DAIFU_NOTIFY         | --notify         | shell command run when the job starts waiting for a |
|                      |                  | human (DAIFU_PID, DAIFU_WHERE, ... in its env)      |
| DAIFU_JOURNAL        | --journal        | the journal file (default under ~/.local/state)     |
| DAIFU_REPLAY         | --replay         | re-apply the patches of this journal                |
| DAIFU_RUNTIME_DIR    |                  | private directory for control sockets               |
| DAIFU_CACHE          | --no-cache (=0)  | code cache: a directory, 0 (off) or 1 (on); default |
|                      |                  | ~/.cache/daifu (written under python -B too)        |
| DAIFU_CHECKPOINT     | --no-checkpoint  | 0: no emergency checkpoint when a crash is given up |
| DAIFU_CHECKPOINT_DIR | --checkpoint-dir | where it goes (~/.local/state/daifu/checkpoints)    |
| DAIFU_GRACE          | --grace          | on SIGTERM: seconds to wait for the loop (25)       |
| DAIFU_PRELOAD        |                  | seconds after start-up to import what a crash needs |
|                      |                  | (in a daemon thread; default 2), 0: at the crash    |
| DAIFU_MAIN           | (set by runner)  | the main script, so spawned children vaccinate it   |
"""

from __future__ import annotations

import os

from .._errors import ConfigError
from .._record import field, record, replace
from ..cells import Selection
from ._patterns import ModuleMatcher

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _switch(env: dict[str, str], name: str, default: bool) -> bool:
    """An on/off variable: 1/true/yes/on or 0/false/no/off (unset or empty:
    ``default``); anything else is one clear ``ConfigError``, not a guess."""
    value = env.get(name, "").strip().lower()
    if not value:
        return default
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name} must be 1 or 0 (also true/false, yes/no, on/off), "
                      f"got {env[name]!r}")


def parse_wait(text: str) -> float | None:
    """Seconds to wait for a remote fix: a number, or ``inf``/``forever``."""
    if text.strip().lower() in ("inf", "forever", "infinity"):
        return None
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"--wait/DAIFU_WAIT must be a number of seconds >= 0 or 'inf', "
                          f"not {text!r}") from None
    if value != value or value < 0:  # NaN, negative
        raise ConfigError(f"--wait/DAIFU_WAIT must be a number of seconds >= 0 or 'inf', "
                          f"not {text!r}")
    if value == float("inf"):
        return None
    return value


def _split(text: str | None, sep: str = ",") -> tuple[str, ...]:
    return tuple(x.strip() for x in (text or "").split(sep) if x.strip())


@record
class Config:
    modules: str = ""
    entry: tuple[str, ...] = ("*",)
    lazy: bool = True
    #: what ``lazy`` vaccinates is rewritten at import (not at first call)
    eager: bool = True
    fixes: tuple[str, ...] = ()
    max_attempts: int = 5
    log: str | None = None
    log_level: str = "info"
    strict: bool = False
    dump: str | None = None
    main: str | None = None
    wait: float | None = 0.0  # None: forever
    console: bool = True
    notify: str | None = None
    journal: str | None = None
    replay: str | None = None
    cache: str = ""
    #: the emergency checkpoint when a crash is given up (engine/_checkpoint.py)
    checkpoint: bool = True
    checkpoint_dir: str = ""
    #: seconds SIGTERM waits for the training loop's iteration to finish
    grace: float = 25.0
    matcher: ModuleMatcher = field(default_factory=lambda: ModuleMatcher(()))

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Config:
        env = dict(os.environ if env is None else env)
        cfg = cls(
            modules=env.get("DAIFU_MODULES", ""),
            entry=_split(env.get("DAIFU_ENTRY")) or ("*",),
            fixes=_split(env.get("DAIFU_FIXES"), os.pathsep),
            log=env.get("DAIFU_LOG") or None,
            log_level=(env.get("DAIFU_LOG_LEVEL") or "info").lower(),
            strict=_switch(env, "DAIFU_STRICT", False),
            dump=env.get("DAIFU_DUMP") or None,
            main=env.get("DAIFU_MAIN") or None,
        )
        if env.get("DAIFU_LAZY", "").strip():
            cfg.lazy, cfg.eager = _switch(env, "DAIFU_LAZY", True), False
        cfg.console = _switch(env, "DAIFU_CONSOLE", True)
        cfg.checkpoint = _switch(env, "DAIFU_CHECKPOINT", True)
        cfg.checkpoint_dir = env.get("DAIFU_CHECKPOINT_DIR", "")
        grace = env.get("DAIFU_GRACE", "").strip()
        if grace:
            try:
                cfg.grace = float(grace)
            except ValueError:
                raise ConfigError(f"DAIFU_GRACE must be a number of seconds, not {grace!r}") \
                    from None
        peer = env.get("DAIFU_PEER_TIMEOUT")
        if peer is not None:
            try:
                if not float(peer) >= 0:  # (NaN too)
                    raise ValueError
            except ValueError:
                raise ConfigError("DAIFU_PEER_TIMEOUT must be a number of seconds (0 or more), "
                                  f"got {peer!r}") from None
        cfg.journal = env.get("DAIFU_JOURNAL") or None
        cfg.notify = env.get("DAIFU_NOTIFY") or None
        cfg.replay = env.get("DAIFU_REPLAY") or None
        cfg.cache = env.get("DAIFU_CACHE", "").strip()
        if env.get("DAIFU_WAIT"):
            cfg.wait = parse_wait(env["DAIFU_WAIT"])
        attempts = env.get("DAIFU_MAX_ATTEMPTS")
        if attempts:
            try:
                cfg.max_attempts = int(attempts)
            except ValueError:
                raise ConfigError(
                    f"DAIFU_MAX_ATTEMPTS must be an integer, got {attempts!r}") from None
        cfg.validate()
        return cfg

    def validate(self) -> None:
        self.matcher = ModuleMatcher.parse(self.modules)
        if self.max_attempts < 1:
            raise ConfigError(f"max attempts must be at least 1, got {self.max_attempts}")
        if not self.grace >= 0:  # (NaN too)
            raise ConfigError(f"the grace (--grace, DAIFU_GRACE) must be seconds >= 0, "
                              f"not {self.grace!r}")
        if self.log_level not in ("debug", "info", "warning", "error"):
            raise ConfigError(
                f"log level must be debug, info, warning or error, not {self.log_level!r}")
        for pattern in self.entry:
            if not pattern or any(ch.isspace() for ch in pattern):
                raise ConfigError(f"bad DAIFU_ENTRY pattern {pattern!r}")

    def selection(self, module_level: bool = False) -> Selection:
        return Selection(entries=self.entry, module_level=module_level, lazy=self.lazy,
                         eager=self.lazy and self.eager)

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
        from ..cells import CodeCache, default_directory

        value = self.cache.lower()
        if value in ("0", "false", "no", "off"):
            return None
        if value == "":
            return CodeCache(default_directory(), quiet=True)
        if value in _TRUE:
            return CodeCache(default_directory())
        return CodeCache(os.path.abspath(os.path.expanduser(self.cache)))

    def export(self) -> None:
        """Write the options to the environment so child processes inherit them."""
        os.environ["DAIFU_MODULES"] = self.modules
        os.environ["DAIFU_ENTRY"] = ",".join(self.entry)
        if self.lazy and self.eager:
            os.environ.pop("DAIFU_LAZY", None)
        else:
            os.environ["DAIFU_LAZY"] = "1" if self.lazy else "0"
        os.environ["DAIFU_MAX_ATTEMPTS"] = str(self.max_attempts)
        os.environ["DAIFU_LOG_LEVEL"] = self.log_level
        if self.fixes:
            os.environ["DAIFU_FIXES"] = os.pathsep.join(os.path.abspath(f) for f in self.fixes)
        if self.log:
            os.environ["DAIFU_LOG"] = os.path.abspath(self.log)
        if self.journal and "{" in self.journal:
            # a journal per process ({rank}, {pid}): spawned children keep one
            # too; a single file stays the parent's (children journal apart)
            os.environ["DAIFU_JOURNAL"] = os.path.abspath(self.journal)
        if self.strict:
            os.environ["DAIFU_STRICT"] = "1"
        if self.dump:
            os.environ["DAIFU_DUMP"] = self.dump
        if self.main:
            os.environ["DAIFU_MAIN"] = self.main
        if not self.checkpoint:
            os.environ["DAIFU_CHECKPOINT"] = "0"
        os.environ["DAIFU_GRACE"] = f"{self.grace:g}"
        if self.checkpoint_dir:
            os.environ["DAIFU_CHECKPOINT_DIR"] = os.path.abspath(
                os.path.expanduser(self.checkpoint_dir))
        os.environ["DAIFU_WAIT"] = "inf" if self.wait is None else f"{self.wait:g}"
        if not self.console:
            os.environ["DAIFU_CONSOLE"] = "0"
        if self.notify:
            os.environ["DAIFU_NOTIFY"] = self.notify
        if self.replay:
            os.environ["DAIFU_REPLAY"] = os.path.abspath(self.replay)
        if self.cache:
            keyword = self.cache.lower() in _TRUE | {"0", "false", "no", "off"}
            os.environ["DAIFU_CACHE"] = (
                self.cache if keyword else os.path.abspath(os.path.expanduser(self.cache)))

    def apply(self) -> None:
        """Configure this process's transform and engine from the options."""
        from ..cells import options
        from ..engine import ENGINE

        options.strict = self.strict
        options.dump = self.dump
        options.cache = self.code_cache()
        # (the journal and the waiters, set by ``setup_engine``, are kept)
        ENGINE.configure(replace(ENGINE.settings, **self._engine_options()))

    def _engine_options(self) -> dict:
        return {"max_attempts": self.max_attempts, "checkpoint": self.checkpoint,
                "checkpoint_dir": os.path.abspath(os.path.expanduser(self.checkpoint_dir))
                if self.checkpoint_dir else None}

    def setup_engine(self, script: str | None, interactive: bool,
                     console: bool | None = None) -> None:
        """Journal, replay and the human in the loop (runner and spawned children)."""
        import sys

        from .._private import check_file
        from ..engine import ENGINE, EngineSettings
        from ..engine._events import rank_unknown_yet
        from ..engine._journal import Journal, JournalError, Replay, default_path
        from ..engine._waiter import Waiter
        from ._logging import expand_path

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
    from ..engine import ENGINE

    ENGINE.waiters[:] = []
