"""The crash console: pdb-style commands acting on one intercepted crash.

The same ``Console`` serves the job's own terminal and remote clients
(``python -m daifu attach PID``); every change it makes goes through the
engine's patch queue, with the console as the patch's origin.
"""

from __future__ import annotations

import cmd
import contextlib
import io
import os
import pprint
import shlex
import subprocess
import sys
import traceback
from typing import IO, TYPE_CHECKING, Any

from .._errors import PatchError
from .._runtime import RUNTIME
from . import _events
from ._decision import ABORT, CONTINUE, RELOAD, RETRY, SKIP, Decision
from ._queue import DecisionPatch, ExecPatch, ReloadPatch
from ._report import build as build_report
from ._report import summarize

if TYPE_CHECKING:
    from ._crash import Crash
    from ._engine import Engine

HELP = """\
Commands (the crashed frame waits; nothing runs until you resume it):
  retry   (r)      re-execute the failing statement
  skip    (s)      continue after the failing statement
  next    (n)      go on with the innermost for loop's next item
  reload           re-read edited source files and resume in the new code
  edit             open $EDITOR at the failing line, then reload
  abort   (a)      give up: the exception continues as without daifu
  pass             no fix here: hand the exception to a vaccinated caller
  where   (w)      show the crash report again (also: describe)
  vars             the crashed function's variables
  p EXPR           evaluate EXPR in the crashed frame and print it
  !STATEMENT       run a statement in the crashed frame (assignments stick)
  exec             run several lines (end with an empty line)
  help             this text
"""

PASS = object()  # "no decision here"


class Console(cmd.Cmd):
    """Commands for one crash.  ``decision`` is set when the frame may resume."""

    prompt = "(daifu) "
    intro = None

    def __init__(self, crash: Crash, engine: Engine, *, stdin: IO[str] | None = None,
                 stdout: IO[str] | None = None, origin: str = "console", local: bool = True):
        super().__init__(stdin=stdin, stdout=stdout)
        self.crash = crash
        self.engine = engine
        self.origin = origin
        self.local = local
        self.use_rawinput = local and stdin is None
        self.decision: Decision | object | None = None
        self.ok = True  # did the last command succeed?

    # -- loop plumbing ---------------------------------------------------------------

    def say(self, text: str = "") -> None:
        self.stdout.write(text + ("\n" if not text.endswith("\n") else ""))
        self.stdout.flush()

    def onecmd(self, line: str) -> bool:
        self.ok = True
        try:
            with self._redirected():
                return bool(super().onecmd(line))
        except Exception:
            self.ok = False
            self.say("".join(traceback.format_exc()).rstrip())
            self.say("(the command failed; the job keeps waiting)")
            return False

    @contextlib.contextmanager
    def _redirected(self):
        """Output of evaluated code goes to this console's stream."""
        if self.stdout is sys.stdout:
            yield
            return
        with _events.pinned_stderr(), contextlib.redirect_stdout(self.stdout), \
                contextlib.redirect_stderr(self.stdout):
            yield

    def emptyline(self) -> bool:
        return False

    def default(self, line: str) -> bool:  # type: ignore[override]  # cmd uses the result
        if line.startswith("!"):
            return self._exec(line[1:])
        self.ok = False
        self.say(f"unknown command {line.split()[0]!r}; type help")
        return False

    def precmd(self, line: str) -> str:
        return line.strip()

    # -- decisions -------------------------------------------------------------------

    def _decide(self, decision: Decision) -> bool:
        try:  # checked (can it retry here?) and journaled by the engine, like any patch
            self.engine.submit(DecisionPatch(decision, origin=self.origin), self.crash)
        except PatchError as err:
            self.ok = False
            self.say(str(err))
            return False
        self.decision = decision
        return True

    def do_retry(self, arg: str) -> bool:
        """retry: re-execute the failing statement"""
        return self._decide(RETRY)

    def do_skip(self, arg: str) -> bool:
        """skip: continue after the failing statement"""
        return self._decide(SKIP)

    def do_next(self, arg: str) -> bool:
        """next: go on with the innermost for loop's next item"""
        return self._decide(CONTINUE)

    def do_abort(self, arg: str) -> bool:
        """abort: give up; the exception continues exactly as without daifu"""
        return self._decide(ABORT)

    def do_pass(self, arg: str) -> bool:
        """pass: no fix here; a vaccinated caller gets the exception"""
        self.decision = PASS
        return True

    do_r, do_s, do_n, do_a = do_retry, do_skip, do_next, do_abort

    def do_reload(self, arg: str) -> bool:
        """reload: re-read edited source files and resume in the new code"""
        patch = ReloadPatch(origin=self.origin)
        try:
            self.engine.submit(patch, self.crash)
        except PatchError as err:
            self.ok = False
            self.say(str(err))
            return False
        self.say(patch.summary())
        self.decision = RELOAD
        return True

    def do_edit(self, arg: str) -> bool:
        """edit: open $EDITOR at the failing line, then reload"""
        if not self.local:
            self.ok = False
            self.say("edit needs the job's own terminal; edit the file yourself, then `reload`")
            return False
        editor = os.environ.get("VISUAL") or os.environ.get("EDITOR")
        if not editor:
            self.ok = False
            self.say("set $EDITOR (or edit the file yourself), then type reload")
            return False
        subprocess.call([*shlex.split(editor), f"+{self.crash.lineno}", self.crash.filename])
        return self.do_reload("")

    # -- looking around ----------------------------------------------------------------

    def do_where(self, arg: str) -> bool:
        """where: show the crash report again"""
        self.say(build_report(self.crash).render())
        return False

    do_w = do_describe = do_where

    def do_vars(self, arg: str) -> bool:
        """vars: the crashed function's variables"""
        for name in sorted(self.crash.vars):
            if not name.startswith("__"):
                self.say(f"  {name} = {summarize(self.crash.vars[name])}")
        return False

    def do_p(self, arg: str) -> bool:
        """p EXPR: evaluate an expression in the crashed frame"""
        if not arg:
            self.ok = False
            self.say("usage: p EXPR")
            return False
        try:
            value = self.crash.eval(arg)
        except PatchError as err:
            self.ok = False
            self.say(str(err))
            return False
        except Exception:
            self.ok = False
            self.say(traceback.format_exc(limit=-1).rstrip())
            return False
        self.say(pprint.pformat(value, width=100))
        return False

    def do_exec(self, arg: str) -> bool:
        """exec [CODE]: run statements in the crashed frame; without CODE, read
        lines until an empty one"""
        if arg:
            return self._exec(arg)
        lines = []
        while True:
            try:
                if self.use_rawinput:
                    line = input("... ")
                else:
                    if self.local:
                        self.stdout.write("... ")
                        self.stdout.flush()
                    line = self.stdin.readline()
                    if not line:
                        break
                    line = line.rstrip("\n")
            except EOFError:
                break
            if not line.strip():
                break
            lines.append(line)
        return self._exec("\n".join(lines)) if lines else False

    def _exec(self, code: str) -> bool:
        try:
            self.engine.submit(ExecPatch(code, origin=self.origin), self.crash)
        except PatchError as err:
            self.ok = False
            self.say(str(err))
            cause = err.__cause__
            if cause is not None:
                self.say("".join(traceback.format_exception_only(cause)).rstrip())
        return False

    def do_help(self, arg: str) -> bool:
        """help: list the commands"""
        self.say(HELP)
        return False

    def do_EOF(self, arg: str) -> bool:  # noqa: N802 - cmd.Cmd's name for end of input
        self.say("")
        self.say("end of input: giving up (abort)")
        return self._decide(ABORT)

    # -- completion ----------------------------------------------------------------------

    def completedefault(self, text, line, begidx, endidx):
        return self._names(text)

    def complete_p(self, text, line, begidx, endidx):
        return self._names(text)

    complete_exec = complete_p

    def _names(self, text: str) -> list[str]:
        try:
            names = set(self.crash.vars) | set(self.crash.globals)
        except Exception:
            names = set()
        return sorted(n for n in names if n.startswith(text))


HISTORY = "~/.daifu_history"
HISTORY_LENGTH = 1000


def run_local(crash: Crash, engine: Engine) -> Console:
    """The console on the job's own terminal (readline history and completion).

    It talks to the terminal: when the program's stdout is redirected
    (``python -m daifu train.py > train.log``), the report and the prompt go
    to stderr and commands are read from stdin (without line editing), so the
    job does not look hung and the log file gets none of it."""
    if not _isatty(sys.stdout):
        console = Console(crash, engine, stdin=sys.stdin, stdout=sys.stderr, origin="console")
        return _loop(console, crash)
    history = os.path.expanduser(HISTORY)
    readline: Any
    try:
        import readline

        readline.set_completer_delims(" \t\n`~!@#$%^&*()-=+[{]}\\|;:'\",<>/?")
        readline.set_history_length(HISTORY_LENGTH)  # the file is capped when written
        if not RUNTIME.history_read:  # once per process: every console appends to it
            RUNTIME.history_read = True
            try:
                readline.read_history_file(history)
            except OSError:
                pass
    except ImportError:  # pragma: no cover - readline is part of CPython on POSIX
        readline = None
    try:
        return _loop(Console(crash, engine, origin="console"), crash)
    finally:
        if readline is not None:
            try:
                readline.write_history_file(history)
            except OSError:
                pass


def _loop(console: Console, crash: Crash) -> Console:
    console.say(build_report(crash).render())
    console.say("type help for commands")
    while console.decision is None:
        try:
            console.cmdloop()
        except KeyboardInterrupt:
            console.say("\n(interrupted: type abort to give up, or a command)")
    return console


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except Exception:
        return False


def run_line(crash: Crash, engine: Engine, text: str, origin: str) -> tuple[Console, str]:
    """Run one command for a remote client; return the console and its output.
    Lines after the first are the command's input (``exec`` code)."""
    first, _, rest = text.partition("\n")
    out = io.StringIO()
    console = Console(crash, engine, stdin=io.StringIO(rest), stdout=out, origin=origin,
                      local=False)
    console.onecmd(console.precmd(first))
    return console, out.getvalue()
