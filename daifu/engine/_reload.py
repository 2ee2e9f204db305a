"""Live source reload (the paper's *surgery*, done the way people edit code).

``reload()`` re-reads changed source files -- the vaccinated modules and the
main script, plus any module whose file changed since the job started --
compiles them all first (a syntax error changes nothing), then replaces the
code of changed functions and methods in place: every function object whose
code came from the file gets the new code, so module attributes, bound
methods, instances and closures see it from their next call.

If the *running* function -- the one whose statement crashed -- changed, its
frame cannot change code; a **continuation** is built instead: the new code
entered at the statement that corresponds to the failing one, with every
variable, closure cell and value-stack item (loop iterators, ``with`` exits)
carried over.  The crashed frame then returns whatever the continuation
returns.
"""

from __future__ import annotations

import difflib
import gc
import inspect
import linecache
import os
import sys
import time
import types
import warnings
from typing import TYPE_CHECKING, Any, cast

from .. import cells as _registry  # (the loaded-files registry: get, files, record)
from .._errors import PatchError
from .._record import field, record
from ..cells import (
    CodeInfo,
    ModuleSource,
    backend,
    cell_range,
    cells_of,
    code_infos,
    code_pairs,
    entry_role,
    map_statement,
    original_code,
    read_locals,
    rewrite_continuation,
    set_const,
    vaccinate_module,
)

if TYPE_CHECKING:
    from ._crash import Crash

PROCESS_START = time.time()
UNBOUND = type("Unbound", (), {"__repr__": lambda self: "<unbound>"})()
_SKIP_NAMES = ("<lambda>", "<listcomp>", "<setcomp>", "<dictcomp>", "<genexpr>", "<module>")


@record
class Change:
    qualname: str
    filename: str
    status: str  # changed, moved, added, removed, error
    detail: str = ""

    def __str__(self) -> str:
        where = os.path.basename(self.filename)
        text = f"{self.status:8s} {where}: {self.qualname}()"
        return text + (f" -- {self.detail}" if self.detail else "")


@record
class ReloadResult:
    changes: list[Change] = field(default_factory=list)
    diffs: dict[str, str] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    old_sources: dict[str, str] = field(default_factory=dict)
    continuation: tuple[Any, tuple] | None = None
    running: Change | None = None
    #: a changed function running in a caller of the crashed frame, which
    #: continues in its new code: the engine hands the exception to that
    #: caller's barrier with this, and the continuation is built there
    caller: CallerResume | None = None
    #: the crashed function changed but cannot continue in its new code: the
    #: level of the caller whose statement -- the call -- is retried instead
    retry_caller: int | None = None

    def summary(self) -> str:
        if not self.changes:
            return "reload: no function changed"
        return "reload:\n" + "\n".join(f"  {c}" for c in self.changes)


@record
class CallerResume:
    """A caller's part of a reload: at ``level`` of the crashed stack, its
    changed function ``change`` continues in the new code of ``file``."""

    level: int
    file: _File
    change: Change
    line: int
    #: the function object running there (found before its code is swapped)
    function: types.FunctionType


@record
class _File:
    filename: str
    old: str | None  # None: not known (see _text_before_edit)
    new: str
    msrc: ModuleSource
    module_code: types.CodeType  # the new source's module code, unmodified
    #: qualname -> [(plain code, code to install)] in source order; the code
    #: to install is vaccinated where the module is
    defs: dict[str, list[tuple[types.CodeType, types.CodeType]]]
    children: dict[int, types.CodeType]  # id(plain code) -> vaccinated code
    loaded: Any  # cells.LoadedFile | None

    def find(self, qualname: str, firstlineno: int) -> tuple[types.CodeType, types.CodeType] | \
            str | None:
        """The new (plain, installable) code of the function ``qualname``
        that started at ``firstlineno`` in the running source; None if the
        source has no such function, a reason if it has several."""
        found = self.defs.get(qualname)
        if not found:
            return None
        if len(found) == 1:
            return found[0]
        same = [pair for pair in found if pair[0].co_firstlineno == firstlineno]
        if len(same) == 1:
            return same[0]
        return (f"{len(found)} definitions named {qualname} in the new source; "
                "not replaced (which one is the running one is ambiguous)")


def reload(crash: Crash | None, sources: dict[str, str] | None = None,
           focus: int = 0) -> ReloadResult:
    """Apply changed sources (``sources`` overrides what is read from disk,
    which is how journal replay re-applies a reload).  Raises ``PatchError``,
    changing nothing, if a file does not compile or the running function
    cannot be continued in its new code.

    Which running function continues in its new code: the innermost changed
    one from the frame in ``focus`` outward (else the innermost changed one).
    When that is a caller of the crashed frame, ``result.caller`` says so:
    the engine passes the exception up to it, and it re-executes its failing
    statement -- the call -- in the new code."""
    before = code_infos()  # (made from the texts that run now)
    files, result = _read_changes(sources or {})
    live, installs, changed, seen = _function_changes(files, crash, result)
    if crash is not None:
        _module_changes(crash, files, changed, result)
    known = {q for _, q, _ in seen} | {fn.__code__.co_qualname for fn in live}
    added = _added_functions(files, known)
    if crash is not None:
        _plan_running(crash, files, changed, result, focus)
    definitions = _running_definitions(crash, files, result) if crash is not None else []
    if not (installs or added or definitions) and result.running is None \
            and result.caller is None:
        # nothing to apply: a reload that changes nothing must not resume the
        # crash (a retry would fail the same way and burn the attempts)
        detail = "; ".join(str(c) for c in result.changes)
        raise PatchError(
            "reload: no function of the running program changed"
            + (f" ({detail})" if detail else
               " (edit the source of the failing code, save it, then reload)")
            + " -- nothing was changed")
    _install(files, installs, definitions, added, before, result)
    return result


def _read_changes(sources: dict[str, str]) -> tuple[dict[str, Any], ReloadResult]:
    """The changed files, and a result with their diffs; raises
    ``PatchError`` when none changed."""
    files = _changed_files(sources or {})
    result = ReloadResult()
    for f in files.values():
        result.sources[f.filename] = f.new
        if f.old is None:  # an unvaccinated module nobody read before it was edited
            result.diffs[f.filename] = "(the running text of this file is not known)\n"
            continue
        result.diffs[f.filename] = "".join(difflib.unified_diff(
            f.old.splitlines(True), f.new.splitlines(True), f.filename + " (running)",
            f.filename + " (new)"))
        result.old_sources[f.filename] = f.old
    if not files:
        raise PatchError("reload: no source file changed since it was loaded (edit the source "
                         "of the failing code, save it, then reload) -- nothing was changed")
    return files, result


def _function_changes(files: dict[str, Any], crash: Crash | None, result: ReloadResult):
    """The live functions of the changed files, which to give new code
    (``installs``), the running code that changed (``changed``), and the
    functions seen; each change is added to ``result``."""
    live = [o for o in gc.get_objects()
            if type(o) is types.FunctionType and o.__code__.co_filename in files
            and o.__code__.co_name not in _SKIP_NAMES]
    installs: list[tuple[types.FunctionType, types.CodeType]] = []
    seen: set[tuple[str, str, int]] = set()
    running_code = crash.frame.f_code if crash is not None else None
    changed: dict[int, Change] = {}  # id(running code) -> its change
    by_key: dict[tuple[str, str, int], Change] = {}
    for fn in live:
        f = files[fn.__code__.co_filename]
        qual = fn.__code__.co_qualname
        old_plain = original_code(fn.__code__)
        key = (f.filename, qual, old_plain.co_firstlineno)
        found = f.find(qual, old_plain.co_firstlineno)
        if not isinstance(found, tuple):
            if key not in seen:
                result.changes.append(Change(qual, f.filename, "removed" if found is None else
                                             "error", found or
                                             "no longer in the source; the old code stays"))
            seen.add(key)
            continue
        new_plain, new_live = found
        status = _compare(old_plain, new_plain)
        if status == "same":
            continue
        if fn.__code__.co_freevars != new_live.co_freevars:
            if key not in seen:
                result.changes.append(Change(qual, f.filename, "error",
                                             "its closure variables changed; not replaced"))
            seen.add(key)
            continue
        installs.append((fn, new_live))
        if key not in seen:
            seen.add(key)
            by_key[key] = Change(qual, f.filename, status)
            result.changes.append(by_key[key])
        if status == "changed":
            changed.setdefault(id(fn.__code__), by_key[key])
            if fn.__code__ is running_code:
                result.running = by_key[key]
    return live, installs, changed, seen


def _module_changes(crash: Crash, files: dict[str, Any], changed: dict[int, Change],
                    result: ReloadResult) -> None:
    """Module-level code on the crashed stack whose own statements changed."""
    running_code = crash.frame.f_code
    # module-level code on the crashed stack (the script's top level, a
    # module importing another): its own statements changed if its code
    # differs beyond its functions -- the crashed frame's, or a caller's
    # that a focus (``up``) may continue in the new code
    for frame in crash.frames():
        code = frame.f_code
        edited = files.get(code.co_filename)
        if code.co_name != "<module>" or edited is None or id(code) in changed \
                or _compare(original_code(code), edited.module_code, deep=False) != "changed":
            continue
        change = Change("<module>", edited.filename, "changed")
        result.changes.append(change)
        if code is running_code:
            result.running = change
        else:
            changed[id(code)] = change


def _plan_running(crash: Crash, files: dict[str, Any], changed: dict[int, Change],
                  result: ReloadResult, focus: int) -> None:
    """Which running call continues in its new code: the crashed one (its
    continuation), a caller (``result.caller``), or -- where the crashed one
    cannot -- its call made again from a vaccinated caller (``retry_caller``)."""
    result.caller = _caller_to_continue(crash, files, changed, result.running, focus)
    if result.caller is not None:
        result.running = None  # (its new code is installed for later calls)
    if result.running is not None:
        try:
            fn_, args, line = _continuation(crash, files[crash.filename], result.running)
        except PatchError as exc:
            # the new code is installed for later calls, and the running call
            # is made again from its caller -- when there is one to make it
            up = crash.vaccinated_caller(0) if crash.frame.f_code.co_name != "<module>" else None
            if up is None:
                raise
            from .human._report import redraws  # lazy: 16.4 ms

            why = str(exc).removeprefix("reload: ").removesuffix(" (nothing was changed)")
            result.retry_caller = up
            result.running.detail = "; ".join([
                f"running: {why}; its call is re-executed from caller frame {up} "
                f"({crash.frame_at(up).f_code.co_qualname}), in the new code",
                *redraws(crash, up)])
        else:
            result.running.detail = f"running: continues in the new code at line {line}"
            result.continuation = (fn_, args)


def _install(files: dict[str, Any], installs: list, definitions: list, added: list,
             before: list, result: ReloadResult) -> None:
    """Everything checked: give the functions their new code."""
    for fn, code in installs:
        fn.__code__ = code
    for running, index, code, change, who in definitions:
        if not set_const(running, index, code):
            change.detail = (f"{who} keeps making the old function (its code object could not "
                             "be changed in place)")
    for change, install in added:
        install()
        result.changes.append(change)
    for info in before:  # code that goes on running remembers its text (the report shows it)
        changed_file = files.get(info.filename)
        if changed_file is not None and changed_file.old is not None and info.source is None:
            info.source = changed_file.old
    for f in files.values():
        if f.loaded is not None:
            _registry.record(f.filename, f.loaded.module, f.loaded.selection, f.msrc.source, f.msrc)
        linecache.cache[f.filename] = (len(f.new), None, f.new.splitlines(True), f.filename)


def _text_before_edit(path: str) -> str | None:
    """What linecache read of a file before it was edited, or None.  (Not
    ``linecache.getlines``: for a file nobody read yet, that reads the edited
    file and the edit would look like no change.)"""
    entry = linecache.cache.get(path)
    if entry is None or len(entry) != 4:
        return None
    size, mtime, lines, _ = entry
    try:
        st = os.stat(path)
    except OSError:
        return None
    if mtime is None or (st.st_size, st.st_mtime) == (size, mtime):
        return None  # read after the edit (or not from a file): not the running text
    return "".join(lines)


def _changed_files(overrides: dict[str, str]) -> dict[str, _File]:
    candidates: dict[str, Any] = {f.filename: f for f in _registry.files()}
    for mod in list(sys.modules.values()):
        path = getattr(mod, "__file__", None)
        if path and path.endswith(".py") and path not in candidates:
            try:
                # file systems with whole-second (or 2 s) times: a file edited in
                # the second the process started must count; a false candidate
                # only costs a compile (its functions compare "same")
                if os.stat(path).st_mtime >= PROCESS_START - 2:
                    candidates[path] = None
            except OSError:
                continue
    for path in overrides:
        candidates.setdefault(path, _registry.get(path))
    out: dict[str, _File] = {}
    for path, loaded in candidates.items():
        if path in overrides:
            new = overrides[path]
        else:
            try:
                with open(path, encoding="utf-8") as fh:
                    new = fh.read()
            except OSError:
                continue
            except UnicodeDecodeError as exc:
                if loaded is None:
                    continue  # not daifu's: an unreadable file is not a candidate
                raise PatchError(f"reload: {path} is not UTF-8 text ({exc.reason} at byte "
                                 f"{exc.start}) -- nothing was changed") from None
        old = loaded.source if loaded is not None else _text_before_edit(path)
        if new == old:
            continue
        try:
            msrc = ModuleSource(new, path)
            plain_module = compile(msrc.tree, path, "exec", dont_inherit=True)
        except SyntaxError as exc:
            raise PatchError(
                f"reload: {path}:{exc.lineno}: {exc.msg} -- nothing was changed") from None
        except ValueError as exc:  # (source code string cannot contain null bytes)
            raise PatchError(f"reload: {path}: {exc} -- nothing was changed") from None
        if loaded is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                live_module, _ = vaccinate_module(plain_module, msrc, loaded.selection,
                                                  loaded.module, record=False, strict=False)
        else:
            live_module = plain_module
        defs: dict[str, list[tuple[types.CodeType, types.CodeType]]] = {}
        children: dict[int, types.CodeType] = {}
        for p, v in code_pairs(plain_module, live_module):
            children[id(p)] = v
            if p.co_name not in _SKIP_NAMES:
                defs.setdefault(p.co_qualname, []).append((p, v))
        out[path] = _File(path, old, new, msrc, plain_module, defs, children, loaded)
    return out


def _fingerprint(code: types.CodeType, deep: bool = True) -> tuple:
    """What a code object does (not where its lines are).  ``deep=False``:
    nested code objects count by name only (module code whose functions
    changed but whose own statements did not)."""
    # (a nested function of running code is vaccinated: its original is compared,
    # or a class whose body holds vaccinated methods would always have changed)
    consts = tuple((_fingerprint(original_code(c)) if deep else ("code", c.co_qualname))
                   if isinstance(c, types.CodeType) else (type(c).__name__, repr(c))
                   for c in code.co_consts)
    return (code.co_code, code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars,
            code.co_exceptiontable, code.co_flags, code.co_argcount, code.co_kwonlyargcount,
            consts)


def _compare(old: types.CodeType, new: types.CodeType, deep: bool = True) -> str:
    if _fingerprint(old, deep) != _fingerprint(new, deep):
        return "changed"
    if old.co_firstlineno != new.co_firstlineno or old.co_linetable != new.co_linetable:
        return "moved"
    return "same"


def _added_functions(files: dict[str, _File], known: set[str]):
    """Module-level functions and methods of module-level classes that are new."""
    import ast  # lazy: 1.3 ms

    out = []
    for f in files.values():
        module = sys.modules.get(f.loaded.module) if f.loaded and f.loaded.module else None
        namespace = getattr(module, "__dict__", None)
        if namespace is None:
            continue
        for (qual, _first), node in f.msrc.scopes().items():
            if qual in known or not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            owner_name, _, name = qual.rpartition(".")
            if "<locals>" in qual or len(f.defs.get(qual, ())) != 1:
                continue
            owner = namespace if not owner_name else getattr(namespace.get(owner_name), "__dict__",
                                                             None)
            if owner is None:
                continue
            code = f.defs[qual][0][1]
            defaults = tuple(eval(compile(ast.Expression(d), f.filename, "eval"), namespace)
                             for d in node.args.defaults) or None

            def install(code=code, name=name, owner_name=owner_name, defaults=defaults,
                        namespace=namespace):
                fn = types.FunctionType(code, namespace, name, defaults)
                fn.__qualname__ = code.co_qualname
                if owner_name:
                    setattr(namespace[owner_name], name, fn)
                else:
                    namespace[name] = fn

            out.append((Change(qual, f.filename, "added"), install))
    return out


def _running_definitions(crash: Crash, files: dict[str, _File], result: ReloadResult
                         ) -> list[tuple[types.CodeType, int, types.CodeType, Change, str]]:
    """The ``def`` statements of code that keeps running on the crashed stack
    -- module-level code, callers that do not continue in their new code, a
    crashed frame that is retried in its old code -- whose functions changed:
    ``(running code, constant index, new code, change, who runs it)`` for each.  Pointing
    those constants at the new code (``cells.set_const``) makes a ``def`` in
    a running loop make the new function from its next iteration on."""
    out = []
    seen: set[int] = set()
    continuing = {0} if result.continuation is not None else set()
    if result.caller is not None:
        continuing.add(result.caller.level)
    for level, frame in enumerate(crash.frames()):
        code = frame.f_code
        f = files.get(code.co_filename)
        if f is None or level in continuing or id(code) in seen or cells_of(code) is None:
            continue
        seen.add(id(code))
        for index, const in enumerate(code.co_consts):
            if not isinstance(const, types.CodeType) or const.co_name in _SKIP_NAMES:
                continue
            old_plain = original_code(const)
            found = f.find(const.co_qualname, old_plain.co_firstlineno)
            if not isinstance(found, tuple):
                continue
            status = _compare(old_plain, found[0])
            if status == "same":
                continue
            where = "the crashed frame" if level == 0 else f"caller frame {level}"
            who = ("module code" if code.co_name == "<module>" else
                   f"{code.co_qualname}()") + f" in {where}"
            change = Change(const.co_qualname, f.filename, status)
            result.changes.append(change)
            if const.co_freevars != found[1].co_freevars:
                change.status = "error"
                change.detail = f"{who} keeps making the old function: its closure variables " \
                    "changed"
                continue
            change.detail = (f"{who} keeps its own code: the def at line "
                             f"{old_plain.co_firstlineno} makes the new function from now on")
            out.append((code, index, found[1], change, who))
    return out


# -- continuing the running function ---------------------------------------------------


def _caller_to_continue(crash: Crash, files: dict[str, _File], changed: dict[int, Change],
                        running: Change | None, focus: int) -> CallerResume | None:
    """The caller of the crashed frame that continues in its new code, or
    None (the crashed frame does, or no running function changed).  Raises
    ``PatchError`` when the frame in focus changed but cannot be continued."""
    frames = crash.frames()
    levels = [level for level, frame in enumerate(frames)
              if id(frame.f_code) in changed and frame.f_code.co_filename in files]
    if running is not None and 0 not in levels:
        levels.insert(0, 0)  # (module-level code: its own statements changed)
    chosen = next((level for level in levels if level >= focus), levels[0] if levels else None)
    if not chosen:
        return None
    frame = frames[chosen]
    change = changed[id(frame.f_code)]
    why = _why_not_continued(frame, files[frame.f_code.co_filename])
    back, _ = backend()
    func = back.running_function(frame) if back is not None else None
    if func is None and not isinstance(why, str):
        why = "its function object could not be found"
    if isinstance(why, str):
        if chosen == focus:  # asked for by name (``up``, then reload): say why not
            raise PatchError(f"reload: {frame.f_code.co_qualname}() in caller frame {chosen} "
                             f"cannot continue in its new code: {why} -- nothing was changed")
        change.detail = f"running in caller frame {chosen}: keeps its old code ({why})"
        return None
    change.detail = (f"running in caller frame {chosen}: re-executes its call at line "
                     f"{frame.f_lineno} in the new code (line {why})")
    assert func is not None
    return CallerResume(chosen, files[frame.f_code.co_filename], change, why, func)


def _why_not_continued(frame: types.FrameType, f: _File) -> int | str:
    """The line where a caller's failing statement -- the call -- is in the
    new source, or why that caller cannot continue in its new code."""

    info = cells_of(frame.f_code)
    if info is None:
        return "it is not vaccinated"
    if frame.f_code.co_flags & (inspect.CO_GENERATOR | inspect.CO_COROUTINE
                                | inspect.CO_ITERABLE_COROUTINE | inspect.CO_ASYNC_GENERATOR):
        return "it is a generator or coroutine"
    found = cell_range(info, frame.f_code, frame.f_lasti)
    if found is None or not (found[2].can_retry or found[2].role == "loop-header"):
        return "its call is not in a statement daifu can re-execute"
    try:
        _, _, stmt, _ = _map_statement(frame.f_code, found[2], f)
    except PatchError as exc:
        return str(exc).removeprefix("reload: ")
    return getattr(stmt, "lineno", 0)


def _map_statement(code: types.CodeType, cell, f: _File):
    """(new plain code, its scope, the statement ``cell``'s maps to, its
    role) in the new source of ``code``'s function.  Raises ``PatchError``."""
    if f.loaded is None:
        raise PatchError("reload: the running function's file was not vaccinated")
    old_plain = original_code(code)
    old_msrc = f.loaded.msrc
    old_scope = old_msrc.scope_for(old_plain)
    if code.co_name == "<module>":
        new_plain = f.module_code
    else:
        found = f.find(code.co_qualname, old_plain.co_firstlineno)
        if not isinstance(found, tuple):
            raise PatchError(f"reload: {found or 'the running function is gone'}")
        new_plain = found[0]
    new_scope = f.msrc.scope_for(new_plain)
    if old_scope is None or new_scope is None:
        raise PatchError("reload: the running function's source could not be found")
    old_stmt = old_msrc.statements(old_scope).lookup(
        (cell.lineno, cell.end_lineno, cell.col, cell.end_col))
    if old_stmt is None:
        raise PatchError("reload: the failing statement could not be located in the old source")
    new_stmt = map_statement(old_msrc, old_scope, old_stmt, f.msrc, new_scope)
    if isinstance(new_stmt, str):
        raise PatchError(f"reload: cannot continue {code.co_qualname}() in the new code: "
                         f"{new_stmt} (nothing was changed)")
    # the same kind of statement: the same cell of it (a loop's header, a
    # with's exit); another kind (a new if or try around the failing
    # statement, an edit): the cell the new statement starts with
    role = cell.role if type(new_stmt) is type(old_stmt) else entry_role(new_stmt)
    return new_plain, new_scope, new_stmt, role


def _continuation(crash: Crash, f: _File, change: Change,
                  func: types.FunctionType | None = None) -> tuple[Any, tuple, int]:
    back, reason = backend()
    if back is None:
        raise PatchError(f"reload: {reason}")
    new_plain, new_scope, new_stmt, role = _map_statement(crash.frame.f_code, crash.cell, f)
    fn, args = continue_in(crash, new_plain, f.msrc, new_scope, dict(f.children), new_stmt,
                           role, tuple(crash.stack), f.loaded.module, "reload: ", func)
    return fn, args, getattr(new_stmt, "lineno", 0)


def resume_caller(crash: Crash, resume: CallerResume) -> ReloadResult:
    """At the barrier of the caller a reload chose (``CallerResume``): the
    continuation of its call in the new code, already installed."""
    func = cast(types.FunctionType, resume.function)  # (mypy binds a function-typed field)
    fn, args, _ = _continuation(crash, resume.file, resume.change, func)
    return ReloadResult(changes=[resume.change], continuation=(fn, args), running=resume.change)


def continue_in(crash: Crash, plain: types.CodeType, msrc: ModuleSource, scope, children: dict,
                stmt, role: str, stack: tuple, module: str | None,
                prefix: str = "", func: types.FunctionType | None = None) -> tuple[Any, tuple]:
    """``(function, args)`` that continue the crashed call in ``plain``
    (vaccinated) at ``stmt``'s cell of ``role``, with the frame's variables
    and ``stack`` (the crashed frame's value stack, or a changed copy):
    the barrier's continuation answer.  Raises ``PatchError``."""
    back, reason = backend()
    if back is None:
        raise PatchError(f"{prefix}{reason}")
    frame = crash.frame
    code = frame.f_code
    if code.co_flags & (inspect.CO_GENERATOR | inspect.CO_COROUTINE
                        | inspect.CO_ITERABLE_COROUTINE | inspect.CO_ASYNC_GENERATOR):
        raise PatchError(f"{prefix}the crashed function is a generator or coroutine; its "
                         "running call cannot be continued in other code (nothing was changed)")
    cell = crash.cell
    spec = back.Continuation(stmt=stmt, role=role, nstack=cell.depth, unbound=UNBOUND)
    info = CodeInfo(plain.co_qualname, plain.co_filename, plain.co_firstlineno,
                    module, original=plain)
    try:
        cont = rewrite_continuation(plain, info, msrc, scope, children, spec)
    except back.Unsupported as exc:
        raise PatchError(f"{prefix}cannot continue {code.co_qualname}() in the new code: {exc} "
                         "(nothing was changed)") from None
    if len(stack) != cell.depth:
        raise PatchError(f"{prefix}the crashed frame's stack could not be captured")
    if not code.co_flags & inspect.CO_OPTIMIZED:  # module-level code: variables are globals
        g = frame.f_globals
        g.update(spec.module_globals(stack))
        return exec, (cont, g)
    func = func or back.running_function(frame)
    if func is None:
        raise PatchError(f"{prefix}the running function object could not be found")
    if func.__code__.co_freevars != cont.co_freevars:
        raise PatchError(f"{prefix}the running function's closure variables changed")
    args = spec.arguments(read_locals(frame), stack)
    fn = types.FunctionType(cont, frame.f_globals, func.__name__, None, func.__closure__)
    fn.__qualname__ = func.__qualname__
    return fn, args


def resume_with_stack(crash: Crash, stack: tuple) -> tuple[Any, tuple]:
    """``(function, args)`` that resume the crashed call at its failing
    statement in its *own* code, with a changed value stack (a loop header
    whose iterator is swapped for another).  Raises ``PatchError``."""
    frame = crash.frame
    plain = original_code(frame.f_code)
    loaded = _registry.get(plain.co_filename)
    if loaded is None:
        raise PatchError("the crashed function's file was not vaccinated")
    msrc = loaded.msrc
    scope = msrc.scope_for(plain)
    if scope is None:
        raise PatchError("the crashed function's source could not be found")
    cell = crash.cell
    stmt = msrc.statements(scope).lookup((cell.lineno, cell.end_lineno, cell.col, cell.end_col))
    if stmt is None:
        raise PatchError("the failing statement could not be located in the source")
    children = {id(p): v for p, v in code_pairs(plain, frame.f_code)}
    return continue_in(crash, plain, msrc, scope, children, stmt, cell.role, stack,
                       loaded.module)
