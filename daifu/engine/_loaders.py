"""Recovery at the header of a loop over a torch ``DataLoader``.

``for x, y in loader:`` fails at its header when the dataset raises for one
batch.  Two answers make sense, and both exist:

* ``daifu.RETRY`` -- fetch **the same batch** again (the same indices),
  after the rule or the human repaired the dataset.  The DataLoader
  iterator is left where it is; its next ``_next_data()`` call is answered
  once by re-fetching the failed indices in this process (``_refetch``),
  then it goes on as before.  The failed indices come from the exception's
  traceback (single-process loading: the ``index`` local of
  ``_next_data``) or, with worker processes, from a record of the indices
  sent to the workers (``record_sent_indices``, installed when
  ``torch.utils.data.dataloader`` is imported under daifu).
* ``daifu.CONTINUE`` -- go on with the next batch: the failed one is
  dropped, as a ``continue`` statement would.

A wrapper generator around the iterator (``for b in tqdm(loader)``) dies
with the exception: retrying its ``next()`` would end the loop.  For
generators known to hand items through unchanged (tqdm's), the loop's
iterator is swapped for the DataLoader iterator the generator was reading
(``rewrap``) -- the loop goes on over the same batches; the progress bar,
closed by the exception, no longer updates.  Other generators are refused
(``Crash.retry_reason`` says why): daifu cannot know what they did to each
item.
"""

from __future__ import annotations

import os
import types

from .._errors import PatchError
from .._record import record
from ..cells import read_locals

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from typing import Any

_DATALOADER = os.sep + os.path.join("torch", "utils", "data", "dataloader.py")
#: generator functions known to yield their iterable's items unchanged:
#: (the package directory their file is in, code qualname)
_PASS_THROUGH = (("tqdm", "tqdm.__iter__"),)
#: how many sent-but-unanswered batches a worker iterator remembers at most
#: (``prefetch_factor * num_workers`` are outstanding; this bounds a leak
#: if the iterator is used in some unforeseen way)
_MAX_SENT = 4096


@record
class WorkerError:
    """The exception a DataLoader worker process raised, as the main process
    receives it: torch sends its type and formatted traceback, not the
    object, and raises ``type("Caught T in DataLoader worker process N.
    Original Traceback ...")`` in the main process (``parse``)."""

    #: "DataLoader worker process 0" (where torch says it was caught)
    where: str
    #: the original exception, as its traceback's last line says it:
    #: "OSError: [Errno 22] Invalid argument"
    error: str
    #: the original traceback (the worker's), as torch formatted it
    traceback: str
    #: the worker's frames outside torch (the dataset's code), innermost
    #: last: (file, line, function, source)
    frames: tuple[tuple[str, int, str, str], ...] = ()
    #: the failed batch's indices, when known
    indices: Any = None

    @classmethod
    def parse(cls, exc: BaseException) -> WorkerError | None:
        text = exc.args[0] if exc.args and isinstance(exc.args[0], str) else str(exc)
        head, sep, original = text.partition("\nOriginal ")
        if not sep or not head.startswith("Caught ") or " in " not in head:
            return None
        where = head.split(" in ", 1)[1].rstrip(".")
        lines = original.rstrip("\n").splitlines()
        error = next((line for line in reversed(lines) if line and not line[0].isspace()), "")
        frames = []
        for n, line in enumerate(lines):
            stripped = line.strip()
            if not stripped.startswith('File "'):
                continue
            try:
                file, rest = stripped[6:].split('", line ', 1)
                lineno, _, func = rest.partition(", in ")
                code = lines[n + 1].strip() if n + 1 < len(lines) else ""
                frames.append((file, int(lineno), func, code))
            except (ValueError, IndexError):
                continue
        own = tuple(f for f in frames if os.sep + "torch" + os.sep not in f[0]) or tuple(frames)
        return cls(where, error, original, own[-3:])

    def summary(self) -> str:
        return f"{self.error} (in {self.where})"


@record
class LoaderFailure:
    """A batch of a DataLoader iterator failed."""

    iterator: Any  #: the ``_BaseDataLoaderIter`` whose ``__next__`` raised
    index: Any  #: the failed batch's indices (None: unknown, see ``unknown``)
    unknown: str | None  #: why the indices are not known
    #: what the worker process raised (with worker processes), or None
    worker: WorkerError | None = None


def _frames(exc: BaseException) -> list[types.FrameType]:
    out = []
    tb = exc.__traceback__
    while tb is not None:
        out.append(tb.tb_frame)
        tb = tb.tb_next
    return out


def _is_loader_next(code: types.CodeType) -> bool:
    return code.co_name == "__next__" and code.co_filename.endswith(_DATALOADER)


def failure(exc: BaseException) -> LoaderFailure | None:
    """The DataLoader batch whose fetch raised ``exc``, or None when the
    exception did not come from a DataLoader iterator."""
    frames = _frames(exc)
    for n, frame in enumerate(frames):
        if not _is_loader_next(frame.f_code):
            continue
        it = read_locals(frame).get("self")
        if it is None:
            return None
        inner = frames[n + 1:]
        for f in inner:
            if f.f_code is _refetch.__code__:  # the re-fetch of a retry failed again
                return LoaderFailure(it, read_locals(f).get("index"), None)
        found = _failed_batch(it, inner)
        if getattr(it, "_num_workers", 0):
            found.worker = WorkerError.parse(exc)
            if found.worker is not None:
                found.worker.indices = found.index
        return found
    return None


def _failed_batch(it: Any, inner: list[types.FrameType]) -> LoaderFailure:
    from torch.utils.data.dataloader import _DatasetKind  # lazy: 1.4 s

    if getattr(it, "_dataset_kind", None) != _DatasetKind.Map:
        return LoaderFailure(it, None, "the dataset is an IterableDataset: its batches have no "
                                       "indices to fetch again")
    if getattr(it, "_num_workers", 0) == 0:
        for f in inner:
            if f.f_code.co_name == "_next_data" and f.f_code.co_filename.endswith(_DATALOADER):
                index = read_locals(f).get("index")
                if index is not None:
                    return LoaderFailure(it, index, None)
        return LoaderFailure(it, None, "the sampler itself failed: no batch was being fetched")
    if not any(f.f_code.co_name == "_process_data" for f in inner):
        return LoaderFailure(it, None, "the loader failed, not one batch (a worker died or "
                                       "timed out)")
    sent = it.__dict__.get("_daifu_sent")
    if sent is None:
        return LoaderFailure(it, None, "the indices sent to the worker processes were not "
                                       "recorded (daifu records them under python -m daifu "
                                       "and after daifu.install())")
    if getattr(it, "_in_order", True):
        key = it._rcvd_idx - 1
    else:
        key = next((read_locals(f).get("idx") for f in inner
                    if f.f_code.co_name == "_next_data"), None)
    index = sent.get(key)
    if index is None:
        return LoaderFailure(it, None, "the failed batch's indices are not known")
    return LoaderFailure(it, index, None)


def arrange_refetch(found: LoaderFailure) -> None:
    """Make the iterator's next ``_next_data()`` fetch ``found.index`` again
    (in this process).  Raises ``PatchError`` when that cannot be done."""
    if found.index is None:
        raise PatchError(f"cannot fetch the failed batch again: {found.unknown}. "
                         "CONTINUE goes on with the next batch")
    it, index = found.iterator, found.index
    # an instance attribute shadows the class's method for one call; it
    # removes itself first, so a re-fetch that fails leaves the iterator as it was
    it._next_data = lambda: _refetch(it, index)


def _refetch(it: Any, index: Any) -> Any:
    it.__dict__.pop("_next_data", None)
    fetcher = getattr(it, "_dataset_fetcher", None)
    if fetcher is None:  # worker processes fetch for the iterator: fetch here instead
        from torch.utils.data.dataloader import _DatasetKind  # lazy: 1.4 s

        fetcher = _DatasetKind.create_fetcher(it._dataset_kind, it._dataset,
                                              it._auto_collation, it._collate_fn, it._drop_last)
    data = fetcher.fetch(index)
    if it._pin_memory:
        from torch.utils.data import _utils  # lazy: 1.6 s

        data = _utils.pin_memory.pin_memory(data, it._pin_memory_device)
    return data


# -- a generator around the DataLoader iterator -----------------------------------------


def _pass_through(gen: types.GeneratorType) -> bool:
    code = gen.gi_code
    folders = os.path.dirname(code.co_filename).split(os.sep)
    return any(code.co_qualname == qual and package in folders
               for package, qual in _PASS_THROUGH)


def rewrap(iterator: Any, exc: BaseException) -> tuple[Any, str] | None:
    """For a loop iterator that died with ``exc`` because it is (or an
    ``enumerate`` wraps) a pass-through generator over another iterator that
    survived: ``(replacement iterator, what was done)``; else None."""
    gen, rebuild = iterator, lambda inner: inner
    if type(iterator) is enumerate:
        reduced: Any = iterator.__reduce__()  # (enumerate, (iterator, count))
        if len(reduced) < 2 or len(reduced[1]) != 2:
            return None
        gen, start = reduced[1]
        rebuild = lambda inner: enumerate(inner, start)  # noqa: E731  # the same count
    if not (isinstance(gen, types.GeneratorType) and gen.gi_frame is None
            and _pass_through(gen)):
        return None
    frames = _frames(exc)
    for n, frame in enumerate(frames):
        if frame.f_code is gen.gi_code and n + 1 < len(frames):
            below = frames[n + 1]
            if below.f_code.co_name != "__next__":
                return None
            inner = read_locals(below).get("self")
            if inner is None or not hasattr(inner, "__next__"):
                return None
            return rebuild(inner), (f"the loop's {gen.gi_code.co_qualname} generator ended with "
                                    f"the exception; the loop goes on over the "
                                    f"{type(inner).__name__} it was reading (its progress "
                                    "display no longer updates)")
    return None


# -- recording the indices sent to worker processes -------------------------------------


def record_sent_indices(module: Any = None) -> None:
    """Make worker DataLoader iterators remember the indices of the batches
    they sent to their workers until the batches come back (what a retry of
    the same batch needs).  Called once ``torch.utils.data.dataloader`` is
    imported; costs one dict insert and delete per batch."""
    if module is None:
        import torch.utils.data.dataloader as module  # lazy: 1.4 s
    cls = getattr(module, "_MultiProcessingDataLoaderIter", None)
    if cls is None or "_next_index" in cls.__dict__:
        return
    inherited = cls._next_index

    def _next_index(self):
        index = inherited(self)
        sent = self.__dict__.get("_daifu_sent")
        if sent is None or self._send_idx == 0:  # (a new epoch starts counting at 0)
            sent = self._daifu_sent = {}
        sent[self._send_idx] = index
        oldest = self._rcvd_idx - 1  # the last batch handed out may be retried
        while sent and (next(iter(sent)) < oldest or len(sent) > _MAX_SENT):
            del sent[next(iter(sent))]
        return index

    _next_index.__qualname__ = f"{cls.__qualname__}._next_index"
    _next_index._daifu = True  # type: ignore[attr-defined]
    cls._next_index = _next_index
