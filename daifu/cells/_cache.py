"""A per-user on-disk cache of vaccinated module code.

Rewriting costs milliseconds per function (most of it in ``bytecode``'s
assembler), so a library vaccinated with ``DAIFU_ENTRY='*'`` would add seconds
to every start.  The cache stores the result of ``vaccinate_source`` -- the
module's rewritten code object and its ``Report`` -- and loads it in a few
milliseconds when the same source is vaccinated the same way again.

What a rewritten code object holds is not marshallable: its constants include
``Cell`` objects (with their guards and ``CodeInfo``) and the engine functions
the stubs call.  An entry is therefore a pickle in which every code object is
reduced to ``marshal`` bytes (constants blanked) plus its real constants,
pickled recursively: cells as plain data, engine functions by reference.
Loading rebuilds the same object graph (identity inside it included: a cell's
``info`` is the report's ``CodeInfo``).

An entry is keyed by what decides the rewrite: the file name (it is in the
code), module name, selection, and a fingerprint of this daifu installation
(name, size and modification time of every daifu module and of the
``bytecode`` library's: stat, not read, and ``bytecode`` is not imported --
every start computes it), the daifu and Python versions; it records a hash
of the source and is used only when the source is byte-for-byte the one it
was made from.  One entry per (file, module,
selection): a changed source overwrites it; entries not rewritten for 30 days
are removed when a process first writes an entry.

A cache entry is code this process will run, so the cache lives in a private
directory (0700, owned by this user, checked like the control-socket
directory), entries are written atomically with mode 0600, and loading refuses
files owned by someone else or writable by others, and any class or function
outside daifu.  Anything wrong with an entry makes it a miss: the module is
rewritten as if there were no cache.
"""

from __future__ import annotations

import functools
import io
import marshal
import os
import stat
import sys
import time
import types
import warnings
from importlib.util import find_spec

from .._errors import DaifuWarning
from .._private import check_private
from .._record import field
from .._runtime import RUNTIME, state_record
from .._version import __version__

# (the C modules themselves: ``hashlib`` loads OpenSSL and ``pickle`` a dozen
# modules, milliseconds of every start that loads its code from the cache)
try:
    from _blake2 import blake2b
except ImportError:  # pragma: no cover - a Python built without it
    from hashlib import blake2b
try:
    import _pickle as pickle
except ImportError:  # pragma: no cover
    import pickle  # type: ignore[no-redef]

MAGIC = b"daifu-code-cache 2\n"
#: the pickle protocol of entries (5: out-of-band buffers, Python 3.8+)
PROTOCOL = 5
#: entries not written for this long are removed when another is written
#: (entries of older daifu versions or vanished files would stay forever)
MAX_AGE_S = 30 * 24 * 3600


@state_record
class _Refusals:
    """The code cache's process state (``RUNTIME.parts``)."""

    #: directories found unusable (said once; not tried again)
    refused: set[str] = field(default_factory=set)


_state = RUNTIME.part(__name__, _Refusals())


class _Refused(Exception):
    pass


def default_directory() -> str:
    """``$XDG_CACHE_HOME/daifu`` or ``~/.cache/daifu``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "daifu")


def _stat_tree(h, root: str) -> None:
    """Name, size and mtime of every ``.py`` file under ``root``, in order."""
    found = []
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                if entry.name != "__pycache__":
                    stack.append(entry.path)
            elif entry.name.endswith(".py"):
                try:
                    st = entry.stat()
                except OSError:
                    continue
                found.append((entry.path[len(root):], st.st_size, st.st_mtime_ns))
    h.update(repr(sorted(found)).encode())


@functools.cache  # (once per process: daifu and bytecode do not change under it)
def fingerprint() -> bytes:
    """What makes entries of another daifu, Python or ``bytecode`` invalid."""
    h = blake2b(MAGIC, digest_size=32)
    h.update(__version__.encode())
    h.update(sys.version.encode())
    _stat_tree(h, os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
    spec = find_spec("bytecode")  # (found, not imported)
    if spec is not None and spec.origin:
        _stat_tree(h, os.path.dirname(os.path.realpath(spec.origin)))
    return h.digest()


def _code(data: bytes, consts: tuple) -> types.CodeType:
    return marshal.loads(data).replace(co_consts=consts)


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj):
        if type(obj) is types.CodeType:
            blank = obj.replace(co_consts=(None,) * len(obj.co_consts))
            return _code, (marshal.dumps(blank), obj.co_consts)
        return NotImplemented


#: what constants of code objects need besides pickle's own types
_BUILTINS = frozenset({"complex", "frozenset", "set", "slice", "range", "bytearray", "Ellipsis"})
#: the builtins the stubs call to suspend a tracer or profiler around daifu
_SYS = frozenset({"gettrace", "settrace", "getprofile", "setprofile"})


def _ours(obj) -> bool:
    module = getattr(obj, "__module__", None) or ""
    return isinstance(obj, (type, types.FunctionType)) and (
        module == "daifu" or module.startswith("daifu."))


class _Unpickler(pickle.Unpickler):
    """Resolves only classes and functions defined by daifu (never a dotted
    name: ``daifu.x`` + ``os.system`` would reach what a daifu module imported)
    and the builtins that code constants need."""

    def find_class(self, module: str, name: str):
        if "." not in name:
            if module == "daifu" or module.startswith("daifu."):
                obj = super().find_class(module, name)
                if _ours(obj):
                    return obj
            elif (module == "builtins" and name in _BUILTINS) or (
                    module == "sys" and name in _SYS) or (
                    module == "copyreg" and name == "_reconstructor"):
                return super().find_class(module, name)
        raise pickle.UnpicklingError(f"a daifu cache entry refers to {module}.{name}")


class CodeCache:
    """The cache in one directory (created 0700 if missing)."""

    def __init__(self, directory: str, write: bool = True, quiet: bool = False):
        self.directory = directory
        self.write = write
        self.quiet = quiet  # the implicit default: an unusable directory is no news
        self._checked = False  # the directory was found private (checked once)
        self._pruned = False  # old entries removed (once per process)

    def _usable(self) -> bool:
        if self._checked:
            return True
        if self.directory in _state.refused:
            return False
        if not self.write and not os.path.isdir(self.directory):
            return False  # reading only: nothing to read, and nothing to create
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            check_private(self.directory, "the daifu code cache", _Refused)
        except (OSError, _Refused) as exc:
            _state.refused.add(self.directory)
            if not self.quiet:
                warnings.warn(f"daifu: not using the code cache: {exc}", DaifuWarning,
                              stacklevel=4)
            return False
        self._checked = True
        return True

    def _path(self, filename: str, module: str | None, selection) -> str:
        h = blake2b(fingerprint(), digest_size=32)
        h.update(repr((filename, module, selection)).encode())
        return os.path.join(self.directory, h.hexdigest()[:40] + ".pickle")

    @staticmethod
    def _source_hash(source: str) -> bytes:
        return blake2b(source.encode("utf-8", "surrogatepass"), digest_size=32).digest()

    def load(self, source: str, filename: str, module: str | None, selection):
        """The cached ``(code, report)`` for this source, or ``None``."""
        if not self._usable():
            return None
        path = self._path(filename, module, selection)
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            return None
        try:
            with os.fdopen(fd, "rb") as fh:
                st = os.fstat(fh.fileno())
                if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or (
                        st.st_mode & 0o022):
                    return None
                data = fh.read()
            head = len(MAGIC) + 32
            if data[:len(MAGIC)] != MAGIC or data[len(MAGIC):head] != self._source_hash(source):
                return None
            code, report = _Unpickler(io.BytesIO(data[head:])).load()
        except Exception:  # a truncated or stale entry is a miss, never an error
            return None
        if type(code) is not types.CodeType or code.co_filename != filename:
            return None
        return code, report

    def store(self, source: str, filename: str, module: str | None, selection,
              code: types.CodeType, report) -> bool:
        """Write an entry; False (and nothing written) if that is not possible."""
        if not self.write or not self._usable():
            return False
        buf = io.BytesIO()
        buf.write(MAGIC)
        buf.write(self._source_hash(source))
        try:
            _Pickler(buf, protocol=PROTOCOL).dump((code, report))
            # an entry that would not load is never written (it would miss forever)
            _Unpickler(io.BytesIO(buf.getbuffer()[len(MAGIC) + 32:])).load()
        except Exception:  # something in the code daifu cannot store: no entry
            return False
        path = self._path(filename, module, selection)
        try:
            tmp = os.path.join(self.directory, f".tmp-{os.getpid()}-{os.urandom(8).hex()}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),
                         0o600)
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(buf.getvalue())
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError:
            return False
        self._prune()
        return True

    def _prune(self) -> None:
        if self._pruned:
            return
        self._pruned = True
        cutoff = time.time() - MAX_AGE_S
        try:
            with os.scandir(self.directory) as entries:
                for entry in entries:
                    if entry.name.endswith(".pickle") or entry.name.startswith(".tmp-"):
                        if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                            os.unlink(entry.path)
        except OSError:
            pass
