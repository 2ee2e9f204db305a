"""What the engine writes down and tells: journal records, groups of repeated
crashes, the emergency checkpoint, its own internal errors."""

from __future__ import annotations

import sys

from ..cells import (
    read_locals,
)
from ._crash import Crash, exception_text
from ._events import (
    CheckpointFailed,
    CheckpointNote,
    CheckpointSaved,
    InternalError,
    RunSummary,
    emit,
    write,
)
from ._repeats import Ending, Group

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from typing import Any


def _in_dataloader_worker() -> bool:
    data = sys.modules.get("torch.utils.data")
    try:
        return data is not None and data.get_worker_info() is not None
    except Exception:
        return False


class Outcomes:
    """A part of ``Engine`` (``_engine.py``): see this module."""

    if TYPE_CHECKING:  # (the engine's, used here)
        _lock: Any
        _tls: Any
        checkpoint_dir: Any
        checkpoints: Any
        gave_up: Any
        journal: Any
        repeats: Any
        stats: Any

    def save_checkpoint(self, crash: Crash, path: str | None = None
                        ) -> tuple[str | None, str]:
        """Write the emergency checkpoint of ``crash``'s state (``_checkpoint``):
        ``(its path, what was saved)``, or ``(None, why not)`` -- nothing in
        reach to save, or it could not be written (an event says so too)."""
        from .persist._checkpoint import CheckpointError, save  # lazy: 9.5 ms
        from .persist._resume import KEEPER  # lazy: 13.0 ms

        if path is None and _in_dataloader_worker():
            return None, "a DataLoader worker: its copy of the model is not the job's state"

        def say(line: str) -> None:
            emit(CheckpointNote(where=crash.where, message=line))

        try:
            done = save(crash.frame, crash.where, crash.exception, self.checkpoint_dir, path,
                        read_locals=read_locals, say=say, point=KEEPER)
        except CheckpointError as exc:
            emit(CheckpointFailed(where=crash.where, reason=str(exc)))
            return None, str(exc)
        except Exception as exc:  # daifu must never make a crash worse
            reason = f"internal error: {type(exc).__name__}: {exc}"
            emit(CheckpointFailed(where=crash.where, reason=reason))
            return None, reason
        if done is None:
            return None, "nothing to save: no torch module or optimizer is in reach"
        self.checkpoints.append(done["path"])
        emit(CheckpointSaved(where=crash.where, path=done["path"], bytes=done["bytes"],
                             seconds=round(done["seconds"], 3), objects=done["objects"],
                             position=done["position"], frameworks=done["frameworks"]))
        what = "; ".join(f"{kind}: {', '.join(names)}" for kind, names in done["objects"].items())
        where = ", ".join(f"{k}={v}" for k, v in done["position"].items())
        also = "".join(f"; the {k} Trainer's own: {v}" for k, v in done["frameworks"].items())
        return done["path"], (f"saved {done['path']} ({done['bytes'] / 1e6:.1f} MB; {what}"
                              + (f"; position {where}" if where else "") + also + ")")

    def _record(self, what: str, crash: Crash | None, *args) -> None:
        """Append to the journal, if there is one; never fails the recovery.
        Inside a crash's handling the record is part of its group: held back
        with its events while it may be a repeat (``_repeats``)."""
        if self.journal is None:
            return
        group = getattr(self._tls, "group", None)
        if group is not None and crash is getattr(self._tls, "crash", None):
            group.records.append((what, args))
            if group.hold:
                return
        self._journal(what, crash, args)

    def _journal(self, what: str, crash: Crash | None, args: tuple) -> None:
        try:
            getattr(self.journal, what)(crash, *args)
        except Exception:
            self._internal("journal", crash)

    def _to_human(self) -> None:
        group = getattr(self._tls, "group", None)
        if group is None:
            return
        group.human = True
        if group.hold:
            group.hold = False
            self._write_group(group, self._tls.crash)

    def _write_group(self, group: Group, crash: Crash) -> None:
        for ev in group.events:
            write(ev)
        for what, args in group.records:
            self._journal(what, crash, args)

    def _end_group(self, group: Group, crash: Crash) -> None:
        try:
            number = None  # the crash's number in the journal, if it was written there
            if self.journal is not None and not group.hold and group.records:
                number = self.journal.crash_id(crash)
            ending = self.repeats.end(group, crash.where, type(crash.exception).__qualname__,
                                      number)
            if ending.write_held:
                self._write_group(group, crash)
                if self.journal is not None and group.records:
                    self.repeats.written(group.site, self.journal.crash_id(crash))
            self._report_repeat(ending)
        except Exception:
            self._internal("repeats", crash)

    def _report_repeat(self, ending: Ending) -> None:
        if ending.report is not None:
            emit(ending.report)
        if ending.journal_repeat is not None and self.journal is not None:
            try:
                self.journal.repeat(*ending.journal_repeat)
            except Exception:
                self._internal("journal", None)

    def report_repeats(self) -> None:
        """Say how often each repeated crash came back since it was last said
        (at exit: the runner's summary)."""
        for ending in self.repeats.flush():
            self._report_repeat(ending)

    def _internal(self, what: str, crash: Crash | None) -> None:
        try:
            import traceback  # lazy: 4.2 ms

            err = sys.exc_info()[1]
            emit(InternalError(where=crash.where if crash else what,
                               error=f"{what}: {exception_text(err, with_type=True)}",
                               traceback=traceback.format_exc()))
        except BaseException:
            pass

    def summary(self, fatal: BaseException | None = None):
        """The run's ``RunSummary`` (``fatal``: the exception the program dies
        of), or None when there was no crash to speak of."""

        died = int(fatal is not None and self.gave_up.holds(fatal))
        recovered = max(self.stats["recovered"], 0)
        if not recovered and not died:
            return None
        return RunSummary(crashes=recovered + died, recovered=recovered, gave_up=died,
                          handled_by_program=max(self.stats["gave_up"] - died, 0),
                          checkpoint=self.checkpoints[-1] if self.checkpoints else None)

    def _count(self, name: str, n: int) -> None:
        with self._lock:
            self.stats[name] += n
