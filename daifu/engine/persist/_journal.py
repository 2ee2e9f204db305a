"""The journal (every crash and every patch, as JSON lines) and its replay.

Each record is one line: ``{"type": "crash" | "patch" | "outcome", ...}``.
Patches carry what is needed to apply them again -- the code of exec
patches, the decision, and for reloads the unified diff (for people) and the
new source with a hash of the source it replaced (for replay).

``--replay JOURNAL`` re-applies the recorded patches when the same crash
recurs: same exception type, file, function and failing statement (not the
message text).  A recorded crash whose statement no longer matches, or a
reload recorded against other source, is skipped with a warning.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
import weakref

from ... import _record
from ... import cells as _registry  # (the loaded-files registry: get, files, record)
from ..._errors import DaifuWarning
from ..._private import check_private, open_private
from .._crash import exception_text
from .._decision import Decision
from .._events import Event, emit, event
from .._job import distributed, placeholders, rank_unknown_yet
from .._queue import DecisionPatch, ExecPatch, Patch, ReloadPatch, ReplacePatch

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from typing import Any

    from .._crash import Crash


_DISTRIBUTED = distributed()

#: journals kept in the default directory (the oldest are removed when a new
#: one is opened), and the most space they may take together
KEEP, KEEP_BYTES = 100, 200 * 1024 * 1024


class JournalError(ValueError):
    """A journal cannot be used (one line saying why)."""


def default_directory() -> str:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                            "state")
    return os.path.join(base, "daifu", "journal")


def default_path(script: str | None) -> str:
    stem = os.path.splitext(os.path.basename(script or "python"))[0] or "python"
    name = f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.jsonl"
    return os.path.join(default_directory(), name)


def journals(directory: str | None = None) -> list[os.DirEntry]:
    """The journals of this user in ``directory`` (default: daifu's), newest first."""
    directory = directory or default_directory()
    try:
        with os.scandir(directory) as entries:
            found = [e for e in entries if e.name.endswith(".jsonl")
                     and e.is_file(follow_symlinks=False)
                     and e.stat(follow_symlinks=False).st_uid == os.getuid()]
    except OSError:
        return []
    return sorted(found, key=lambda e: e.stat(follow_symlinks=False).st_mtime, reverse=True)


def prune(directory: str, keep: int = KEEP, keep_bytes: int = KEEP_BYTES,
          current: str | None = None) -> list[str]:
    """Remove the oldest journals beyond ``keep`` files or ``keep_bytes``."""
    removed, total = [], 0
    for n, entry in enumerate(journals(directory)):
        total += entry.stat(follow_symlinks=False).st_size
        if entry.path != current and (n >= keep or total > keep_bytes):
            try:
                os.unlink(entry.path)
                removed.append(entry.path)
            except OSError:
                pass
    return removed


def crash_key(crash: Crash) -> dict[str, str]:
    """What identifies "the same crash" across runs."""
    return {"exc_type": type(crash.exception).__qualname__,
            "file": os.path.basename(crash.filename), "function": crash.function,
            "statement": crash.statement}


def _sha(text: str) -> str:
    # lazy: 2.8 ms
    import hashlib  # (the journal's modules are imported at the first crash, not at start-up)

    return hashlib.sha256(text.encode()).hexdigest()


@event
class JournalOpened(Event):
    event = "journal.opened"
    path: str


class Journal:
    """Appends records to a 0600 file (created at the first crash; never
    through a symbolic link, never a file another user owns or may write)."""

    def __init__(self, path: str, keep: int = KEEP):
        #: ``journal-{rank}.jsonl`` in a process that learns its rank only from
        #: the process group the program makes later (``mp.spawn``): named at
        #: the first record
        self._template = path if rank_unknown_yet(path) else None
        self.path = os.path.abspath(path)
        self.keep = keep
        self._fd: int | None = None
        self._lock = threading.Lock()
        # numbers by crash object, not id(): ids of handled crashes are reused
        self._ids: weakref.WeakKeyDictionary[Crash, int] = weakref.WeakKeyDictionary()
        self._next = 1

    def _write(self, record: dict) -> None:
        # lazy: 1.6 ms
        import json  # (the journal's modules are imported at the first crash, not at start-up)

        record.setdefault("time", time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        if _DISTRIBUTED:  # a rank of a distributed job: which one
            record.update(_DISTRIBUTED)
        line = (json.dumps(record, default=repr) + "\n").encode()
        with self._lock:
            if self._fd is None:
                if self._template is not None:
                    self.path = os.path.abspath(self._template.format_map(placeholders()))
                directory = os.path.dirname(self.path)
                if directory == default_directory():
                    os.makedirs(directory, mode=0o700, exist_ok=True)
                    check_private(directory, "journals", JournalError)
                self._fd = open_private(self.path, "the journal", JournalError)
                emit(JournalOpened(path=self.path))
                if directory == default_directory():
                    prune(directory, self.keep, current=self.path)
            os.write(self._fd, line)

    def crash_id(self, crash: Crash) -> int:
        with self._lock:
            if crash not in self._ids:
                self._ids[crash] = self._next
                self._next += 1
            return self._ids[crash]

    def crash(self, crash: Crash) -> None:
        self._write({"type": "crash", "crash": self.crash_id(crash), "pid": os.getpid(),
                     "key": crash_key(crash), "where": crash.where, "attempt": crash.attempt,
                     "message": exception_text(crash.exception, 2000)})

    def always(self, crash: Crash, decision: Decision, execs) -> None:
        """``always DECISION`` at this crash: a standing answer (``--replay``
        gives later crashes with the same key the same answer)."""
        self._write({"type": "always", "crash": self.crash_id(crash), "key": crash_key(crash),
                     "decision": decision.value,
                     "execs": [{"code": p.code, "frame": p.frame} for p in execs]})

    def patch(self, crash: Crash | None, patch: Patch, status: str = "applied",
              error: str | None = None, reload: Any = None) -> None:
        """A patch applied or refused; ``reload``: a reload's result (what
        it changed, and the sources replay applies again)."""
        record: dict[str, Any] = {"type": "patch", "status": status, "kind": patch.kind,
                                  "origin": patch.origin, "summary": patch.summary()}
        if crash is not None:
            record.update(crash=self.crash_id(crash), attempt=crash.attempt)
        if error:
            record["error"] = error
        if isinstance(patch, ReloadPatch) and patch.resume is not None:
            return  # a caller's part of a reload: replaying the reload does it again
        if isinstance(patch, (DecisionPatch, ExecPatch, ReloadPatch)) and patch.frame:
            record["frame"] = patch.frame
            try:  # which function that frame ran: replay checks it is the same one
                record["frame_function"] = crash.frame_at(patch.frame).f_code.co_qualname \
                    if crash is not None else None
            except Exception:
                record["frame_function"] = None
        if isinstance(patch, DecisionPatch):
            record["decision"] = patch.decision.value
        elif isinstance(patch, ExecPatch):
            record["code"] = patch.code
        elif isinstance(patch, ReplacePatch):
            record["target"] = getattr(patch.target, "__qualname__", repr(patch.target))
            record["new"] = getattr(patch.new, "__qualname__", repr(patch.new))
        elif isinstance(patch, ReloadPatch) and reload is not None:
            record["summary"] = reload.summary()
            record["diff"] = reload.diffs
            record["sources"] = reload.sources
            record["before"] = {path: _sha(_before(reload, path)) for path in reload.sources}
            record["changes"] = [str(c) for c in reload.changes]
        self._write(record)

    def repeat(self, number: int, count: int) -> None:
        """Crash ``number`` came back ``count`` more times, each handled the
        same way (not recorded again: ``_repeats``); replay re-applies its
        patches that many more times."""
        self._write({"type": "repeat", "crash": number, "count": count})

    def outcome(self, crash: Crash, action: str, reason: str = "") -> None:
        self._write({"type": "outcome", "crash": self.crash_id(crash), "action": action,
                     "reason": reason})


def _before(result, path: str) -> str:
    """The source a reload replaced (kept on the result by the reload)."""
    return getattr(result, "old_sources", {}).get(path, "")


_KEY_FIELDS = ("exc_type", "file", "function", "statement")


def _parse(path: str, n: int, line: str, last: bool) -> dict | None:
    """One record, checked; None for a truncated last line (a job killed while
    writing it), ``JournalError`` for anything else that is not a record."""
    import json  # lazy: 1.6 ms

    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        if last:
            warnings.warn(f"daifu: {path}:{n}: an incomplete record (the job was killed "
                          "while writing it?); ignored", DaifuWarning, stacklevel=3)
            return None
        raise JournalError(f"{path}:{n}: not a daifu journal record (not JSON)") from None
    kind = record.get("type") if isinstance(record, dict) else None
    if kind not in ("crash", "patch", "outcome", "repeat", "always"):
        raise JournalError(f"{path}:{n}: not a daifu journal record (a JSON object with "
                           "\"type\": crash, patch, outcome, repeat or always)")
    if kind == "always" and not (
            isinstance(record.get("key"), dict)
            and record.get("decision") in {d.value for d in Decision}
            and isinstance(record.get("execs"), list)
            and all(isinstance(e, dict) and isinstance(e.get("code"), str)
                    for e in record["execs"])):
        raise JournalError(f"{path}:{n}: a malformed always record")
    if kind == "repeat" and not (isinstance(record.get("crash"), int)
                                 and isinstance(record.get("count"), int)):
        raise JournalError(f"{path}:{n}: a repeat record needs \"crash\" and \"count\" "
                           "(numbers)")
    if kind == "crash":
        key = record.get("key")
        if not isinstance(record.get("crash"), int) or not isinstance(key, dict) or not all(
                isinstance(key.get(k), str) for k in _KEY_FIELDS):
            raise JournalError(f"{path}:{n}: a crash record needs \"crash\" (a number) and "
                               f"\"key\" ({', '.join(_KEY_FIELDS)})")
    if kind == "patch":
        what = record.get("kind")
        ok = {"decision": lambda r: r.get("decision") in {d.value for d in Decision},
              "exec": lambda r: isinstance(r.get("code"), str),
              "reload": lambda r: isinstance(r.get("sources", {}), dict)
              and isinstance(r.get("before", {}), dict)}.get(what, lambda r: isinstance(what, str))
        if not ok(record):
            raise JournalError(f"{path}:{n}: a malformed {what!r} patch record")
    return record


@_record.record
class _Recorded:
    number: int
    key: dict[str, str]
    patches: list[dict] = _record.field(default_factory=list)
    used: bool = False
    #: how many more times the same crash came back, handled the same way
    repeats: int = 0


@event
class ReplaySkipped(Event):
    event = "replay.skipped"
    level = "warning"
    where: str
    reason: str


class Replay:
    """Patch source that re-applies a journal's patches to matching crashes."""

    def __init__(self, path: str):
        """Read a journal; ``JournalError`` (one line) if it is not one, or
        not safe to run code from (owned by another user, writable by others,
        a symbolic link)."""
        self.path = path
        self.crashes: list[_Recorded] = []
        #: the ``always`` records: answers for crashes past the recorded ones
        self.standing: list[dict] = []
        by_number: dict[int, _Recorded] = {}
        fd = open_private(path, "the journal to replay (--replay)", JournalError, os.O_RDONLY)
        with os.fdopen(fd, "rb") as fh:
            data = fh.read()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise JournalError(f"{path} is not a daifu journal (not UTF-8 text)") from None
        lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
        for n, line in lines:
            record = _parse(path, n, line, last=n == lines[-1][0])
            if record is None:
                continue
            if record["type"] == "crash":
                rec = _Recorded(record["crash"], record["key"])
                by_number[rec.number] = rec
                self.crashes.append(rec)
            elif record["type"] == "patch" and record.get("status") == "applied":
                owner = by_number.get(record.get("crash"))  # type: ignore[arg-type]
                if owner is not None:
                    owner.patches.append(record)
            elif record["type"] == "repeat":
                owner = by_number.get(record["crash"])
                if owner is not None:
                    owner.repeats += max(record["count"], 0)
            elif record["type"] == "always":
                self.standing.append(record)

    def offer(self, crash: Crash) -> bool:
        key = crash_key(crash)
        for rec in self.crashes:
            if rec.used or rec.key != key:
                continue
            if rec.repeats:
                rec.repeats -= 1
            else:
                rec.used = True
            for record in rec.patches:
                patch = self._patch(record, crash)
                if patch is not None:
                    crash.patches.put(patch)
            return True
        for record in reversed(self.standing):  # `always`: the latest for this key
            if record["key"] == key:
                for e in record["execs"]:
                    frame = e.get("frame", 0)
                    crash.patches.put(ExecPatch(e["code"], origin=f"replay {self.path}",
                                                frame=frame if isinstance(frame, int) else 0))
                crash.patches.put(DecisionPatch(Decision(record["decision"]),
                                                origin=f"replay {self.path} (always)"))
                return True
        for rec in self.crashes:
            near = {k: v for k, v in rec.key.items() if k != "statement"}
            if not rec.used and near == {k: v for k, v in key.items() if k != "statement"}:
                rec.used = True
                emit(ReplaySkipped(where=crash.where, reason=(
                    f"journal crash #{rec.number} was at statement {rec.key['statement']!r}, "
                    f"now {key['statement']!r}: the script changed; its patches are skipped")))
        return False

    def _patch(self, record: dict, crash: Crash) -> Patch | None:
        kind = record.get("kind")
        level = record.get("frame", 0)
        if not isinstance(level, int) or isinstance(level, bool) or level < 0:
            level = 0
        if level:
            try:
                running = crash.frame_at(level).f_code.co_qualname
            except Exception:
                running = None
            if running is None or running != record.get("frame_function"):
                emit(ReplaySkipped(where=crash.where, reason=(
                    f"the recorded {kind} was for caller frame {level} "
                    f"({record.get('frame_function')}), which is now "
                    f"{running or 'missing'}: skipped")))
                return None
        if kind == "decision":
            return DecisionPatch(Decision(record["decision"]), origin="replay", frame=level)
        if kind == "exec":
            return ExecPatch(record["code"], origin="replay", frame=level)
        if kind == "reload":
            sources, before = record.get("sources", {}), record.get("before", {})
            for path in sources:
                loaded = _registry.get(path)
                live = loaded.source if loaded is not None else None
                if live is None or _sha(live) != before.get(path):
                    emit(ReplaySkipped(where=crash.where, reason=(
                        f"the recorded reload of {path} was made against other source; "
                        "skipped")))
                    return None
            return ReloadPatch(origin="replay", sources=sources, frame=level)
        emit(ReplaySkipped(where=crash.where, reason=(
            f"{kind} patches are not replayed (write them as a rule with daifu.on)")))
        return None
