"""The console's Python in the focused frame: ``p``, ``pp``, ``vars``, ``!``, ``exec``,
``interact`` and the completion of names."""

from __future__ import annotations

import builtins
import pprint
import sys
import traceback
from typing import TYPE_CHECKING, Any

from ..._errors import PatchError
from ...cells import read_locals
from .._queue import Apply, ExecPatch
from ._report import summarize

if TYPE_CHECKING:
    import types

    from .._crash import Crash


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


class Inspect:
    """The Python commands of the console (``_console.Console``)."""

    if TYPE_CHECKING:
        crash: Crash
        level: int
        ok: bool
        local: bool
        stdin: Any
        stdout: Any
        use_rawinput: bool
        apply: Apply
        origin: str

        @property
        def frame(self) -> types.FrameType: ...

        def say(self, text: str = "") -> None: ...

    def do_interact(self, arg: str) -> bool:
        """interact: a Python prompt in the focused frame"""
        if not self.local:
            self.ok = False
            self.say("interact needs the job's own terminal; use ! or exec from here")
            return False
        import code as code_module  # lazy: 3.5 ms

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

    def completedefault(self, text, line, begidx, endidx):
        return self._names(text)

    def complete_p(self, text, line, begidx, endidx):
        return self._names(text)

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

    complete_exec = complete_pp = complete_p
