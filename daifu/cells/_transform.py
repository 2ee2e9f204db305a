"""Vaccinate code objects: choose which functions, rewrite them, report.

This is the version-neutral driver; the bytecode work is done by the
per-version module ``_dispatch.backend()`` returns.  Anything that cannot be
rewritten is reported (warning + structured event) and left unmodified, unless
``strict`` turns that into a ``TransformError``.
"""

from __future__ import annotations

import builtins
import contextlib
import gc
import io
import os
import re
import sys
import threading
import types
import warnings
from collections.abc import Callable, Iterator
from fnmatch import fnmatchcase
from importlib.machinery import SourceFileLoader
from importlib.util import decode_source

from .._errors import NotVaccinatedWarning, TransformError, UnsupportedPythonWarning
from .._private import open_private
from .._record import field, record, replace
from .._runtime import RUNTIME
from . import _lazy, _registry
from ._backend import Backend
from ._cell import P_SYS, PASSING, CodeInfo, is_vaccinated
from ._dispatch import backend

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)

if TYPE_CHECKING:
    import ast

    from ._cache import CodeCache
    from ._source import ModuleSource


@record(frozen=True)
class Selection:
    """Which code objects of a module to vaccinate.

    ``entries`` are ``qualname`` globs (``Trainer.fit``, ``train*``) or
    ``module:qualname`` globs; ``*`` means every function whose own body
    contains a loop, ``**`` every function.  ``module_level`` vaccinates the module's top-level code
    (the default for the script run by ``python -m daifu``).  Functions
    decorated with ``@daifu.vaccinate`` are always selected.

    ``lazy``: every other function defined at a module's top level or in a
    class body is vaccinated too: when it is first called (``_lazy``), or at
    import with ``eager`` (the runner's default: every function runs in its
    own frame, from its first call on).  What ``lazy`` leaves out (nested
    functions, generators) keeps the ``entries`` rule.
    """

    entries: tuple[str, ...] = ("*",)
    module_level: bool = False
    lazy: bool = False
    eager: bool = False
    #: arm what is vaccinated at import (``_armed``: rewritten in full at its
    #: first exception), unless ``--strict`` or ``--dump`` asks for it now
    armed: bool = False

    def wants(self, code: types.CodeType, scope: ast.AST, module: str | None) -> bool:
        import ast  # lazy: 1.3 ms

        from ._source import has_loop, is_marked  # lazy: 17.3 ms

        if isinstance(scope, ast.Module):
            return self.module_level or "<module>" in self.entries
        if isinstance(scope, ast.ClassDef):
            return False
        if is_marked(scope):
            return True
        qual = code.co_qualname
        for pattern in self.entries:
            mod_pat, _, qual_pat = pattern.rpartition(":")
            if mod_pat and not (module and fnmatchcase(module, mod_pat)):
                continue
            if qual_pat == "**":
                return True
            if qual_pat == "*":
                if has_loop(scope):
                    return True
            elif fnmatchcase(qual, qual_pat):
                RUNTIME.matched_entries.add(pattern)
                return True
        return False

    @property
    def wildcards_only(self) -> bool:
        """Do ``entries`` name no function (``*``, ``**``, ``<module>``)?"""
        return all(p.rpartition(":")[2] in ("*", "**", "<module>") for p in self.entries)

    def names(self, code: types.CodeType, scope: ast.AST, module: str | None) -> bool:
        """Is the function marked, or named by a pattern that is no wildcard?"""
        from ._source import is_marked  # lazy: 17.3 ms

        if is_marked(scope):
            return True
        for pattern in self.entries:
            mod_pat, _, qual_pat = pattern.rpartition(":")
            if mod_pat and not (module and fnmatchcase(module, mod_pat)):
                continue
            if qual_pat not in ("*", "**") and fnmatchcase(code.co_qualname, qual_pat):
                return True
        return False

    def unmatched(self) -> list[str]:
        """The name patterns of ``entries`` that no function matched so far."""
        return [p for p in self.entries
                if p.rpartition(":")[2] not in ("*", "**", "<module>")
                and p not in RUNTIME.matched_entries]


@record
class Report:
    """What happened to one module (or function)."""

    filename: str
    module: str | None = None
    vaccinated: list[CodeInfo] = field(default_factory=list)
    #: qualnames of the functions given a first-call stub (``Selection.lazy``)
    lazy: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (qualname, reason)
    skipped_lines: list[int | None] = field(default_factory=list)  # first line of each
    quiet: list[str] = field(default_factory=list)  # skipped without a warning (qualnames)
    dumps: list[str] = field(default_factory=list)
    #: True when the code came from the on-disk cache (``_cache``)
    cached: bool = False


class _Options:
    strict = False
    dump: str | None = None  # "-" for stderr, or a file path
    cache = None  # a _cache.CodeCache, or None: no cache

    def reset(self) -> None:
        self.configure(strict=False, dump=None, cache=None)

    def configure(self, strict: bool, dump: str | None, cache: CodeCache | None) -> None:
        """The transform's settings, all at once (the runner's ``Config.apply``)."""
        self.strict, self.dump, self.cache = strict, dump, cache


options = _Options()
RUNTIME.on_reset(options.reset)


def use_barrier(barrier: Callable, quick: Callable, passing: list, upgrade: Callable) -> None:
    """The function the stubs call at an exception and the quick check they
    call before it (``engine._barrier.entry()``), and the list they read
    before they call either (``engine._fastpath.passing``), which they reach
    as the builtin ``PASSING``; what an armed function's traps call
    (``engine._barrier.upgraded``): the engine calls this when it is
    imported.  The cells package never imports the engine: ``daifu``
    imports the engine before anything can vaccinate code."""
    # (the method-wrappers, made once: a profiler sees no call of them)
    wrappers = [fn.__call__ for fn in (sys.getprofile, sys.gettrace)]  # type: ignore[operator]
    del passing[P_SYS:]
    passing += [sys, barrier, *wrappers, upgrade, quick.__call__]  # type: ignore[operator]
    setattr(builtins, PASSING, passing)


def _not_vaccinated(report: Report, qualname: str, reason: str, line: int | None,
                    record: bool = True, warn: bool = True, strict: bool | None = None
                    ) -> None:
    if record:
        report.skipped.append((qualname, reason))
        report.skipped_lines.append(line)
        if not warn:
            report.quiet.append(qualname)
    where = f"{report.filename}:{line}" if line else report.filename
    message = f"daifu: {qualname} ({where}) is not vaccinated and runs unmodified: {reason}"
    if options.strict if strict is None else strict:
        raise TransformError(message, qualname=qualname, filename=report.filename, reason=reason)
    if warn:
        warnings.warn(message, NotVaccinatedWarning, stacklevel=4)


def _check_version(report: Report, strict: bool | None = None) -> Backend | None:
    module, reason = backend()
    if module is None:
        report.skipped.append(("*", reason or "unsupported Python"))
        report.skipped_lines.append(None)
        if options.strict if strict is None else strict:
            raise TransformError(reason or "unsupported Python", filename=report.filename,
                                 reason=reason or "")
        if not RUNTIME.warned_version:
            RUNTIME.warned_version = True
            warnings.warn(f"daifu: {reason}", UnsupportedPythonWarning, stacklevel=4)
    return module


def _dump(report: Report, code: types.CodeType) -> None:
    buf = io.StringIO()
    print(f"=== daifu: vaccinated {code.co_qualname} ({code.co_filename}) ===", file=buf)
    import dis  # lazy: 1.9 ms

    dis.dis(code, file=buf, depth=0)
    text = buf.getvalue()
    report.dumps.append(text)
    if options.dump in ("-", "1", "stderr"):
        sys.stderr.write(text)
    elif options.dump:
        try:  # (0600, never through a symbolic link, like the log)
            fd = open_private(options.dump, "the dump (--dump)", OSError, sink=True)
            try:
                os.write(fd, text.encode("utf-8"))
            finally:
                os.close(fd)
        except OSError as exc:  # (checked at start-up; the rewrite itself goes on)
            warnings.warn(f"daifu: cannot write the dump to {options.dump}: {exc}",
                          NotVaccinatedWarning, stacklevel=3)


def vaccinate_module(
    code: types.CodeType,
    msrc: ModuleSource,
    selection: Selection,
    module: str | None = None,
    record: bool = True,
    strict: bool | None = None,
) -> tuple[types.CodeType, Report]:
    """Vaccinate the selected code objects inside a module's code object.
    ``record``: the module's source becomes the one its file is known to run
    (False: a reload's candidate, recorded only if the reload is applied).
    ``strict``: a function that cannot be vaccinated raises ``TransformError``
    (None: as ``--strict`` says)."""
    if strict is None:
        strict = options.strict
    report = Report(msrc.filename, module)
    back = _check_version(report, strict)
    if back is None:
        return code, report
    # strict mode must report every function that cannot be vaccinated at
    # import, and a dump shows the rewrite: both rewrite the stubs' functions now
    now = selection.eager or strict or bool(options.dump)
    arm = selection.armed and record and not (strict or options.dump)
    stubs: list[_lazy.Pending] = []

    def walk(co: types.CodeType, parent: ast.AST | None) -> types.CodeType:
        scope = msrc.scope_for(co)
        children: dict[int, types.CodeType] = {}
        for const in co.co_consts:
            if isinstance(const, types.CodeType):
                new_child = walk(const, scope)
                if new_child is not const:
                    children[id(const)] = new_child
        stub = selection.lazy and scope is not None and _lazy.stubbable(co, scope, parent)
        # (``wants`` asked only where its answer counts, or where a pattern
        # that names functions must learn that it matched one)
        if scope is not None and (stub and now and selection.wildcards_only
                                  or selection.wants(co, scope, module) or (stub and now)):
            info = CodeInfo(co.co_qualname, co.co_filename, co.co_firstlineno, module, original=co)
            try:
                new = _rewrite_or_arm(back, arm, co, info, msrc, scope, children)
            except back.NothingToProtect:
                pass  # no statement of its own (``def f(): pass``): nothing can fail
            except back.Unsupported as exc:
                # (an async function a wildcard selected: in the report -- the
                # module.vaccinated event, --explain -- but no warning into the
                # program's own warnings, where -W error would fail its import)
                _not_vaccinated(report, co.co_qualname, str(exc), co.co_firstlineno,
                                warn=getattr(exc, "kind", "") != "async"
                                or selection.names(co, scope, module), strict=strict)
            else:
                report.vaccinated.append(info)
                if options.dump:
                    _dump(report, new)
                return new
        elif stub:
            pairs = tuple((c, children[id(c)]) for c in co.co_consts if id(c) in children)
            pending = _lazy.Pending(co, module, pairs)
            stubs.append(pending)
            report.lazy.append(co.co_qualname)
            return _lazy.make_stub(co, pending)
        if children:
            return co.replace(co_consts=tuple(children.get(id(c), c) for c in co.co_consts))
        return co

    new_code = walk(code, None)
    walk = None  # type: ignore[assignment]  # (its own cell held it, and it the source: a cycle)
    _register(msrc.filename)
    # armed code needs the parsed source again only at a crash: parsed again
    # then, as for code from the cache (a tree is ~4 KB a statement, kept
    # for every module a library imports)
    kept = None if arm else msrc
    loaded = _registry.record(msrc.filename, module, selection, msrc.source, kept) if record \
        else _registry.LoadedFile(msrc.filename, module, selection, msrc.source, msrc)
    for pending in stubs:
        pending.source = loaded
    return new_code, report


def _rewrite_or_arm(back: Backend, arm: bool, co: types.CodeType, info: CodeInfo,
                    msrc: ModuleSource, scope: ast.AST, children: dict) -> types.CodeType:
    """``co`` armed (``_armed``) or, where it cannot be (a generator), rewritten."""
    if arm:
        try:
            return back.arm(co, info, msrc, scope, children)
        except back.NothingToProtect:
            raise
        except back.Unsupported:
            info.armed = False  # (the rewrite says why, if it cannot be done either)
    return back.rewrite(co, info, msrc, scope, children)


def rewrite_pending(pending: _lazy.Pending) -> types.CodeType | None:
    """The vaccinated code of a function with a first-call stub, at its first
    call (``_lazy``); None (after the warning) if it cannot be vaccinated."""
    original = pending.original
    report = Report(original.co_filename, pending.module)
    back = _check_version(report)
    if back is None:
        return None
    loaded = pending.source if pending.source is not None else \
        _registry.get(original.co_filename)
    msrc = loaded.msrc if loaded is not None else None
    scope = msrc.scope_for(original) if msrc is not None else None
    if scope is None:
        _not_vaccinated(report, original.co_qualname, "its source code is not available",
                        original.co_firstlineno)
        return None
    assert msrc is not None
    info = CodeInfo(original.co_qualname, original.co_filename, original.co_firstlineno,
                    pending.module, original=original)
    children = {id(p): n for p, n in pending.children}
    try:
        new = back.rewrite(original, info, msrc, scope, children)
    except back.NothingToProtect:
        return None
    except back.Unsupported as exc:
        named = loaded is not None and loaded.selection.names(original, scope, pending.module)
        _not_vaccinated(report, original.co_qualname, str(exc), original.co_firstlineno,
                        warn=getattr(exc, "kind", "") != "async" or named)
        return None
    if options.dump:
        _dump(report, new)
    return new


_lazy.use_rewrite(rewrite_pending)


def vaccinate_source(
    source: str | bytes,
    filename: str,
    selection: Selection,
    module: str | None = None,
) -> tuple[types.CodeType, Report]:
    """Compile ``source`` and vaccinate it (what the import hook and runner do).

    With ``options.cache`` set, a module vaccinated the same way before is
    loaded from the cache instead of rewritten (see ``_cache``).

    A source that does not compile raises the ``SyntaxError`` Python itself
    raises for it (same message for a bad encoding as ``python file.py``)."""
    original = source
    failure: BaseException | None = None
    if isinstance(source, bytes):
        try:
            source = _decode(source)
        except (SyntaxError, UnicodeDecodeError) as exc:
            failure = exc
    if failure is not None or not isinstance(source, str):  # (raised outside the handler:
        raise python_syntax_error(original, filename) from None  # no "during handling")
    cache = options.cache if not options.dump else None
    if cache is not None:
        hit = cache.load(source, filename, module, selection)
        if hit is not None:
            code, report = hit
            report.cached = True
            for (qualname, reason), line in zip(report.skipped, report.skipped_lines):
                # the same warnings (or strict error) as when it was rewritten
                _not_vaccinated(report, qualname, reason, line, record=False,
                                warn=qualname not in report.quiet)
            _register(filename)
            loaded = _registry.record(filename, module, selection, source)
            if report.lazy:
                _lazy.attach(code, loaded)
            return code, report
    # (a miss: the cache path needs neither ast nor _source)
    from ._source import ModuleSource  # lazy: 17.3 ms

    with _collector_paused():
        try:
            code, tree = _compiled(source, filename)
        except (SyntaxError, ValueError) as exc:
            failure = exc
        if failure is not None:
            raise python_syntax_error(original, filename) from None
        msrc = ModuleSource(source, filename, tree)
        new_code, report = vaccinate_module(code, msrc, selection, module)
        if cache is not None:  # (nothing to protect, too: the next start parses nothing)
            cache.store(source, filename, module, selection, new_code, report)
        # (freed before the collector is back: the first allocation after
        # the pause starts a collection of everything allocated during it --
        # a big module's tree, all of it alive, walked for nothing)
        del tree, msrc, code
    return new_code, report


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off while a module is rewritten.  The
    rewrite makes tens of objects per instruction (the tree, the decoded
    instructions) and frees them together; each collection the allocations
    trigger walks every object alive -- the module's tree too, in a big
    module most of the work (3000 module-level statements: 0.98 s -> 0.27 s
    of rewrite).  What the rewrite leaves in cycles is collected at the
    next collection after it, as without the pause.  (Left alone where the
    program turned the collector off itself.)"""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _decode(source: bytes) -> str:
    """``importlib.util.decode_source``, without importing ``tokenize`` for a
    source with neither a BOM nor a coding cookie (its first two lines)."""
    if source.startswith(b"\xef\xbb\xbf") or any(
            b"coding" in line for line in source.split(b"\n", 2)[:2]):
        return decode_source(source)
    return io.IncrementalNewlineDecoder(None, True).decode(source.decode("utf-8"))


def python_syntax_error(source: str | bytes, filename: str) -> SyntaxError:
    """The SyntaxError ``python filename`` reports for a source that does not
    compile (or decode)."""
    if isinstance(source, bytes) and not source.startswith(b"\xef\xbb\xbf"):
        cookie = re.compile(rb"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)")
        first_two = source.split(b"\n", 2)[:2]
        if not any(cookie.match(line) for line in first_two):
            for n, line in enumerate(source.split(b"\n"), 1):
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError as err:
                    return SyntaxError(
                        f"Non-UTF-8 code starting with '\\x{line[err.start]:02x}' in file "
                        f"{filename} on line {n}, but no encoding declared; see "
                        "https://peps.python.org/pep-0263/ for details")
    try:
        compile(source, filename, "exec", dont_inherit=True)
    except SyntaxError as exc:
        return exc
    except ValueError as exc:  # (null bytes, in Python < 3.12)
        return SyntaxError(str(exc))
    return SyntaxError(f"{filename} could not be parsed")


def vaccinate_function(fn: Callable) -> bool:
    """Vaccinate one function in place (``fn.__code__`` is replaced).

    Returns True if the function is vaccinated afterwards.  On failure it warns
    (or raises ``TransformError`` in strict mode) and leaves ``fn`` untouched.
    """
    code = getattr(fn, "__code__", None)
    if not isinstance(code, types.CodeType):
        raise TypeError(f"daifu.vaccinate expects a Python function, got {type(fn).__name__}")
    if is_vaccinated(code):
        return True
    pending = _lazy.pending_of(code)
    if pending is not None:  # a first-call stub: vaccinate now
        fn.__code__ = pending.code()
        return is_vaccinated(fn.__code__)
    report = Report(code.co_filename, getattr(fn, "__module__", None))
    back = _check_version(report)
    if back is None:
        return False
    from ._source import source_for_file  # lazy: 17.3 ms

    msrc = source_for_file(code.co_filename)
    scope = msrc.scope_for(code) if msrc is not None else None
    if scope is None:
        _not_vaccinated(report, code.co_qualname, "its source code is not available",
                        code.co_firstlineno)
        return False
    assert msrc is not None  # (scope was found in it)
    info = CodeInfo(code.co_qualname, code.co_filename, code.co_firstlineno,
                    getattr(fn, "__module__", None), original=code)
    try:
        new = back.rewrite(code, info, msrc, scope)
    except back.NothingToProtect:
        return False  # no statement of its own: nothing can fail, nothing to say
    except back.Unsupported as exc:
        _not_vaccinated(report, code.co_qualname, str(exc), code.co_firstlineno)
        return False
    if options.dump:
        _dump(report, new)
    fn.__code__ = new
    _register(report.filename)
    known = _registry.get(code.co_filename)
    if known is None:
        _registry.record(code.co_filename, getattr(fn, "__module__", None),
                         Selection(entries=(code.co_qualname,)), msrc.source, msrc)
    else:  # the file's own selection and source, plus this function
        selection = replace(
            known.selection, entries=known.selection.entries + (code.co_qualname,))
        _registry.record(known.filename, known.module, selection, known.source, known._msrc)
    return True


def vaccinate_loaded(module: types.ModuleType, selection: Selection) -> Report | None:
    """Vaccinate a module that is already imported, in place: every function
    object whose code came from its source gets the vaccinated code (module
    attributes, methods, closures, objects holding them: all see it from the
    next call).  None if the module is not a plain source module.

    A function whose running code is not what the file compiles to now (the
    file changed since the import) keeps its code."""
    spec = getattr(module, "__spec__", None)
    path = getattr(module, "__file__", None)
    if spec is None or type(spec.loader) is not SourceFileLoader or not path \
            or not path.endswith(".py"):
        return None
    with open(path, "rb") as fh:
        data = fh.read()
    live, report = vaccinate_source(data, path, selection, module=module.__name__)

    plain = compile(decode_source(data), path, "exec", dont_inherit=True)
    swap = {(p.co_qualname, p.co_firstlineno): (p, v)
            for p, v in code_pairs(plain, live) if v is not p}
    if not swap:
        return report
    for obj in gc.get_objects():
        if type(obj) is not types.FunctionType or obj.__code__.co_filename != path:
            continue
        code = obj.__code__
        pair = swap.get((code.co_qualname, code.co_firstlineno))
        if pair is not None and code == pair[0] and code.co_freevars == pair[1].co_freevars:
            obj.__code__ = pair[1]
    return report


def rewrite_continuation(code: types.CodeType, info: CodeInfo, msrc: ModuleSource, scope,
                         children: dict, spec) -> types.CodeType:
    """The *continuation* of new code (see the backend's ``Continuation``):
    entered at ``spec.stmt`` with the crashed frame's variables and stack.
    Raises the backend's ``Unsupported`` if there is no such place."""
    back, reason = backend()
    if back is None:
        raise RuntimeError(reason)
    return back.rewrite(code, info, msrc, scope, children, continuation=spec)


def code_pairs(plain: types.CodeType, live: types.CodeType
               ) -> list[tuple[types.CodeType, types.CodeType]]:
    """Pair every code object nested in ``plain`` (a module compiled from
    source) with its counterpart in ``live`` (the same module vaccinated).

    Pairs are made by identity of source -- qualified name and first line,
    in order of appearance for code objects that share both (two lambdas on
    one line) -- never by position in ``co_consts``: the rewrite reorders and
    merges constants."""
    out: list[tuple[types.CodeType, types.CodeType]] = []
    todo = [(plain, live)]
    while todo:
        p, v = todo.pop()
        groups: dict[tuple[str, int], list[types.CodeType]] = {}
        for const in v.co_consts:
            if isinstance(const, types.CodeType):
                groups.setdefault((const.co_qualname, const.co_firstlineno), []).append(const)
        taken: dict[tuple[str, int], int] = {}
        for const in p.co_consts:
            if not isinstance(const, types.CodeType):
                continue
            key = (const.co_qualname, const.co_firstlineno)
            n = taken.get(key, 0)
            candidates = groups.get(key, ())
            if n < len(candidates):
                taken[key] = n + 1
                out.append((const, candidates[n]))
                todo.append((const, candidates[n]))
    return out


def _register(filename: str) -> None:
    """(Kept for the call sites: the registry's files are the target files.)"""


def _compiled(source: str, filename: str) -> tuple[types.CodeType, ast.Module]:
    """``source``'s code and tree.  A long source (where only one thread
    runs) is compiled first, the memory the compiler freed given back to
    the system, and then parsed in pieces (``_source.parse``): its peak
    memory is python's own compile's, not the parser's tree and the
    compiler's on top of each other.  The parser's warnings were the
    compiler's: they are not shown twice."""
    import ast  # lazy: 1.3 ms

    if len(source) < _LONG or not _alone():
        tree = ast.parse(source, filename)
        return compile(tree, filename, "exec", dont_inherit=True), tree
    from ._source import parse  # lazy: 17.3 ms

    code = compile(source, filename, "exec", dont_inherit=True)
    _give_back()
    # (C code warns through ``warnings._showwarnmsg``: one thread, no other
    # warning can be shown meanwhile)
    show = getattr(warnings, "_showwarnmsg", None)
    if show is not None:
        warnings._showwarnmsg = _not_shown  # type: ignore[attr-defined]
    try:
        return code, parse(source, filename)
    finally:
        if show is not None:
            warnings._showwarnmsg = show  # type: ignore[attr-defined]


#: a source this long (characters) is compiled before it is parsed
_LONG = 1 << 16


def _alone() -> bool:
    """Is the thread running this the only Python thread?"""
    return threading.active_count() == 1


def _not_shown(msg: object) -> None:
    """A warning the compiler showed, met again by the parser."""


def _give_back() -> None:
    """Give the heap's free pages back to the system (glibc's
    ``malloc_trim``; elsewhere nothing): the compiler's tree, freed, is not
    where the parser's Python objects are allocated."""
    try:
        import ctypes  # lazy: 1.6 ms

        ctypes.CDLL(None).malloc_trim(0)
    except (ImportError, OSError, AttributeError):
        pass
