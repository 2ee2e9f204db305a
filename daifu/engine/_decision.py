"""What a fix decides: re-execute the failing statement, skip it, or give up."""

from __future__ import annotations

import enum
import types

from .._record import record

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from typing import Any


class Decision(enum.Enum):
    """The answer a rule (or a human, later) gives to a crash."""

    RETRY = "retry"  #: re-execute the failing statement
    SKIP = "skip"  #: continue after the failing statement (or end a failing loop header)
    CONTINUE = "continue"  #: like a ``continue`` statement here: the loop's next item
    ABORT = "abort"  #: give up: the exception continues exactly as without daifu
    RELOAD = "reload"  #: re-read changed source files, then resume in the new code

    def __repr__(self) -> str:
        return f"daifu.{self.name}"


RETRY = Decision.RETRY
SKIP = Decision.SKIP
CONTINUE = Decision.CONTINUE
ABORT = Decision.ABORT
RELOAD = Decision.RELOAD

#: what a waiter answers when the human passed the crash on to a vaccinated caller
PASSED_ON = "passed on to a vaccinated caller"


class AllRanks:
    """A rule's decision for every rank of a distributed job
    (``return daifu.all_ranks(daifu.CONTINUE)``): it runs only when every rank
    is at the same crash and takes it too, so their collectives stay in step."""

    __slots__ = ("decision",)

    def __init__(self, decision: Decision) -> None:
        if not isinstance(decision, Decision):
            raise TypeError(f"daifu.all_ranks() takes daifu.RETRY, daifu.SKIP, daifu.CONTINUE "
                            f"or daifu.ABORT, not {decision!r}")
        self.decision = decision

    def __repr__(self) -> str:
        return f"daifu.all_ranks({self.decision!r})"


def all_ranks(decision: Decision) -> AllRanks:
    """``decision`` for every rank of the job together (see ``AllRanks``)."""
    return AllRanks(decision)


@record
class Resolution:
    """How one crash ends: built up while its patches are applied, then
    turned into the stub's answer by ``Engine._conclude`` alone.  Nothing
    else about the outcome is kept on the ``Crash``."""

    #: the decision taken (None: nobody fixed it)
    decision: Decision | None = None
    #: why (who decided, or why nobody did): the journal's outcome and the give-up line
    reason: str = ""
    #: a decision for a caller (the console's ``up`` then ``retry``): the
    #: exception, that caller's frame and the patch; the exception goes up to it
    upward: tuple[BaseException, types.FrameType, Any] | None = None
    #: a reload's result (``_reload.ReloadResult``)
    reload: Any = None
    #: (function, args): the frame returns this call instead of resuming in
    #: place (a loop going on over another iterator, a reloaded function)
    continuation: tuple | None = None
    #: what the resume does besides the plain decision (a batch fetched again)
    note: str = ""
    #: a human was asked and did not fix it: callers' barriers must not ask again
    final: bool = False
    #: a function replaced while it runs on the crashed stack: (its outermost
    #: level there, its name); a retry re-executes its call in a caller
    replaced: tuple[int, str] | None = None
    #: a decision applied by ``Engine.submit`` (a rule's ``crash.exec`` of a
    #: decision patch), not yet taken by the engine's loop
    queued: Decision | None = None
