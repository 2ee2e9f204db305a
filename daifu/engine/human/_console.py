"""The crash console: pdb-style commands acting on one intercepted crash.

The same ``Console`` serves the job's own terminal and remote clients
(``python -m daifu attach PID``); every change it makes goes through the
engine's patch queue, with the console as the patch's origin.
"""

from __future__ import annotations

import builtins
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

from ..._errors import PatchError
from ..._runtime import RUNTIME
from ...cells import read_locals
from .. import _events
from .._crash import is_library, library_package
from .._decision import ABORT, CONTINUE, RELOAD, RETRY, SKIP, Decision
from .._queue import AlwaysPatch, Apply, CheckpointPatch, DecisionPatch, ExecPatch, ReloadPatch
from ._report import build as build_report
from ._report import redraws, running_line, running_lines, shown_where, summarize

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


class Console(cmd.Cmd):
    """Commands for one crash.  ``decision`` is set when the frame may resume."""

    prompt = "(daifu) "
    intro = None

    def __init__(self, crash: Crash, apply: Apply, *, stdin: IO[str] | None = None,
                 stdout: IO[str] | None = None, origin: str = "console", local: bool = True):
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
        self.scope = "rank"

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

    # -- the frame in focus -------------------------------------------------------------

    @property
    def frame(self):
        return self.crash.frame_at(self.level)

    def _frame_line(self, frame) -> int:
        return self.crash.lineno or frame.f_lineno if frame is self.crash.frame \
            else frame.f_lineno

    def _show_focus(self) -> None:
        frame = self.frame
        lineno = self._frame_line(frame)
        text = running_line(frame.f_code.co_filename, lineno, frame.f_code).strip()
        self.say(f"> frame {self.level}: {shown_where(frame.f_code.co_filename, lineno)} in "
                 f"{frame.f_code.co_qualname}()")
        if text:
            self.say(f"    {text}")
        if self.level:  # what a retry here would draw anew (say it before the choice)
            for note in redraws(self.crash, self.level):
                self.say(f"  note: retry here re-executes the call: {note}")

    def _move(self, arg: str, direction: int) -> bool:
        frames = self.crash.frames()
        name = arg.strip()
        if name and not name.lstrip("-").isdigit():
            # up NAME / down NAME: to the nearest frame of that function in that
            # direction -- one broadcast lands in the same function on ranks
            # whose stacks differ in depth
            wanted = range(self.level + 1, len(frames)) if direction > 0 else \
                range(self.level - 1, -1, -1)
            found = next((n for n in wanted if frames[n].f_code.co_name == name
                          or frames[n].f_code.co_qualname == name), None)
            if found is None:
                self.ok = False
                self.say(f"no frame of {name}() {'above' if direction > 0 else 'below'} "
                         "the one in focus (bt lists them)")
                return False
            self.level, self._listed = found, None
            self.crash.focus = found
            self._show_focus()
            return False
        try:
            steps = int(name) if name else 1
        except ValueError:
            self.ok = False
            self.say(f"usage: {'up' if direction > 0 else 'down'} [N | NAME]")
            return False
        # N frames of the program: installed code daifu did not vaccinate (torch's
        # Module.__call__, Lightning's loops, ipykernel) is passed over; `frame N`
        # numbers stay those of bt all
        level, moved = self.level, 0
        while moved < abs(steps):
            nxt = level + (1 if steps * direction > 0 else -1)
            while 0 <= nxt < len(frames) and nxt != 0 and is_library(frames[nxt]):
                nxt += 1 if steps * direction > 0 else -1
            if not 0 <= nxt < len(frames):
                break
            level, moved = nxt, moved + 1
        if moved < abs(steps):
            self.ok = False
            self.say("already at the " + ("outermost frame" if steps * direction > 0 else
                                          "crashed frame"))
        self.level, self._listed = level, None
        self.crash.focus = level
        self._show_focus()
        return False

    def do_up(self, arg: str) -> bool:
        """up [N | NAME]: focus on the caller (N frames up, or the nearest frame of NAME)"""
        return self._move(arg, 1)

    def do_down(self, arg: str) -> bool:
        """down [N | NAME]: focus back towards the crashed frame"""
        return self._move(arg, -1)

    do_u, do_d = do_up, do_down

    def do_bt(self, arg: str) -> bool:
        """bt [all]: the call stack, outermost first; > marks the frame in focus
        (runs of installed library frames are one line; bt all shows them)"""
        frames = self.crash.frames()
        every = arg.strip() == "all"
        hidden: list[int] = []
        for n in range(len(frames) - 1, -1, -1):
            frame = frames[n]
            if not every and n and n != self.level and is_library(frame):
                hidden.append(n)
                if n - 1 >= 0 and (n - 1 == 0 or n - 1 == self.level
                                   or not is_library(frames[n - 1])):
                    self._say_hidden(frames, hidden)
                    hidden = []
                continue
            lineno = self._frame_line(frame)
            mark = ">" if n == self.level else " "
            crashed = "  <- crashed here" if n == 0 else ""
            self.say(f"{mark} {n:2d} {shown_where(frame.f_code.co_filename, lineno)} in "
                     f"{frame.f_code.co_qualname}(){crashed}")
            text = running_line(frame.f_code.co_filename, lineno, frame.f_code).strip()
            if text:
                self.say(f"        {text}")
        return False

    do_backtrace = do_bt

    def _say_hidden(self, frames: list, hidden: list[int]) -> None:
        packages = sorted({library_package(frames[n].f_code.co_filename) for n in hidden})
        self.say(f"  {hidden[0]:2d}-{hidden[-1]} ... {len(hidden)} frame"
                 f"{'s' if len(hidden) != 1 else ''} of {', '.join(packages)} "
                 "(bt all shows them)" if len(hidden) > 1 else
                 f"  {hidden[0]:2d} ... 1 frame of {packages[0]} (bt all shows it)")

    def do_l(self, arg: str) -> bool:
        """l [FIRST[, LAST]]: list source around the focused frame's line"""
        frame = self.frame
        current = self._frame_line(frame)
        try:
            if arg.strip() == ".":
                first, last = max(1, current - 5), current + 5
            elif arg.strip():
                parts = [int(x) for x in arg.replace(",", " ").split()]
                first = parts[0]
                last = parts[1] if len(parts) > 1 else first + 10
            elif self._listed is not None:
                first, last = self._listed, self._listed + 10
            else:
                first, last = max(1, current - 5), current + 5
        except ValueError:
            self.ok = False
            self.say("usage: l [FIRST[, LAST]] | l .")
            return False
        self._list(frame, first, last, current)
        self._listed = last + 1
        return False

    def do_ll(self, arg: str) -> bool:
        """ll: the whole source of the focused frame's function"""
        frame = self.frame
        code = frame.f_code
        lines = running_lines(code.co_filename, code)
        first = code.co_firstlineno
        if code.co_name == "<module>":
            last = len(lines)
        else:
            import inspect

            try:
                block = inspect.getblock(lines[first - 1:])
                last = first + len(block) - 1
            except Exception:
                last = first + 20
        self._list(frame, first, last, self._frame_line(frame))
        return False

    def _list(self, frame, first: int, last: int, current: int) -> None:
        filename = frame.f_code.co_filename
        for n in range(first, last + 1):
            text = running_line(filename, n, frame.f_code)
            if not text:
                break
            marker = "->" if n == current else "  "
            self.say(f"{n:5d} {marker} {text.rstrip()}")

    def do_interact(self, arg: str) -> bool:
        """interact: a Python prompt in the focused frame"""
        if not self.local:
            self.ok = False
            self.say("interact needs the job's own terminal; use ! or exec from here")
            return False
        import code as code_module

        frame = self.frame
        names = dict(frame.f_globals)
        names.update(read_locals(frame))
        before = dict(names)
        code_module.interact(banner=f"*interactive* in {frame.f_code.co_qualname}() -- "
                                    "Ctrl-D returns to the console", local=names, exitmsg="")
        changed = {k: v for k, v in names.items() if k not in before or before[k] is not v}
        if changed:  # written back the way exec does it (journaled, replayable)
            assignments = "\n".join(f"{k} = __daifu_interact__[{k!r}]" for k in changed)
            frame.f_globals["__daifu_interact__"] = changed
            try:
                self._exec(assignments)
            finally:
                frame.f_globals.pop("__daifu_interact__", None)
            self.say(f"kept: {', '.join(sorted(changed))}")
        return False

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
        from ._break import is_break

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
            patch = AlwaysPatch(action=word or "list", origin=self.origin)
            self.apply(patch)
            self.say(patch.result)
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
            patch = AlwaysPatch(action="set", decision=decision, origin=self.origin)
            self.apply(patch)
            self.say(patch.result)
        return stop

    def do_checkpoint(self, arg: str) -> bool:
        """checkpoint [PATH]: save the training state now (what a crash given up saves)"""
        path = os.path.abspath(os.path.expanduser(arg.strip())) if arg.strip() else None
        patch = CheckpointPatch(path=path, origin=self.origin)
        try:
            self.apply(patch)
        except PatchError:
            self.ok = False
        self.say(patch.result)
        return False

    def do_reload(self, arg: str) -> bool:
        """reload: re-read edited source files and resume in the new code"""
        patch = ReloadPatch(origin=self.origin, frame=self.level)
        try:
            self.apply(patch)
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
        """vars: the focused frame's variables"""
        variables = read_locals(self.frame)
        for name in sorted(variables):
            if not name.startswith("__"):
                self.say(f"  {name} = {summarize(variables[name])}")
        return False

    def do_p(self, arg: str) -> bool:
        """p EXPR: evaluate an expression in the focused frame and print its repr"""
        return self._print(arg, pretty=False, usage="p")

    def do_pp(self, arg: str) -> bool:
        """pp EXPR: evaluate an expression in the focused frame, pretty-printed"""
        return self._print(arg, pretty=True, usage="pp")

    def _print(self, expr: str, pretty: bool, usage: str = "") -> bool:
        if not expr:
            self.ok = False
            self.say(f"usage: {usage} EXPR")
            return False
        try:
            value = self._eval(expr)
        except PatchError as err:
            self.ok = False
            self.say(str(err))
            return False
        except Exception as exc:
            self.ok = False  # (the exception alone: not the command machinery it ran in)
            self.say("".join(traceback.format_exception_only(exc)).rstrip())
            return False
        if pretty:
            self.say(pprint.pformat(value, width=100))
        elif _is_tensor(value):  # as the report shows it; a small one with its values
            self.say(summarize(value))
            if _numel(value) <= 20:
                self.say(_safe_repr(value))
        else:
            self.say(_safe_repr(value))
        return False

    def _eval(self, expr: str) -> Any:
        if self.level == 0:
            return self.crash.eval(expr)
        try:
            compiled = compile(expr, f"<daifu eval in frame {self.level}>", "eval")
        except SyntaxError as exc:
            raise PatchError(f"expression does not compile: {exc}") from None
        frame = self.frame
        return eval(compiled, frame.f_globals, dict(read_locals(frame)))

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
            self.apply(ExecPatch(code, origin=self.origin, frame=self.level))
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

    # -- distributed jobs --------------------------------------------------------------

    def _job_ranks(self):
        """(the job's ranks, the *other* ranks that wait on a crash, every
        rank's status that answered), or None outside a distributed job."""
        from ..remote._jobstore import JobRanks

        info = _events.job_file_info()
        if info.get("job") is None:
            self.ok = False
            self.say("this process is not a rank of a distributed job")
            return None
        ranks = JobRanks(info)
        statuses = ranks.statuses()
        me = info.get("rank")
        others = [s for r, s in sorted(statuses.items())
                  if r != me and s.get("state") == "waiting"]
        return ranks, others, statuses

    def do_ranks(self, arg: str) -> bool:
        """ranks: the job's ranks that wait on a crash (on every node, through the job's store)"""
        from ..remote._jobstore import place

        found = self._job_ranks()
        if found is None:
            return False
        ranks, others, statuses = found
        me = _events.distributed()
        self.say(f"> rank {me.get('rank')} (pid {os.getpid()}): {self.crash.where} "
                 f"{type(self.crash.exception).__qualname__}: {self.crash.statement}")
        for job in others:
            self.say(f"  rank {job.get('rank')} ({place(job)}): {job['where']} "
                     f"{job['exc_type']}: {job['statement']}")
        running = sorted(r for r, s in statuses.items()
                         if s.get("state") != "waiting" and r != me.get("rank"))
        if running:
            self.say(f"  running (not at a crash): rank {', '.join(map(str, running))}")
        statuses.setdefault(int(me.get("rank", -1)), {})  # (this rank answered, of course)
        unanswered = ranks.unanswered(statuses)
        if unanswered:
            self.say(f"  {unanswered}")
        return False

    def do_rank(self, arg: str) -> bool:
        """rank N: talk to rank N's crash (``back`` returns here)"""
        from ..remote._control import EndpointError

        found = self._job_ranks()
        if found is None:
            return False
        ranks, others, _ = found
        if arg.strip() == str(_events.distributed().get("rank")):
            self.say(f"this is rank {arg.strip()}'s own crash (the console already talks to "
                     "it)")
            return False
        target = [j for j in others if str(j.get("rank")) == arg.strip()]
        if not target:
            self.ok = False
            self.say(f"rank {arg.strip()!r} does not wait on a crash (see `ranks`)")
            return False
        session = ranks.session(target[0])
        try:
            hello = session.open()
            if not hello.get("ok"):
                raise EndpointError(hello.get("error") or "refused")
            self.say(hello.get("report", ""))
            prompt = f"(daifu rank {arg.strip()}) "
            while True:
                line = self._readline(prompt)
                if line is None or line.strip() == "back":
                    self.say(f"back at rank {_events.distributed().get('rank')}")
                    return False
                if not line.strip():
                    continue
                reply = session.command(line)
                if reply.get("output"):
                    self.say(reply["output"])
                if reply.get("error"):
                    self.say(reply["error"])
                    return False
                if reply.get("resumed") or reply.get("decision"):
                    self.say(f"rank {arg.strip()}: {reply.get('decision')}; back at rank "
                             f"{_events.distributed().get('rank')}")
                    return False
        except (EndpointError, OSError) as exc:
            self.ok = False
            self.say(f"rank {arg.strip()}: {exc}")
            return False
        finally:
            session.close()

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

    def do_all(self, arg: str) -> bool:
        """all COMMAND: COMMAND on every waiting rank of the job, together"""
        import threading

        if not arg.strip():
            self.ok = False
            self.say("usage: all COMMAND   (e.g. all exec lr = 0.01, all retry)")
            return False
        found = self._job_ranks()
        if found is None:
            return False
        ranks, others, _ = found
        replies: dict[int, dict] = {}
        sender = threading.Thread(target=lambda: replies.update(ranks.send(others, arg)),
                                  daemon=True)
        sender.start()  # the others at once: a decision waits until every rank took it
        self.scope = "job"
        try:
            stop = self.onecmd(arg)
        finally:
            self.scope = "rank"
        sender.join()
        for job in others:
            reply = replies.get(int(job["rank"]), {})
            text = (reply.get("output") or "").rstrip() or reply.get("error") or (
                reply.get("decision") or "ok")
            self.say(f"rank {job.get('rank')}: {text}")
        return stop

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

    complete_pp = complete_p

    def _names(self, text: str) -> list[str]:
        try:
            frame = self.frame
            variables = read_locals(frame)
            if "." in text:  # attribute completion: only for a dotted name (nothing is called)
                head, _, tail = text.rpartition(".")
                if not all(part.isidentifier() for part in head.split(".")):
                    return []
                obj = eval(head, frame.f_globals, dict(variables))
                return sorted(f"{head}.{a}" for a in dir(obj) if a.startswith(tail)
                              and (tail.startswith("_") or not a.startswith("_")))
            names = set(variables) | set(frame.f_globals) | set(dir(builtins))
        except Exception:
            return []
        return sorted(n for n in names if n.startswith(text))


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


def _is_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _numel(value: Any) -> int:
    try:
        return int(value.numel())
    except Exception:
        return 0


def _safe_repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception as exc:
        return f"<{type(value).__name__}: repr failed: {type(exc).__name__}>"


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
                      local=False)
    console.scope = scope
    console.onecmd(console.precmd(first))
    return console, out.getvalue()
