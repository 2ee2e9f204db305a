"""Patches and the in-process queue they arrive through.

The queue is the single door into a crashed program: rules, and later the
console, remote attach and journal replay, all put patches here; the engine
takes them out and applies them in order while the crashed frame waits.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable

from .._record import field, record
from ._decision import Decision

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from typing import Any, ClassVar


@record
class Patch:
    """Base class.  ``origin`` says who sent it (``rule:fixes.fix_path``, ...)."""

    kind: ClassVar[str] = "patch"
    origin: str = field(default="", kw_only=True)

    def summary(self) -> str:
        return self.kind


@record
class DecisionPatch(Patch):
    """Resume the crashed frame: retry, skip, or give up."""

    kind: ClassVar[str] = "decision"
    decision: Decision
    #: 0: the crashed frame; N: its N-th (non-daifu) caller, where the
    #: exception is handed and the decision is taken (the console's ``up``)
    frame: int = 0
    #: "rank": this process alone; "job": every rank of a distributed job
    #: takes it together (engine/remote/_distributed.py ``agree``)
    scope: str = "rank"

    def summary(self) -> str:
        return self.decision.value + (f" (in caller frame {self.frame})" if self.frame else "") \
            + (" (all ranks)" if self.scope == "job" else "")


@record
class ExecPatch(Patch):
    """Run code in the crashed frame's context (the paper's *action*)."""

    kind: ClassVar[str] = "exec"
    code: str
    #: 0: the crashed frame; N: its N-th (non-daifu) caller
    frame: int = 0

    def summary(self) -> str:
        first = self.code.strip().splitlines()[0] if self.code.strip() else ""
        text = first if len(first) < 80 else first[:77] + "..."
        return text + (f" (in caller frame {self.frame})" if self.frame else "")


@record
class ReplacePatch(Patch):
    """Swap a function's code everywhere it is referenced (the paper's *surgery*)."""

    kind: ClassVar[str] = "replace"
    target: Any
    new: Any

    def summary(self) -> str:
        name = getattr(self.target, "__qualname__", repr(self.target))
        return f"{name} <- {getattr(self.new, '__qualname__', repr(self.new))}"


@record
class ReloadPatch(Patch):
    """Re-read changed source files and swap the code of changed functions,
    continuing the running function in its new code (the paper's *surgery*).
    ``sources`` (filename -> text) replaces reading from disk (journal replay)."""

    kind: ClassVar[str] = "reload"
    sources: dict[str, str] | None = None
    #: the frame in focus (0: the crashed one): a changed function running
    #: there continues in its new code (``_reload``)
    frame: int = 0
    #: set by the engine on the patch it hands to a caller's barrier: that
    #: caller's part of a reload already applied (``_reload.CallerResume``)
    resume: Any = None

    def summary(self) -> str:
        return "reload"


@record
class AlwaysPatch(Patch):
    """The console's ``always``: ``action`` "set" remembers ``decision`` as
    the standing answer to this crash's statement and exception type (after
    this crash's exec patches); "list" and "clear" show and forget them."""

    kind: ClassVar[str] = "always"
    action: str = "list"
    decision: Decision | None = None

    def summary(self) -> str:
        return f"always {self.decision.value}" if self.decision else f"always {self.action}"


@record
class CheckpointPatch(Patch):
    """Save the training state now (``_checkpoint``); ``path``: where (None:
    the checkpoint directory)."""

    kind: ClassVar[str] = "checkpoint"
    path: str | None = None


@record
class Applied:
    """What applying a patch did (the engine's answer; the patch itself is
    never written to): the decision it makes, if any; the text to show
    (``always``, ``checkpoint``); the reload's result (``_reload``); the
    checkpoint file saved."""

    decision: Decision | None = None
    said: str = ""
    reload: Any = None
    saved: str | None = None

    def summary(self, patch: Patch) -> str:
        return self.reload.summary() if self.reload is not None else patch.summary()


#: what a console applies patches through: the engine's door for one crash
#: (``Engine.door``); raises ``PatchError`` when a patch is rejected
Apply = Callable[[Patch], Applied]


class PatchQueue:
    """A thread-safe FIFO of patches."""

    def __init__(self) -> None:
        self._items: collections.deque[Patch] = collections.deque()
        self._lock = threading.Lock()

    def put(self, patch: Patch) -> None:
        with self._lock:
            self._items.append(patch)

    def get_nowait(self) -> Patch | None:
        with self._lock:
            return self._items.popleft() if self._items else None

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
