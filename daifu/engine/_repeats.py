"""Repeated crashes are counted, not logged again.

A crash that comes back at every step and is fixed the same way each time (a
rule that drops every NaN batch, a retry that succeeds on a flaky read) would
otherwise add the same event lines and journal records per step: a training
run of a million steps, gigabytes of log.  So the handling of one crash -- its
events and journal records from interception to resume or give-up -- is
collected as a *group*.  Once ``SHOWN`` identical groups at one crash site
(where, exception type and message) were written, the next identical ones
are held back and counted; identical means equal but for what differs between
occurrences anyway (timestamps, latencies, the attempt, the journal's crash
number).  ``crash.repeated`` (and a ``repeat`` journal record, which replay
honours) gives the count: at the first one held back, at every power of ten,
when the handling at that site changes, and at exit.  In-process listeners
(``capture()``) still see every event.

A group that reaches a human (a waiter) is written as it happens and never
counted: what a person saw and did is always in the log.
"""

from __future__ import annotations

import collections
import threading

from .._record import field, record
from ._events import Event, event

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from typing import ClassVar

#: identical handlings at one site written in full before counting starts
SHOWN = 3
#: event fields that differ between otherwise identical occurrences
_VOLATILE = frozenset({"timestamp", "latency_ms", "attempt"})


@event
class CrashRepeated(Event):
    """The same crash, handled the same way, ``count`` times in all at this
    site; only the first ``shown`` were logged in full."""

    event: ClassVar[str] = "crash.repeated"
    where: str
    exc_type: str
    count: int
    shown: int = SHOWN


@record
class Group:
    """The events and journal records of one crash's handling."""

    site: tuple
    hold: bool  # held back until the end: written only if the handling differs
    events: list[Event] = field(default_factory=list)
    #: journal calls (method name, its arguments after the crash)
    records: list[tuple[str, tuple]] = field(default_factory=list)
    human: bool = False  # reached a waiter: written as it happens, never counted

    def signature(self) -> tuple:
        out: list[tuple[str, str]] = []
        for ev in self.events:
            if "where" not in ev.fields():
                continue  # not about this crash (the journal was opened, ...)
            kept = sorted((k, v) for k, v in ev.fields().items() if k not in _VOLATILE)
            out.append((ev.event, repr(kept)))
        out.extend((what, repr(args)) for what, args in self.records)
        return tuple(out)


@record
class Ending:
    """What the engine does when a group ends."""

    write_held: bool  # write the held events and journal records now
    report: CrashRepeated | None = None
    #: a ``repeat`` journal record: (journal number of the crash, more times)
    journal_repeat: tuple[int, int] | None = None


@record
class _Site:
    signature: tuple | None  # None: handled by a human; nothing repeats that
    count: int  # identical groups so far, the written ones included
    where: str
    exc_type: str
    reported: int = 0  # the count last reported
    journal_number: int | None = None  # the last crash of these written to the journal


class Repeats:
    """Per process (``Engine.repeats``): the last handling at each crash site."""

    def __init__(self, limit: int = 1024) -> None:
        self._sites: collections.OrderedDict[tuple, _Site] = collections.OrderedDict()
        self._limit = limit
        self._lock = threading.Lock()

    def begin(self, site: tuple) -> Group:
        with self._lock:
            known = self._sites.get(site)
            return Group(site, hold=known is not None and known.signature is not None
                         and known.count >= SHOWN)

    def end(self, group: Group, where: str, exc_type: str,
            journal_number: int | None) -> Ending:
        """The crash is decided: count the group, or have it written and
        remember its content for the next occurrence at the same site."""
        signature = None if group.human else group.signature()
        with self._lock:
            known = self._sites.get(group.site)
            if known is not None:
                self._sites.move_to_end(group.site)
            if known is not None and signature is not None and known.signature == signature:
                known.count += 1
                if not group.hold:
                    known.journal_number = journal_number
                    return Ending(write_held=False)
                if known.count == SHOWN + 1 or _power_of_ten(known.count):
                    return self._report(known, Ending(write_held=False))
                return Ending(write_held=False)
            ending = Ending(write_held=group.hold)
            if known is not None and known.count > max(known.reported, SHOWN):
                ending = self._report(known, ending)  # the last count of the old handling
            self._sites[group.site] = _Site(signature, 1, where, exc_type,
                                            journal_number=journal_number)
            while len(self._sites) > self._limit:
                self._sites.popitem(last=False)
            return ending

    def written(self, site: tuple, journal_number: int) -> None:
        """A held group was written after all (its handling changed): its
        journal number is the one later repeats refer to."""
        with self._lock:
            known = self._sites.get(site)
            if known is not None:
                known.journal_number = journal_number

    def flush(self) -> list[Ending]:
        """The counts not yet reported (at exit)."""
        with self._lock:
            return [self._report(site, Ending(write_held=False))
                    for site in self._sites.values()
                    if site.count > max(site.reported, SHOWN)]

    def clear(self) -> None:
        with self._lock:
            self._sites.clear()

    @staticmethod
    def _report(site: _Site, ending: Ending) -> Ending:
        more = site.count - max(site.reported, SHOWN)
        site.reported = site.count
        ending.report = CrashRepeated(where=site.where, exc_type=site.exc_type,
                                      count=site.count)
        if site.journal_number is not None and more > 0:
            ending.journal_repeat = (site.journal_number, more)
        return ending


def _power_of_ten(n: int) -> bool:
    while n >= 10 and n % 10 == 0:
        n //= 10
    return n == 1
