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
import shlex
import subprocess
import sys
import traceback
from typing import IO, TYPE_CHECKING, Any

from ..._errors import PatchError
from ..._runtime import RUNTIME
from .. import _events
from .._decision import ABORT, CONTINUE, RELOAD, RETRY, SKIP, Decision
from .._queue import AlwaysPatch, Apply, CheckpointPatch, DecisionPatch, ReloadPatch
from ._break import is_break
from ._frames import Frames
from ._inspect import Inspect
from ._ranks import Ranks
from ._report import build as build_report

if TYPE_CHECKING:
    from .._crash import Crash

HELP = """\
Commands (the crashed frame waits; nothing runs until you resume it):
  retry   (r)      re-execute the failing statement (over a DataLoader: the same batch)
  skip    (s)      continue after the failing statement
  next    (n)      go on with the innermost for loop's next item
  reload           re-read edited source files and resume in the new code
  edit             open $EDITOR at the failing line, then reload
  abort   (a)      give up: the exception continues as without daifu
  pass             no fix here: hand the exception to a vaccinated caller
  continue (c)     resume a job paused by break (send PID break): nothing runs twice
  always DECISION  DECISION here, and for every later crash of this type at this statement
                   (after this crash's exec patches); always: list them; always clear
  checkpoint [PATH]  save the training state now (modules, optimizers, RNG, position)
  where   (w)      show the crash report again (also: describe)
  bt               the call stack; > marks the frame in focus
  up [N]  (u)      focus on the caller (N frames up): p, vars, !, exec, l act there,
                   and retry/skip/next are taken in that frame
  up NAME          to the nearest caller running function NAME (the same on every rank)
  down [N] (d)     back towards the crashed frame (down NAME: to NAME's frame)
  l [FIRST[, LAST]]  source around the current line (l . : again from it); ll: the function
  vars             the focused frame's variables
  p EXPR / pp EXPR evaluate EXPR in the focused frame; print it (pp: pretty-printed;
                   p of a tensor: its summary, and its values when it is small)
  EXPR             a line that is not a command is evaluated (or run, if a statement)
  !STATEMENT       run a statement in the focused frame (assignments stick)
  exec             run several lines (end with an empty line)
  interact         a Python prompt in the focused frame (Ctrl-D returns; assignments stick)
  help             this text
In a distributed job (torchrun):
  ranks            the job's ranks that wait on a crash
  rank N           talk to rank N's crash (back: return to this rank's)
  all COMMAND      COMMAND on every waiting rank; a decision is for all ranks together
"""

PASS = object()  # "no decision here"


class Console(Frames, Inspect, Ranks, cmd.Cmd):
    """Commands for one crash.  ``decision`` is set when the frame may resume."""

    prompt = "(daifu) "
    intro = None

    def __init__(self, crash: Crash, apply: Apply, *, stdin: IO[str] | None = None,
                 stdout: IO[str] | None = None, origin: str = "console", local: bool = True,
                 scope: str = "rank"):
        super().__init__(stdin=stdin, stdout=stdout)
        self.crash = crash
        #: the console's only way into the job: patches, applied by the engine
        #: (``Engine.door``); the console never calls the engine otherwise
        self.apply = apply
        self.origin = origin
        self.local = local
        self.use_rawinput = local and stdin is None
        self.decision: Decision | object | None = None
        self.ok = True  # did the last command succeed?
        #: the frame in focus: 0 the crashed one, N its N-th caller (kept on
        #: the crash: a remote client's commands each get a new Console)
        self.level: int = crash.focus
        self._listed: int | None = None  # where ``l`` goes on from
        #: "job": decisions are for every rank of the distributed job (``all ...``)
        self.scope = scope

    # -- loop plumbing ---------------------------------------------------------------

    def say(self, text: str = "") -> None:
        self.stdout.write(text + ("\n" if not text.endswith("\n") else ""))
        self.stdout.flush()

    def onecmd(self, line: str) -> bool:
        self.ok = True
        cmd_, arg, _ = self.parseline(line)
        # `n = 5` is Python, not `next` (`!...` and `?` are cmd's own shorthands)
        python = bool(cmd_ and arg and not line.lstrip().startswith(("!", "?"))
                      and _looks_like_code(cmd_, arg))
        try:
            with self._redirected():
                return self._python(line) if python else bool(super().onecmd(line))
        except Exception:
            self.ok = False
            self.say("".join(traceback.format_exc()).rstrip())
            self.say("(the command failed; the job keeps waiting)")
            return False

    @contextlib.contextmanager
    def _redirected(self):
        """Output of evaluated code goes to this console's stream -- and, for a
        remote client, to the job's own stdout and stderr too: what the
        program prints (an ``exec``'s ``print``) is the job's output, echoed
        to the sender."""
        if self.stdout is sys.stdout:
            yield
            return
        out: Any = self.stdout if self.local else _Tee(sys.stdout, self.stdout)
        err: Any = self.stdout if self.local else _Tee(sys.stderr, self.stdout)
        with _events.pinned_stderr(), contextlib.redirect_stdout(out), \
                contextlib.redirect_stderr(err):
            yield

    def emptyline(self) -> bool:
        return False

    def default(self, line: str) -> bool:  # type: ignore[override]  # cmd uses the result
        if line.startswith("!"):
            return self._exec(line[1:])
        return self._python(line)

    def _python(self, line: str) -> bool:
        try:  # not a command: an expression is evaluated, a statement run (as in pdb)
            compile(line, "<daifu>", "eval")
        except SyntaxError:
            try:
                compile(line, "<daifu>", "exec")
            except SyntaxError:
                self.ok = False
                self.say(f"unknown command {line.split()[0]!r}, and not Python either; "
                         "type help")
                return False
            return self._exec(line)
        if line.isidentifier():  # a bare word: a command mistyped, or a variable
            try:
                self._eval(line)
            except NameError:
                self.ok = False
                self.say(f"unknown command {line!r} (and no variable of that name); type help")
                return False
            except Exception:
                pass  # (reported by _print below)
        return self._print(line, pretty=False)

    def precmd(self, line: str) -> str:
        return line.strip()

    # -- decisions -------------------------------------------------------------------

    def _decide(self, decision: Decision, here: bool = False) -> bool:
        """``here``: at the crash (frame 0) whatever frame is in focus."""
        try:  # checked (can it retry here?) and journaled by the engine, like any patch
            # (abort gives up the crash itself, wherever the focus is)
            frame = 0 if decision is ABORT or here else self.level
            self.apply(DecisionPatch(decision, origin=self.origin, frame=frame, scope=self.scope))
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

    def do_continue(self, arg: str) -> bool:
        """continue: resume a job paused by break (nothing runs twice)"""

        if not is_break(self.crash.exception):
            self.ok = False
            self.say("continue resumes a job paused by break; at a crash: retry, skip, next "
                     "or abort")
            return False
        # where it paused, whatever frame is in focus: a retry in a caller would
        # re-run its call, and the paused frame's work before the pause with it
        return self._decide(RETRY, here=True)

    do_c = do_cont = do_continue

    def do_pass(self, arg: str) -> bool:
        """pass: no fix here; a vaccinated caller gets the exception"""
        self.decision = PASS
        return True

    do_r, do_s, do_n, do_a = do_retry, do_skip, do_next, do_abort

    def do_always(self, arg: str) -> bool:
        """always DECISION: answer this crash so, and every later one of this exception
        type at this statement (after this crash's exec patches); always: list; always clear"""
        word = arg.strip().lower()
        if not word or word == "clear":
            self.say(self.apply(AlwaysPatch(action=word or "list", origin=self.origin)).said)
            return False
        decision = {"retry": RETRY, "r": RETRY, "skip": SKIP, "s": SKIP, "next": CONTINUE,
                    "n": CONTINUE, "abort": ABORT, "a": ABORT}.get(word)
        if decision is None:
            self.ok = False
            self.say("usage: always retry|skip|next|abort, always, always clear")
            return False
        if self.level:
            self.ok = False
            self.say("always answers the crashed frame's statement: go down first")
            return False
        stop = self._decide(decision)
        if stop:  # (only a decision the engine accepted here is remembered)
            self.say(self.apply(AlwaysPatch(action="set", decision=decision,
                                            origin=self.origin)).said)
        return stop

    def do_checkpoint(self, arg: str) -> bool:
        """checkpoint [PATH]: save the training state now (what a crash given up saves)"""
        path = os.path.abspath(os.path.expanduser(arg.strip())) if arg.strip() else None
        try:
            self.say(self.apply(CheckpointPatch(path=path, origin=self.origin)).said)
        except PatchError as err:
            self.ok = False
            self.say(str(err))
        return False

    def do_reload(self, arg: str) -> bool:
        """reload: re-read edited source files and resume in the new code"""
        patch = ReloadPatch(origin=self.origin, frame=self.level)
        try:
            applied = self.apply(patch)
        except PatchError as err:
            self.ok = False
            self.say(str(err))
            return False
        self.say(applied.summary(patch))
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

    def do_help(self, arg: str) -> bool:
        """help: list the commands"""
        self.say(HELP)
        return False

    # -- distributed jobs --------------------------------------------------------------

    def _readline(self, prompt: str) -> str | None:
        if self.use_rawinput:
            try:
                return input(prompt)
            except EOFError:
                return None
        self.stdout.write(prompt)
        self.stdout.flush()
        line = self.stdin.readline()
        return line.rstrip("\n") if line else None

    def do_EOF(self, arg: str) -> bool:  # noqa: N802 - cmd.Cmd's name for end of input
        self.say("")
        self.say("end of input: giving up (abort)")
        return self._decide(ABORT)


HISTORY = "~/.daifu_history"
HISTORY_LENGTH = 1000


def run_local(crash: Crash, apply: Apply) -> Console:
    """The console on the job's own terminal (readline history and completion).

    It talks to the terminal: when the program's stdout is redirected
    (``python -m daifu train.py > train.log``), the report and the prompt go
    to stderr and commands are read from stdin (without line editing), so the
    job does not look hung and the log file gets none of it."""
    if not _isatty(sys.stdout) and "ipykernel" not in sys.modules:
        # (a Jupyter kernel's stdout is not a terminal, but input() reaches the notebook)
        console = Console(crash, apply, stdin=sys.stdin, stdout=sys.stderr, origin="console")
        return _loop(console, crash)
    history = os.path.expanduser(HISTORY)
    readline: Any
    try:
        import readline  # lazy: 1.0 ms

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
        return _loop(Console(crash, apply, origin="console"), crash)
    finally:
        if readline is not None:
            try:
                readline.write_history_file(history)
            except OSError:
                pass


def _loop(console: Console, crash: Crash) -> Console:
    with _events.held():  # log lines wait until the console is done with the terminal
        console.say(build_report(crash).render())
        console.say("type help for commands")
        while console.decision is None:
            try:
                console.cmdloop()
            except KeyboardInterrupt:
                console.say("\n(interrupted: type abort to give up, or a command)")
    return console


#: a command's argument starting like this makes the line Python code:
#: ``n = 5`` assigns ``n``, ``n * 2`` is an expression, ``r.x`` an attribute
_CODE_STARTS = tuple("=.[(,:*/%+-<>&|^@!")


def _looks_like_code(command: str, arg: str) -> bool:
    arg = arg.lstrip()
    if command in ("p", "pp"):  # `p (x)`, `p -x` print; `p = 3`, `p += 1` assign
        return (arg.startswith("=") and not arg.startswith("==")) or \
            (len(arg) > 1 and arg[0] in "+-*/%|&^@<>" and "=" in arg[1:3]
             and not arg[1:3].startswith("=="))
    if command in ("checkpoint", "all"):  # a path / a command (`all !x = 1`); `all = 3` assigns
        return (arg.startswith("=") and not arg.startswith("==")) or \
            (len(arg) > 1 and arg[0] in "+-*%|&^@<>" and arg[1] == "=")
    if command == "l" and arg.strip() == ".":  # pdb's `l .`: around the current line
        return False
    return arg.startswith(_CODE_STARTS) and command != "exec"


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except Exception:
        return False


class _Tee:
    """A text stream writing to the job's own stream and to a client's."""

    def __init__(self, job: Any, client: Any) -> None:
        self._job, self._client = job, client

    def write(self, text: str) -> int:
        for stream in (self._job, self._client):
            try:
                stream.write(text)
            except Exception:  # (a closed job stream must not fail the command)
                pass
        return len(text)

    def flush(self) -> None:
        for stream in (self._job, self._client):
            try:
                stream.flush()
            except Exception:
                pass

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def run_line(crash: Crash, apply: Apply, text: str, origin: str,
             scope: str = "rank") -> tuple[Console, str]:
    """Run one command for a remote client; return the console and its output.
    Lines after the first are the command's input (``exec`` code); ``scope``
    "job": its decision is for every rank of the distributed job."""
    first, _, rest = text.partition("\n")
    out = io.StringIO()
    console = Console(crash, apply, stdin=io.StringIO(rest), stdout=out, origin=origin,
                      local=False, scope=scope)
    console.onecmd(console.precmd(first))
    return console, out.getvalue()
