"""The import hook: a ``sys.meta_path`` finder that vaccinates target modules.

``find_spec`` answers "no" fast (re-entrancy guard, then the module name
against ``DAIFU_MODULES``) before any file lookup; then it asks the finders
after it for the regular spec and claims only plain source modules
(``SourceFileLoader``): packages work, zip/frozen/extension/namespace imports
fall through untouched.  The loader vaccinates in ``source_to_code`` and never
reads or writes ``.pyc`` files -- rewritten code holds live objects (cells,
the barrier) that cannot be marshalled.
"""

from __future__ import annotations

import sys
import threading
import warnings
from importlib.machinery import ModuleSpec, SourceFileLoader
from types import CodeType

from .._errors import NotVaccinatedWarning, TransformError
from ..cells import Selection, options, vaccinate_loaded, vaccinate_source
from ..engine import ModuleVaccinated, emit
from ._patterns import ModuleMatcher

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from typing import Any, cast
else:
    def cast(_type, value):  # (typing.cast)
        return value


class _ThenPatch:
    """A module's own loader, followed by a patch of the loaded module
    (how spawn's command line is patched without importing multiprocessing
    before the program does)."""

    def __init__(self, loader, patch):
        self._loader = loader
        self._patch = patch

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        self._patch()

    def __getattr__(self, name: str):
        return getattr(self._loader, name)


class DaifuFinder:
    """Claims source modules whose dotted name matches ``matcher``."""

    def __init__(self, matcher: ModuleMatcher, selection: Selection,
                 on_import: dict[str, Any] | None = None, project: Any = None,
                 explain: bool = False):
        self.matcher = matcher
        self.selection = selection
        #: the program's project (``_project.Project``): its modules are
        #: vaccinated too, when their file lives under its directory
        self.project = project
        #: ``--explain``: each decision said on stderr
        self.explain = explain
        self._tls = threading.local()
        #: module name -> patch called once the program imports that module
        #: (``multiprocessing.spawn``: children activate daifu;
        #: ``torch.utils.data.dataloader``: batch indices a retry needs)
        self.on_import: dict[str, Any] = dict(on_import or {})

    def find_spec(self, fullname: str, path=None, target=None) -> ModuleSpec | None:
        if self.on_import and fullname in self.on_import:
            return self._patched(fullname, path, target)
        named = self.matcher.matches(fullname)
        if not (named or (self.project is not None and self.project.matches(fullname))) \
                or getattr(self._tls, "busy", False):
            return None
        self._tls.busy = True
        try:
            spec = self._regular_spec(fullname, path, target)
        finally:
            self._tls.busy = False
        if spec is None or type(spec.loader) is not SourceFileLoader or not spec.origin:
            if self.explain and spec is not None:
                _say(f"not vaccinated {fullname}: not a source file "
                     f"({type(spec.loader).__name__})")
            return None
        if not named:
            why = self.project.refuses(spec.origin)
            if why is not None:
                if self.explain:
                    _say(f"not vaccinated {fullname} ({spec.origin}): {why}")
                return None
        if self.explain:
            _say(f"vaccinated {fullname} ({spec.origin}): " + (
                f"--modules/DAIFU_MODULES {self.matcher.which(fullname)!r}" if named
                else f"in the project, {self.project.root}"))
        spec.loader = DaifuLoader(fullname, spec.origin, self.selection)
        spec.cached = None
        return spec

    def _patched(self, fullname, path, target) -> ModuleSpec | None:
        patch = self.on_import.pop(fullname)
        spec = self._regular_spec(fullname, path, target)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = cast("Any", _ThenPatch(spec.loader, patch))
        return spec

    def _regular_spec(self, fullname, path, target) -> ModuleSpec | None:
        # never importlib.util.find_spec() from here: walk the finders after us
        finders = list(sys.meta_path)
        try:
            rest = finders[finders.index(self) + 1 :]
        except ValueError:
            rest = finders
        for finder in rest:
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                return spec
        return None

    def invalidate_caches(self) -> None:
        pass

    def claims(self, fullname: str, origin: str | None) -> bool:
        """Would this finder vaccinate the module ``fullname`` at ``origin``
        (one imported before it was installed)?"""
        if self.matcher.matches(fullname):
            return True
        return (self.project is not None and origin is not None
                and self.project.matches(fullname) and self.project.refuses(origin) is None)

    def __repr__(self) -> str:
        return f"<DaifuFinder {self.matcher!r}>"


def _say(text: str) -> None:
    """``--explain``: one line on stderr."""
    sys.stderr.write(f"daifu: {text}\n")


# A module with a syntax error must fail the way it fails without daifu: the
# import's traceback shows the importing line and the error -- no importlib
# and no daifu frames.  CPython drops the importlib frames of a traceback up to
# one named ``_call_with_frames_removed`` in an importlib file; the loader's
# ``get_code`` (which importlib's ``exec_module`` calls) is compiled as such a
# frame, and re-raises a SyntaxError from itself, its traceback starting there.
def _call_with_frames_removed(self, fullname):
    try:
        return self._get_code(fullname)
    except SyntaxError as exc:
        raise exc.with_traceback(None)  # noqa: B904 (the same exception, as importlib does)


# (the name and file importlib's traceback trimming looks for)
_call_with_frames_removed.__code__ = _call_with_frames_removed.__code__.replace(
    co_filename="<frozen importlib._bootstrap_external>")
_frames_removed_get_code = _call_with_frames_removed


class DaifuLoader(SourceFileLoader):
    """A ``SourceFileLoader`` whose code is vaccinated (and never cached)."""

    def __init__(self, fullname: str, path: str, selection: Selection):
        super().__init__(fullname, path)
        self.selection = selection

    def _get_code(self, fullname: str) -> CodeType:
        source = self.get_data(self.get_filename(fullname))
        return self.source_to_code(source, self.get_filename(fullname))

    def source_to_code(self, data, path, *, _optimize=-1):
        return compile_vaccinated(data, path, self.selection, self.name)

    get_code = _frames_removed_get_code  # (see below: _get_code, as importlib calls it)





def vaccinate_in_place(module, selection: Selection) -> None:
    """Vaccinate an already imported module (``cells.vaccinate_loaded``) and
    say so; any failure warns and leaves the module as it was."""
    try:
        report = vaccinate_loaded(module, selection)
    except TransformError:
        raise
    except Exception as exc:
        if options.strict:
            raise
        warnings.warn(f"daifu: could not vaccinate the imported module {module.__name__}: "
                      f"{type(exc).__name__}: {exc}; it runs unmodified",
                      NotVaccinatedWarning, stacklevel=3)
        return
    if report is not None:
        emit(ModuleVaccinated(
            module=module.__name__, file=str(report.filename),
            functions=[c.qualname for c in report.vaccinated],
            skipped=[f"{q}: {r}" for q, r in report.skipped],
            cached=report.cached, in_place=True, first_call=list(report.lazy),
        ))


def compile_vaccinated(source: bytes | str, path: str, selection: Selection,
                       module: str) -> CodeType:
    """Vaccinate a module's source (the import hook, the runner's main script,
    a spawned child's ``__mp_main__``) and say so (``module.vaccinated``).

    A syntax error is the program's own and propagates; so does a
    ``TransformError`` under ``--strict``.  Any other failure is a daifu bug
    that must not break the program: it warns (raises under ``--strict``) and
    the module is compiled unmodified."""
    try:
        code, report = vaccinate_source(source, path, selection, module=module)
    except (SyntaxError, TransformError):
        raise
    except Exception as exc:
        if options.strict:
            raise
        warnings.warn(
            f"daifu: could not vaccinate module {module} ({path}): "
            f"{type(exc).__name__}: {exc}; it runs unmodified",
            NotVaccinatedWarning,
            stacklevel=3,
        )
        return compile(source, path, "exec", dont_inherit=True)
    emit(ModuleVaccinated(
        module=module, file=str(path),
        functions=[c.qualname for c in report.vaccinated],
        skipped=[f"{q}: {r}" for q, r in report.skipped],
        cached=report.cached, first_call=list(report.lazy),
    ))
    return code
