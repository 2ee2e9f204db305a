"""The engine applies patches: the queue's door (``submit``, ``door``), one
dispatch per kind of patch, and the decisions taken for a caller's frame."""

from __future__ import annotations

import types

from .._errors import PatchError
from .._record import replace as changed
from ..cells import (
    FrameContext,
    cell_range,
    cells_of,
    read_locals,
)
from ._crash import Crash, always_key, exception_text
from ._decision import (
    ABORT,
    CONTINUE,
    RELOAD,
    RETRY,
    SKIP,
    Decision,
)
from ._events import (
    PatchApplied,
    PatchRejected,
    emit,
)
from ._queue import (
    AlwaysPatch,
    Applied,
    Apply,
    CheckpointPatch,
    DecisionPatch,
    ExecPatch,
    Patch,
    ReloadPatch,
    ReplacePatch,
)
from .remote import _distributed

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from typing import Any


def _short(value: Any, limit: int = 60) -> str:
    try:
        text = repr(value)
    except Exception:
        text = "?"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def exec_in_frame(frame: types.FrameType, code: str) -> None:
    """Run ``code`` in a suspended frame's context: assignments to its
    variables are written back; new names become globals.  Raises
    ``PatchError`` if the code does not compile or raises."""
    try:
        compiled = compile(code, "<daifu exec>", "exec")
    except SyntaxError as err:
        raise PatchError(f"code does not compile: {err}") from None
    ctx = FrameContext(frame)
    if ctx.is_module:
        try:
            exec(compiled, frame.f_globals, read_locals(frame))
        except Exception as err:
            raise PatchError(f"code raised {exception_text(err, with_type=True)}") from err
        return
    before = read_locals(frame)
    namespace = dict(before)
    try:
        exec(compiled, frame.f_globals, namespace)
    except Exception as err:
        raise PatchError(f"code raised {exception_text(err, with_type=True)}") from err
    names = ctx.names or frozenset()
    changed = {k: v for k, v in namespace.items()
               if k in names and (k not in before or before[k] is not v)}
    deleted = tuple(k for k in before if k not in namespace and k in names)
    new_globals = {k: v for k, v in namespace.items() if k not in names and k not in before}
    if changed or deleted:
        ctx.update_many(changed, deleted)
    frame.f_globals.update(new_globals)


def _prepare_loop_header(decision: Decision, crash: Crash) -> None:
    """RETRY or CONTINUE at a loop header: a pass-through wrapper that died
    is swapped for the iterator it read (a continuation with that stack);
    RETRY of a failed DataLoader batch fetches the same batch again
    (``_loaders``).  Raises ``PatchError``, changing nothing."""
    notes = []
    if crash.rewrap is not None:
        from ._reload import resume_with_stack  # lazy: 36.6 ms

        slot = crash.cell.iterator_slot
        assert slot is not None  # (a rewrap is only found for a loop's iterator)
        stack = list(crash.stack)
        stack[slot] = crash.rewrap[0]
        crash.resolution.continuation = resume_with_stack(crash, tuple(stack))
        notes.append(crash.rewrap[1])
    if decision is RETRY and crash.batch is not None:
        from . import _loaders  # lazy: 3.4 ms

        try:
            _loaders.arrange_refetch(crash.batch)
        except PatchError:
            crash.resolution.continuation = None
            raise
        notes.append(f"the failed batch is fetched again (indices {_short(crash.batch.index)})")
    crash.resolution.note = "; ".join(notes)


class Patches:
    """A part of ``Engine`` (``_engine.py``): see this module."""

    if TYPE_CHECKING:  # (the engine's, used here)
        _internal: Any
        _record: Any
        _tls: Any
        always: Any
        journal: Any
        save_checkpoint: Any

    def _meta(self, patch: AlwaysPatch | CheckpointPatch, crash: Crash | None) -> Applied:
        """``always`` and ``checkpoint`` from a console.  Raises ``PatchError``."""
        if crash is None:
            raise PatchError(f"{patch.kind} needs a crash")
        if isinstance(patch, CheckpointPatch):
            saved, said = self.save_checkpoint(crash, patch.path)
            if saved is None:
                raise PatchError(said)
            return Applied(said=said, saved=saved)
        if patch.action == "set" and patch.decision is not None:
            return Applied(said=self.remember(crash, patch.decision, patch.origin))
        if patch.action == "clear":
            n = len(self.always)
            self.always.clear()
            return Applied(said=f"forgot {n} standing answer{'s' if n != 1 else ''}")
        lines = [f"  {exc} at {filename}:{line} ({statement}): {said.value}"
                 + (f" after {len(execs)} exec patch{'es' if len(execs) != 1 else ''}"
                    if execs else "")
                 for (filename, line, statement, exc), (said, execs, _)
                 in self.always.items()]
        return Applied(said="\n".join(lines) or "no standing answers (always DECISION sets one)")

    def remember(self, crash: Crash, decision: Decision, origin: str) -> str:
        """``always DECISION``: answer later crashes of this exception type at
        this statement the same way, after this crash's exec patches; journaled."""
        execs = tuple(crash.execs)
        self.always[always_key(crash)] = (decision, execs, f"always ({origin})")
        if self.journal is not None:
            try:
                self.journal.always(crash, decision, execs)
            except Exception:
                self._internal("journal", crash)
        also = f" after {len(execs)} exec patch{'es' if len(execs) != 1 else ''}" if execs \
            else ""
        return (f"from now on, {type(crash.exception).__qualname__} at {crash.where} "
                f"({crash.statement}) is answered: {decision.value}{also}")

    def submit(self, patch: Patch, crash: Crash | None = None) -> Applied:
        """Queue a patch; applied now when called while handling a crash in
        this thread (a rule calling ``crash.exec``), else when the next crash
        is handled.  Returns what applying it did; raises ``PatchError`` if
        applying it fails."""
        if not patch.origin:
            patch = changed(patch, origin=getattr(self._tls, "origin", None) or "api")
        current = crash or getattr(self._tls, "crash", None)
        if current is None:
            # not inside a crash: apply directly (a replace in a fixes file, say)
            return self._apply(patch, None)
        current.patches.put(patch)
        failure: PatchError | None = None
        mine = Applied()
        decision = None
        while (item := current.patches.get_nowait()) is not None:
            try:
                applied = self._apply(item, current)
            except PatchError as err:
                if item is patch:
                    failure = err
                continue
            if item is patch:
                mine = applied
            if applied.decision is not None and decision is None:
                decision = applied.decision
        if decision is not None:
            current.resolution.queued = decision
        if failure is not None:
            raise failure
        return mine

    def door(self, crash: Crash) -> Apply:
        """The one way a console reaches this crash: a patch goes into its
        queue and is applied at once (``submit``); raises ``PatchError``."""
        return lambda patch: self.submit(patch, crash)

    def _drain(self, crash: Crash) -> Decision | None:
        decided = crash.resolution.queued
        if decided is not None:
            crash.resolution.queued = None
            return decided
        while (patch := crash.patches.get_nowait()) is not None:
            try:
                applied = self._apply(patch, crash)
            except PatchError:
                continue
            if applied.decision is not None:
                return applied.decision
        return None

    def _apply(self, patch: Patch, crash: Crash | None) -> Applied:
        """Apply one patch through the table of its kind (``_APPLY``): what
        it did, its decision if it makes one.  Announced and journaled,
        applied or refused (a refusal raises ``PatchError``)."""
        where = crash.where if crash else ""
        if isinstance(patch, DecisionPatch) and patch.decision is RELOAD:
            patch = ReloadPatch(origin=patch.origin, frame=patch.frame)
        if isinstance(patch, (AlwaysPatch, CheckpointPatch)):
            return self._meta(patch, crash)  # (they change nothing of the crash: not journaled)
        try:
            if isinstance(patch, DecisionPatch) and crash is not None:
                patch = self._redirect(patch, crash)
            apply = _APPLY.get(patch.kind)
            if apply is None:
                raise PatchError(f"unknown patch kind {type(patch).__name__}")
            applied: Applied = apply(self, patch, crash)
        except PatchError as err:
            emit(PatchRejected(where=where, kind=patch.kind, origin=patch.origin,
                               reason=str(err)))
            self._record("patch", crash, patch, "rejected", str(err))
            raise
        summary = applied.summary(patch)
        if isinstance(patch, DecisionPatch) and crash is not None and crash.resolution.note:
            summary += f": {crash.resolution.note}"
        emit(PatchApplied(where=where, kind=patch.kind, origin=patch.origin, summary=summary))
        self._record("patch", crash, patch, "applied", None, applied.reload)
        return applied

    def _apply_reload(self, patch: ReloadPatch, crash: Crash | None) -> Applied:
        if crash is None:
            raise PatchError("reload needs a crash to resume")
        return self._reload(patch, crash)

    def _apply_decision(self, patch: DecisionPatch, crash: Crash | None) -> Applied:
        if patch.frame:
            return Applied(decision=self._upward(patch, crash))
        return Applied(decision=self._check_decision(patch.decision, crash, patch.scope))

    def _apply_exec(self, patch: ExecPatch, crash: Crash | None) -> Applied:
        if crash is None:
            raise PatchError("exec needs a crashed frame to run in")
        exec_in_frame(crash.frame_at(patch.frame), patch.code)
        crash.execs.append(patch)
        return Applied()

    def _apply_replace(self, patch: ReplacePatch, crash: Crash | None) -> Applied:
        from ._replace import apply_replace  # lazy: 1.2 ms

        replaced = apply_replace(patch.target, patch.new, crash)
        if replaced is not None and crash is not None:
            old = crash.resolution.replaced
            crash.resolution.replaced = replaced if old is None or old[0] < replaced[0] else old
        return Applied()

    def _reload(self, patch: ReloadPatch, crash: Crash) -> Applied:
        """Apply a reload (``_reload``).  When a changed caller is to continue
        in its new code, the exception is handed up to that caller's barrier
        with the caller's part (``patch.resume``), applied there."""
        from ._reload import reload, resume_caller  # lazy: 36.6 ms

        if patch.resume is None:
            result = reload(crash, patch.sources, patch.frame)
            caller = result.caller
            if result.retry_caller is not None:
                level = result.retry_caller
                crash.resolution.upward = (crash.exception, crash.frame_at(level),
                                           DecisionPatch(RETRY, origin=patch.origin,
                                                         frame=level))
            elif caller is not None:
                crash.resolution.upward = (crash.exception, crash.frame_at(caller.level),
                                           ReloadPatch(origin=patch.origin, frame=caller.level,
                                                       resume=caller))
            crash.resolution.reload = result
            return Applied(decision=RELOAD, reload=result)
        try:
            result = resume_caller(crash, patch.resume)
        except PatchError as err:  # the new code is in already: the call is re-executed
            decision = self._check_decision(RETRY, crash)
            crash.resolution.note = (f"{crash.function}() keeps its old code ({err}); its "
                                     "statement is retried, calling the new code")
            return Applied(decision=decision)
        crash.resolution.reload = result
        return Applied(decision=RELOAD, reload=result)

    @staticmethod
    def _redirect(patch: DecisionPatch, crash: Crash) -> DecisionPatch:
        """A retry after ``replace`` of a function that runs on the crashed
        stack: its running call keeps the old code, so the retry re-executes
        the call in the nearest vaccinated caller (``_replace.rerun_level``)."""
        replaced = crash.resolution.replaced
        if patch.decision is not RETRY or replaced is None or patch.frame > replaced[0]:
            return patch
        from ._replace import rerun_level  # lazy: 1.2 ms
        from .human._report import redraws  # lazy: 16.4 ms

        level = rerun_level(crash, replaced)
        crash.resolution.note = "; ".join([
            f"{replaced[1]}() was replaced while it runs: its call is re-executed in caller "
            f"frame {level} ({crash.frame_at(level).f_code.co_qualname})",
            *redraws(crash, level)])
        return changed(patch, frame=level)

    @staticmethod
    def _upward(patch: DecisionPatch, crash: Crash | None) -> Decision:
        """A decision for the crash's caller ``patch.frame``: checked that
        the caller is vaccinated (its barrier takes the exception there);
        the crash then passes the exception up (``_conclude``)."""
        if crash is None:
            raise PatchError("a decision needs a crash to resume")
        if patch.decision is RELOAD or patch.decision is ABORT:
            raise PatchError(f"{patch.decision.value} applies to the crash, not to a caller frame")
        target = crash.frame_at(patch.frame)
        info = cells_of(target.f_code)
        if info is None:
            raise PatchError(f"caller frame {patch.frame} ({target.f_code.co_qualname}) is not "
                             "vaccinated: it has no crash barrier to take the decision (vaccinate "
                             "it with --entry, or decide here)")
        # the caller's statement -- its call -- must take the decision: said
        # now, not after the exception left the crashed frame
        found = cell_range(info, target.f_code, target.f_lasti)
        if found is None:
            raise PatchError(f"caller frame {patch.frame} ({target.f_code.co_qualname}) has no "
                             "crash barrier at its current statement")
        cell = found[2]
        why = {RETRY: cell.retry_reason, SKIP: cell.skip_reason,
               CONTINUE: cell.continue_reason}.get(patch.decision)
        if why:
            raise PatchError(f"cannot {patch.decision.value} in caller frame {patch.frame} "
                             f"({target.f_code.co_qualname}): {why}")
        if patch.decision is RETRY:
            from .human._report import redraws  # lazy: 16.4 ms

            # (a replace's redirect said them already: once is enough)
            notes = [n for n in redraws(crash, patch.frame)
                     if n not in (crash.resolution.note or "")]
            if notes:
                crash.resolution.note = "; ".join([crash.resolution.note, *notes]).strip("; ")
        crash.resolution.upward = (crash.exception, target, patch)
        return patch.decision

    @staticmethod
    def _check_decision(decision: Decision, crash: Crash | None, scope: str = "rank") -> Decision:
        if crash is None:
            raise PatchError("a decision needs a crash to resume")
        if decision is RETRY and not crash.can_retry:
            raise PatchError(f"cannot retry here: {crash.retry_reason}")
        if decision is SKIP and not crash.can_skip:
            raise PatchError(f"cannot skip here: {crash.skip_reason}")
        if decision is CONTINUE and not crash.can_continue:
            raise PatchError(f"cannot continue the loop here: {crash.continue_reason}")
        if _distributed.active():  # one rank of several: keep the collectives in step
            if scope == "job":
                _distributed.agree(decision, crash)
            elif (reason := _distributed.local_reason(decision, crash)) is not None:
                raise PatchError(f"refused: {reason}")
        if crash.kind == "loop-header" and (decision is RETRY or decision is CONTINUE):
            _prepare_loop_header(decision, crash)
        return decision


#: how each kind of patch is applied (``Patches._apply``)
_APPLY: dict[str, Any] = {
    ReloadPatch.kind: Patches._apply_reload,
    DecisionPatch.kind: Patches._apply_decision,
    ExecPatch.kind: Patches._apply_exec,
    ReplacePatch.kind: Patches._apply_replace,
}
