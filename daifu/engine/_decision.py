"""What a fix decides: re-execute the failing statement, skip it, or give up."""

from __future__ import annotations

import enum


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
