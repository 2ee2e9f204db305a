"""The console's view of the crashed stack: the frame in focus, ``up``/``down``, ``bt``
and the source listings ``l`` and ``ll``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._crash import is_library, library_package
from ._report import redraws, running_line, running_lines, shown_where

if TYPE_CHECKING:
    from .._crash import Crash


class Frames:
    """The stack commands of the console (``_console.Console``)."""

    if TYPE_CHECKING:
        crash: Crash
        level: int
        ok: bool
        _listed: int | None

        def say(self, text: str = "") -> None: ...

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
            import inspect  # lazy: 7.3 ms

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

    do_u, do_d = do_up, do_down
    do_backtrace = do_bt
