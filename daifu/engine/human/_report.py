"""The crash report: what a developer needs to decide what to do.

* the exception and its message;
* the failing statement, highlighted in a few lines of its source;
* the traceback (user frames only: daifu's plumbing is hidden);
* the live variables with compact summaries (tensors by shape/dtype/device/
  requires_grad/min/max/NaN, modules by class and parameter count, long
  containers truncated);
* what the failing statement had already done before it raised -- calls that
  returned, stores, in-place operations -- which a retry would do again.
"""

from __future__ import annotations

import linecache
import os
import reprlib
import sys
import traceback
import types
from typing import TYPE_CHECKING, Any

from ... import cells as _registry
from ..._record import field, record
from ...cells import backend, cell_range, cells_of, read_locals
from .._crash import _installed, exception_text, is_plumbing, library_package
from .._job import distributed
from ._break import is_break

if TYPE_CHECKING:
    from .._crash import Crash

_MUTATING_METHODS = frozenset({
    "append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault", "add",
    "discard", "popitem", "sort", "reverse", "write", "writelines", "save", "step", "backward",
    "zero_grad", "send", "put", "mkdir", "makedirs", "unlink", "rename", "replace", "rmtree",
    "copy_", "fill_", "zero_", "add_", "mul_", "sub_", "div_", "clamp_", "load_state_dict",
})


@record
class Report:
    """A structured crash report (also logged as the ``crash.report`` event)."""

    title: str
    where: str
    statement: str
    source: list[tuple[int, str, bool]]  # (line number, text, is the failing statement)
    traceback: list[str]
    variables: dict[str, str]
    done_before: list[str] = field(default_factory=list)
    options: list[str] = field(default_factory=list)
    #: a DataLoader worker's own exception: what it raised, where in the
    #: dataset's code, and the batch (``_loaders.WorkerError``)
    worker: list[str] = field(default_factory=list)

    def render(self, width: int = 100) -> str:
        head = "paused (break)" if self.title.startswith("Break: ") else "crash intercepted"
        out = [f"daifu: {head} -- {self.title}", f"  at {self.where}"]
        rank = distributed()
        if rank:  # which rank of a distributed job (several may share a terminal)
            out.append(f"  on rank {rank.get('rank', '?')} of {rank.get('world_size', '?')} "
                       f"(local rank {rank.get('local_rank', '?')}, pid {os.getpid()}), job "
                       f"{rank.get('job', '?')}")
        out.append("")
        for lineno, text, failing in self.source:
            marker = "-->" if failing else "   "
            out.append(f"  {marker} {lineno:5d}  {text}"[:width])
        if self.traceback:
            out += ["", "  traceback (most recent call last):"]
            out += ["    " + line for chunk in self.traceback
                    for line in chunk.rstrip().splitlines()]
        if self.worker:
            out += [""] + [f"  {line}"[:width] for line in self.worker]
        if self.variables:
            out += ["", "  variables:"]
            pad = max(len(k) for k in self.variables)
            for name, summary in self.variables.items():
                out.append(f"    {name:<{pad}} = {summary}"[:width])
        if self.done_before:
            out += ["", "  before raising, the failing statement already did "
                        "(a retry does it again):"]
            out += [f"    - {item}" for item in self.done_before]
        if self.options:
            out += ["", "  options: " + "; ".join(self.options)]
        return "\n".join(out)


def cell_name(filename: str) -> str | None:
    """``Cell In[5]``: how IPython names the file of a notebook cell (its
    compiler's ``format_code_name``), or None for other files."""
    ipython = sys.modules.get("IPython")
    try:
        shell = ipython.get_ipython() if ipython is not None else None
        named = shell.compile.format_code_name(filename) if shell is not None else None
    except Exception:
        return None
    return f"{named[0]} {named[1]}" if named else None


def shown_where(filename: str, lineno: int | None) -> str:
    """``file:line`` as a person reads it: ``Cell In[5], line 3`` in a notebook."""
    cell = cell_name(filename)
    return f"{cell}, line {lineno}" if cell else f"{filename}:{lineno}"


def running_lines(filename: str, code: types.CodeType | None = None) -> list[str]:
    """The lines of the source a file's code runs: the text ``code`` (a
    frame's) was made from -- code still running after a reload replaced it
    shows its old text --, else for a vaccinated file the text it was loaded
    (or last reloaded) from -- not an edit saved since, which ``linecache``
    would show --, else what ``linecache`` has."""
    info = _registry.cells_of(code) if code is not None else None
    if info is not None and info.source is not None:
        return info.source.splitlines(True)
    loaded = _registry.get(filename)
    if loaded is not None:
        return loaded.source.splitlines(True)
    return linecache.getlines(filename)


def running_line(filename: str, lineno: int, code: types.CodeType | None = None) -> str:
    """Line ``lineno`` (1-based) of ``running_lines``, or ""."""
    lines = running_lines(filename, code)
    return lines[lineno - 1] if 1 <= lineno <= len(lines) else ""


def build(crash: Crash, context: int = 3) -> Report:
    exc = crash.exception
    lineno = crash.lineno or 0
    # the lines of the statement that failed: a compound statement's header
    # (a loop's ``for`` line, not its whole body)
    end = min(crash.cell.end_lineno or lineno, lineno + crash.statement.count("\n"))
    lines = []
    for n in range(max(1, lineno - context), end + context + 1):
        text = running_line(crash.filename, n, crash.frame.f_code).rstrip("\n")
        if not text and n > end:
            break
        lines.append((n, text, lineno <= n <= end))
    worker = getattr(crash.batch, "worker", None)
    return Report(
        title=(f"{worker.error} (in {worker.where}: __worker__ in the console)" if worker
               else f"{type(exc).__qualname__}: {exception_text(exc, 300, one_line=True)}"),
        where=f"{shown_where(crash.filename, crash.lineno)} in {crash.function}()",
        statement=crash.statement,
        source=lines,
        traceback=user_traceback(exc, crash._frame),
        variables=summarize_vars(crash),
        done_before=done_before(crash),
        options=options(crash),
        worker=_worker_lines(worker) if worker else [],
    )


def _worker_lines(worker) -> list[str]:
    out = [f"{worker.where} raised {worker.error}"]
    for file, line, func, code in worker.frames:
        out.append(f'  File "{file}", line {line}, in {func}')
        if code:
            out.append(f"    {code}")
    if worker.indices is not None:
        shown = repr(worker.indices)
        if len(shown) > 200:
            shown = summarize(worker.indices)
        out.append(f"the batch's indices: {shown}")
    return out


def user_traceback(exc: BaseException, frame: types.FrameType | None = None) -> list[str]:
    """The call stack of the crash -- the callers of the crashed frame, then the
    exception's traceback from it -- without daifu's (or runpy's) frames."""
    # (extract_stack(None) would be the stack of this very call)
    back = frame.f_back if frame is not None else None
    frames = traceback.extract_stack(back) if back is not None else []
    frames += traceback.extract_tb(exc.__traceback__)
    frames = [f for f in frames if not is_plumbing(f.filename)]
    # runs of installed library frames (torch's Module.__call__, Lightning's
    # loops, ipykernel and asyncio) are one line; the console's `bt all` has them
    vaccinated = _registry.target_files()
    out: list[str] = []
    run: list[Any] = []

    def flush() -> None:
        if len(run) > 1:
            packages = sorted({library_package(f.filename) for f in run})
            out.append(f"  ... {len(run)} frames of {', '.join(packages)} "
                       "(the console's bt all shows them)\n")
        else:
            out.extend(traceback.format_list(run))
        run.clear()

    for n, f in enumerate(frames):
        if n < len(frames) - 1 and _installed(f.filename) and f.filename not in vaccinated:
            run.append(f)
            continue
        flush()
        text = traceback.format_list([f])[0]
        cell = cell_name(f.filename)
        if cell:  # as IPython's own tracebacks name it
            text = text.replace(f'File "{f.filename}", line {f.lineno}', f"{cell}, line {f.lineno}",
                                1)
        out.append(text)
    flush()
    return out


def options(crash: Crash) -> list[str]:
    if is_break(crash.exception):
        said = ["continue (run on from here: the statement has not started)",
                "skip (leave the statement out)" if crash.can_skip else "",
                "reload, exec, up as at a crash"]
        return [o for o in said if o]
    out = []
    batch = crash.batch is not None  # a DataLoader batch failed at this loop header
    if crash.can_retry:
        out.append("retry (fetch the same batch again, in this process: its items' random "
                   "transforms draw anew, not what the first fetch drew)" if batch else
                   f"retry ({crash.retry_note})" if crash.retry_note else "retry")
    else:
        out.append(f"retry impossible ({crash.retry_reason})")
    if crash.can_skip:
        out.append(f"skip ({crash.cell.skip_effect})")
    if crash.can_continue:
        out.append("next (drop the failed batch, go on with the next one)" if batch else
                   "next (continue with the loop's next item)")
    # a retry in a caller (up, then retry; also what replace and reload may
    # do) re-runs code that draws random numbers: said before the choice
    up = _vaccinated_caller_level(crash)
    notes = redraws(crash, up) if up is not None else []
    if up is not None and notes:
        name = crash.frame_at(up).f_code.co_name
        out.append(f"retry in caller {name}() (up {name}, retry) -- note: {'; '.join(notes)}")
    return out


def _vaccinated_caller_level(crash: Crash) -> int | None:
    try:
        return crash.vaccinated_caller(0)
    except Exception:
        return None


def redraws(crash: Crash, level: int) -> list[str]:
    """What re-executing the call in caller frame ``level`` of the crashed
    stack (unwinding the frames below it) draws from the global RNGs anew: each DataLoader
    those frames' ``for`` loops are iterating (``for b in loader``, also
    inside ``enumerate(...)``/``zip(...)``) is iterated again from a new
    iterator, which draws a new base seed."""
    data = sys.modules.get("torch.utils.data")
    loader_type = getattr(data, "DataLoader", None)
    if loader_type is None:
        return []
    import ast  # lazy: 1.3 ms

    out = []
    for n, frame in enumerate(crash.frames()[:level]):
        try:
            loaded = _registry.get(frame.f_code.co_filename)
            line = crash.lineno if n == 0 else frame.f_lineno
            if loaded is None or line is None:
                continue
            names = read_locals_safe(frame)
            for node in ast.walk(loaded.msrc.tree):
                if not isinstance(node, (ast.For, ast.AsyncFor)) or not (
                        node.lineno <= line <= (node.end_lineno or node.lineno)) or \
                        line == node.lineno and not _inside(node, line):
                    continue
                for expr in _iterated(node.iter):
                    value = _lookup(expr, names, frame.f_globals)
                    if isinstance(value, loader_type):
                        out.append(f"{frame.f_code.co_qualname}() iterates "
                                   f"{ast.unparse(expr)} (a DataLoader): the retry makes a new "
                                   "iterator of it, which draws a new seed from torch's global "
                                   "RNG, so the run will not be identical to an uninterrupted "
                                   "one")
        except Exception:
            continue
    return out


def _inside(node, line: int) -> bool:
    return any(getattr(b, "lineno", 0) <= line for b in node.body)


def _iterated(expr) -> list:
    """The plain names/attributes a for loop's iterable reads directly."""
    import ast  # lazy: 1.3 ms

    if isinstance(expr, (ast.Name, ast.Attribute)):
        return [expr]
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and \
            expr.func.id in ("enumerate", "zip", "iter", "tqdm"):
        return [a for a in expr.args if isinstance(a, (ast.Name, ast.Attribute))]
    return []


def _lookup(expr, names: dict, globals_: dict) -> Any:
    import ast  # lazy: 1.3 ms

    if isinstance(expr, ast.Name):
        return names.get(expr.id, globals_.get(expr.id))
    if isinstance(expr, ast.Attribute):
        owner = _lookup(expr.value, names, globals_)
        return getattr(owner, expr.attr, None) if owner is not None else None
    return None


def read_locals_safe(frame: types.FrameType) -> dict:
    try:
        return read_locals(frame)
    except Exception:
        return {}


# -- values ---------------------------------------------------------------------------

_repr = reprlib.Repr()
_repr.maxstring = 60
_repr.maxother = 60
_repr.maxlist = _repr.maxtuple = _repr.maxset = _repr.maxdict = 6
_repr.maxlevel = 2


def summarize(value: Any) -> str:
    """A compact, one-line description of a value (never raises)."""
    try:
        if "torch" in sys.modules:  # (user subclasses of nn.Module live in user modules)
            desc = _torch_summary(value)
            if desc is not None:
                return desc
            desc = _container_summary(value)
            if desc is not None:
                return desc
        if isinstance(value, (list, tuple, set, frozenset, dict)) and len(value) > 6:
            return f"{type(value).__name__} of {len(value)}: {_one_line(_repr.repr(value))}"
        return _one_line(_repr.repr(value))
    except Exception as exc:  # a broken __repr__ must not break the report
        return f"<{type(value).__name__}: repr failed: {type(exc).__name__}>"


def _one_line(text: str, limit: int = 120) -> str:
    text = " ".join(text.split()) if "\n" in text else text
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _container_summary(value: Any, limit: int = 3) -> str | None:
    """A list/tuple/dict holding torch objects: each summarised (a batch
    ``[images, labels]``, a dict of tensors), the first ``limit`` shown."""
    import torch  # lazy: 1.4 s

    if isinstance(value, (list, tuple)):
        items = list(value)
        parts = [_torch_summary(v) if isinstance(v, torch.Tensor) else None for v in items[:limit]]
        if not any(isinstance(v, torch.Tensor) for v in items):
            return None
        shown = [p if p is not None else summarize(v) for p, v in zip(parts, items)]
        more = f", ... {len(items) - limit} more" if len(items) > limit else ""
        open_, close = ("[", "]") if isinstance(value, list) else ("(", ")")
        return f"{type(value).__name__} of {len(items)}: {open_}{', '.join(shown)}{more}{close}"
    if isinstance(value, dict):
        if not any(isinstance(v, torch.Tensor) for v in value.values()):
            return None
        keys = list(value)
        shown = [f"{k!r}: {summarize(value[k])}" for k in keys[:limit]]
        more = f", ... {len(keys) - limit} more" if len(keys) > limit else ""
        return f"{type(value).__name__} of {len(keys)}: {{{', '.join(shown)}{more}}}"
    return None


def _torch_summary(value: Any) -> str | None:
    import torch  # lazy: 1.4 s

    if isinstance(value, torch.Tensor):
        parts = [f"tensor{tuple(value.shape)}", str(value.dtype).replace("torch.", ""),
                 str(value.device)]
        if value.requires_grad:
            parts.append("requires_grad")
        if value.numel() and not value.is_meta and value.device.type == "cpu":
            with torch.no_grad():
                flat = value.detach()
                if flat.is_floating_point() or flat.is_complex():
                    nan = bool(torch.isnan(flat).any())
                    finite = flat[torch.isfinite(flat)] if nan else flat
                    if finite.numel():
                        parts.append(f"min={finite.min().item():.4g} max={finite.max().item():.4g}")
                    if nan:
                        parts.append("HAS NaN")
                elif flat.dtype != torch.bool:
                    parts.append(f"min={flat.min().item()} max={flat.max().item()}")
        return " ".join(parts)
    if isinstance(value, torch.nn.Module):
        n = sum(p.numel() for p in value.parameters())
        return f"{type(value).__name__} module, {n:,} parameters, training={value.training}"
    if isinstance(value, torch.optim.Optimizer):
        groups = value.param_groups
        lr = groups[0].get("lr") if groups else None
        return f"{type(value).__name__} optimizer, {len(groups)} param group(s), lr={lr}"
    return None


def summarize_vars(crash: Crash, limit: int = 40) -> dict[str, str]:
    try:
        names = crash.vars
        items = [(k, names[k]) for k in list(names)]
    except Exception:
        return {}
    out = {}
    for name, value in items:
        if name.startswith("__") or isinstance(value, (types.ModuleType, types.FunctionType,
                                                       type)):
            continue  # module globals: imports, functions and classes are noise
        out[name] = summarize(value)
        if len(out) >= limit:
            out["..."] = f"{len(items) - limit} more"
            break
    return out


# -- side effects already done ------------------------------------------------------------


def done_before(crash: Crash) -> list[str]:
    """Effects of the failing statement that completed before it raised:
    calls that returned, attribute/item stores, in-place operators."""
    frame_code = crash._frame.f_code if crash._frame is not None else None
    if frame_code is None:
        return []
    try:
        return _done_before(frame_code, crash.lasti)
    except Exception:
        return []


def _done_before(code: types.CodeType, lasti: int) -> list[str]:
    info = cells_of(code)
    if info is None:
        return []

    back, _ = backend()
    if back is None:
        return []
    offset = back.lasti_offset(lasti)
    found = cell_range(info, code, offset)
    if found is None:
        return []
    start = found[0]  # of the run (original or retry copy) that contains lasti
    effects = []
    for kind, detail, pos in back.effects(code, start, offset):
        text = _source_at(code.co_filename, pos)
        if kind == "call":
            name = text.split("(")[0].rsplit(".", 1)[-1] if text else ""
            kind = "mutating call" if name in _MUTATING_METHODS or name.endswith("_") else "call"
            effects.append(f"{kind}: {text}" if text else kind)
        elif kind == "store":
            effects.append(f"store: {text}" if text else "store")
        elif kind == "in-place":
            effects.append(f"in-place {detail}: {text}" if text else "in-place op")
    return effects


def _source_at(filename: str, pos) -> str:
    if pos is None or pos.lineno is None or pos.lineno != pos.end_lineno:
        return ""
    line = running_line(filename, pos.lineno)
    if pos.col_offset is None or pos.end_col_offset is None:
        return line.strip()
    return line.encode()[pos.col_offset : pos.end_col_offset].decode(errors="replace")
