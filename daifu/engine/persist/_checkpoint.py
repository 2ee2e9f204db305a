"""The emergency checkpoint: the training state, saved where a crash that
nobody fixes is about to end the job (just-in-time checkpointing).

daifu holds the crashed frames, alive, when it gives up.  From them and from
``__main__``'s globals it collects every ``torch.nn.Module``, optimizer, LR
scheduler and ``GradScaler`` (each object once, named where the program
holds it: ``model``, ``opt``, ``trainer.model``), the RNG states (python,
numpy when imported, torch, CUDA when initialised) and the loop position
(the int and float variables of the frames whose code has a loop), and
writes one ``torch.load``-able dict::

    {"modules": {name: state_dict}, "optimizers": {...}, "schedulers": {...},
     "scalers": {...}, "rng": {"python": ..., "numpy": ..., "torch": ...,
     "cuda": [...]}, "position": {name: value}, "where": ..., "exception": ...,
     "time": ..., "daifu": version}

atomically (a temporary file in the same directory, then ``rename``), mode
0600, into ``--checkpoint-dir`` (default ``~/.local/state/daifu/checkpoints``,
private).  Nothing here runs unless a crash is given up; torch is never
imported by daifu (no torch in ``sys.modules``: nothing to save).  A program
with no module or optimizer in reach gets no file: there is no training
state to lose.
"""

from __future__ import annotations

import errno
import os
import sys
import time
import types
from typing import Any

from ..._private import check_private
from ..._version import __version__
from ...cells import original_code
from .._job import distributed
from ._sharded import MARK, plan

#: state above this size is announced with an estimate before the save
LARGE_BYTES = 1 << 30
#: what the estimate assumes (a local disk)
WRITE_BYTES_PER_S = 500e6


class CheckpointError(Exception):
    """The checkpoint could not be written (the message says why, in one line)."""


#: the checkpoint format this daifu writes (``daifu.resume`` reads it and
#: every older one; a newer one is refused with a clear message)
FORMAT = 1


def default_directory() -> str:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                            "state")
    return os.path.join(base, "daifu", "checkpoints")


def _kinds(torch: Any) -> list[tuple[str, tuple[type, ...]]]:
    optim = torch.optim
    schedulers = tuple(t for t in (getattr(optim.lr_scheduler, "LRScheduler", None),
                                   getattr(optim.lr_scheduler, "_LRScheduler", None),
                                   getattr(optim.lr_scheduler, "ReduceLROnPlateau", None))
                       if isinstance(t, type))
    scalers = tuple(t for t in (getattr(getattr(torch, "amp", None), "GradScaler", None),
                                getattr(getattr(getattr(torch, "cuda", None), "amp", None),
                                        "GradScaler", None))
                    if isinstance(t, type))
    return [("modules", (torch.nn.Module,)), ("optimizers", (optim.Optimizer,)),
            ("schedulers", schedulers), ("scalers", scalers)]


def _kind_of(value: Any, kinds) -> str | None:
    for kind, types_ in kinds:
        if types_ and isinstance(value, types_):
            return kind
    return None


def _framework_of(value: Any) -> str | None:
    """"lightning" for a Lightning ``Trainer``, "transformers" for an HF one."""
    cls = type(value)
    module = getattr(cls, "__module__", "") or ""
    if cls.__name__ == "Trainer" and module.startswith(("lightning.pytorch", "pytorch_lightning")):
        return "lightning" if hasattr(value, "save_checkpoint") else None
    hf = sys.modules.get("transformers.trainer")
    hf_trainer = getattr(hf, "Trainer", None) if hf is not None else None
    if isinstance(hf_trainer, type) and isinstance(value, hf_trainer):
        return "transformers" if hasattr(value, "_save_checkpoint") else None
    return None


def _trainer_state(framework: str, trainer: Any) -> list[tuple[str, Any]]:
    """What a framework's trainer holds deeper than one attribute down."""
    out: list[tuple[str, Any]] = []
    try:
        if framework == "lightning":
            out.append(("lightning_module", trainer.lightning_module))
            out += [(f"optimizers[{i}]", o) for i, o in enumerate(trainer.optimizers or ())]
            out += [(f"lr_scheduler_configs[{i}].scheduler", c.scheduler)
                    for i, c in enumerate(trainer.lr_scheduler_configs or ())]
        else:
            out += [("model", trainer.model), ("optimizer", trainer.optimizer),
                    ("lr_scheduler", trainer.lr_scheduler)]
    except Exception:
        pass
    return [(attr, value) for attr, value in out if value is not None]


def _framework_checkpoints(trainers: dict[str, Any], path: str, say=None,
                           rng: dict[str, Any] | None = None) -> dict[str, str]:
    """Ask a Lightning or HF ``Trainer`` found on the stack to save its own
    checkpoint too, so that ``fit(ckpt_path=...)`` / ``train(resume_from_checkpoint=
    ...)`` resume from the crash point; their paths, by framework.  ``rng``:
    the RNG states at the start of the iteration to resume (the resume
    point's), in force while they save -- the HF Trainer saves the RNG it
    finds, and the failed step's forward has drawn from it already."""
    if not trainers:
        return {}
    torch = sys.modules["torch"]
    now = _rng(torch) if rng else None
    try:
        if rng:
            restore_rng({"rng": rng})
        return _ask_trainers(trainers, path, say)
    finally:
        if now is not None:
            restore_rng({"rng": now})


def _ask_trainers(trainers: dict[str, Any], path: str, say=None) -> dict[str, str]:
    out: dict[str, str] = {}
    for framework, trainer in trainers.items():
        try:
            if framework == "lightning":
                target = os.path.splitext(path)[0] + "-lightning.ckpt"
                trainer.save_checkpoint(target)
                os.chmod(target, 0o600)  # (like ours: it holds the model)
            else:  # the HF Trainer's own periodic save: output_dir/checkpoint-<step>
                trainer._save_checkpoint(trainer.model, trial=None)
                target = os.path.join(trainer.args.output_dir,
                                      f"checkpoint-{trainer.state.global_step}")
            out[framework] = os.path.abspath(target)
        except Exception as exc:  # our own file is written: report and go on
            if say is not None:
                say(f"the {framework} Trainer's own checkpoint failed: "
                    f"{type(exc).__name__}: {exc}")
    return out


def _frames(frame: types.FrameType | None) -> list[types.FrameType]:
    out = []
    while frame is not None:
        out.append(frame)
        frame = frame.f_back
    return out


def _has_loop(code: types.CodeType) -> bool:
    # (the original code: a vaccinated one has jumps back of its own; a
    # ``while`` loop has no loop-header cell)
    raw = original_code(code).co_code
    return any(op in _LOOP_OPS for op in raw[::2])


_LOOP_OPS = frozenset(op for name, op in __import__("dis").opmap.items()
                      if name == "FOR_ITER" or "BACKWARD" in name)


def collect(frame: types.FrameType | None, read_locals=None) -> dict[str, Any] | None:
    """What to save, found from ``frame`` outwards and in ``__main__``; None
    when torch is not imported or no module or optimizer is in reach."""
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "nn"):
        return None
    kinds = _kinds(torch)
    found: dict[str, dict[str, Any]] = {k: {} for k, _ in kinds}
    seen: set[int] = set()

    trainers: dict[str, Any] = {}

    def take(name: str, value: Any, depth: int) -> None:
        framework = _framework_of(value)
        if framework is not None and framework not in trainers:
            trainers[framework] = value
            for attr, inner in _trainer_state(framework, value):
                take(f"{name}.{attr}", inner, 1)
        inner = getattr(value, "_optimizer", None)  # Lightning's wrapper of the optimizer
        if inner is not None and _kind_of(inner, kinds) == "optimizers":
            value = inner
        kind = _kind_of(value, kinds)
        if kind is not None:
            if id(value) not in seen:
                seen.add(id(value))
                if name in found[kind]:
                    name = f"{name}#{len(found[kind])}"
                found[kind][name] = value
            return
        # one level into other objects (a trainer holding its model and optimizer)
        if depth == 0 and not isinstance(value, (type, types.ModuleType, types.FunctionType)):
            try:
                attrs = vars(value)
            except TypeError:
                return
            for attr, inner in list(attrs.items())[:200]:
                if not attr.startswith("__"):
                    take(f"{name}.{attr}", inner, 1)

    frames = _frames(frame)
    scopes: list[tuple[types.FrameType | None, dict]] = []
    for f in frames:
        try:
            scopes.append((f, read_locals(f) if read_locals else dict(f.f_locals)))
        except Exception:
            continue
    main = sys.modules.get("__main__")
    if main is not None:
        scopes.append((None, dict(vars(main))))
    # the names the program gives its objects first: __main__'s globals, then
    # the frames from the outermost in; ``self`` of a method last
    for _, names in reversed(scopes):
        for name, value in names.items():
            if not name.startswith("__") and name != "self":
                take(name, value, 0)
    for scope_frame, names in scopes:
        if "self" in names and scope_frame is not None:
            take(type(names["self"]).__name__, names["self"], 0)
    if not found["modules"] and not found["optimizers"]:
        return None
    loaders: dict[str, Any] = {}
    data = getattr(getattr(torch, "utils", None), "data", None)
    loader_cls = getattr(data, "DataLoader", None)
    if isinstance(loader_cls, type):
        for _, names in reversed(scopes):
            for name, value in names.items():
                if isinstance(value, loader_cls) and not name.startswith("__") \
                        and all(value is not v for v in loaders.values()):
                    loaders[name if name not in loaders else f"{name}#{len(loaders)}"] = value
    position: dict[str, Any] = {}
    for f, names in reversed(scopes):  # outermost loop first
        if f is None or not _has_loop(f.f_code):
            continue
        for name, value in names.items():
            if type(value) in (int, float) and not name.startswith("_"):
                key = name if position.get(name, value) == value else \
                    f"{f.f_code.co_qualname}.{name}"
                position[key] = value
    return {"objects": found, "position": position, "trainers": trainers, "loaders": loaders}


def _rng(torch: Any) -> dict[str, Any]:
    import random  # lazy: 1.1 ms

    out: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        try:
            out["numpy"] = numpy.random.get_state()
        except Exception:
            pass
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is not None and cuda.is_available() and cuda.is_initialized():
            out["cuda"] = cuda.get_rng_state_all()
    except Exception:
        pass
    return out


def _nbytes(state: Any) -> int:
    torch = sys.modules["torch"]
    if isinstance(state, torch.Tensor):
        return state.element_size() * state.nelement()
    if isinstance(state, dict):
        return sum(_nbytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(_nbytes(v) for v in state)
    return 0


def _state(found: dict[str, Any], point: Any, say: Any,
           sharded: dict[str, Any] | None = None) -> dict[str, Any]:
    """Each object's ``state_dict()`` (or, for one whose state ``sharded``
    says DCP wrote, a mark), and the resume point's RNG, loader positions,
    loop and generators (as they are now without one)."""
    torch = sys.modules["torch"]
    state: dict[str, Any] = {}
    for kind, named in found["objects"].items():
        state[kind] = {}
        in_dcp = (sharded or {}).get(kind) or ()
        for name, obj in named.items():
            if name in in_dcp:
                state[kind][name] = {MARK: True}
                continue
            try:
                state[kind][name] = obj.state_dict()
            except Exception as exc:  # one object that cannot say its state
                state[kind][name] = None
                if say is not None:
                    say(f"{kind} {name}: state_dict() failed: {type(exc).__name__}: {exc}")
    # the RNG and the loaders as they were at the start of the iteration to
    # resume (``_resume``: the last optimizer step or loader header since);
    # as they are now where no step was taken yet
    kept = point.rng() if point is not None else None
    state["rng"] = kept if kept is not None else _rng(torch)
    state["rng_at"] = point.at if kept is not None else "save"
    state["loaders"] = {name: (point.loader_state(loader) if point is not None else None)
                        or {"batches": None} for name, loader in found["loaders"].items()}
    state["loop"] = point.loop() if point is not None else None
    # the program's own generators (``env._np_random``, ``dataset.rng``)
    state["generators"] = point.generators() if kept is not None else {}
    if sharded is not None:
        state["sharded"] = sharded
    return state


def save(frame: types.FrameType | None, where: str, exception: BaseException | None,
         directory: str | None = None, path: str | None = None, read_locals=None,
         say=None, extra: dict[str, Any] | None = None, point: Any = None,
         shards: Any = None) -> dict[str, Any] | None:
    """Collect and write the checkpoint; returns ``{"path", "bytes", "seconds",
    "objects", "position", "frameworks", "sharded"}``, or None when there is
    nothing to save.  Raises ``CheckpointError`` (nothing written) when it
    cannot be written.  ``point``: the resume point (``_resume.KEEPER``), or
    None for the RNG as it is now and no loader positions.  ``shards``: in
    a preempted job, called with the sharded objects (``_sharded.plan``, or
    None) and this file's path, to write them with DCP; returns the entry
    naming what it wrote, or None (they go into this file)."""
    found = collect(frame, read_locals)
    if found is None:
        return None

    objects = found["objects"]
    if path is None:
        directory = directory or default_directory()
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            if directory == default_directory():
                check_private(directory, "emergency checkpoints", CheckpointError)
        except OSError as exc:
            raise CheckpointError(f"cannot create {directory}: {exc.strerror or exc}") from None
        path = os.path.join(directory, _file_name())
    path = os.path.abspath(path)
    sharded = None
    if shards is not None:  # (after the directory: private before DCP writes there)
        sharded = shards(plan(objects), path)
    state = _state(found, point, say, sharded)
    state["format"] = FORMAT
    state["position"] = found["position"]
    state["where"] = where
    state["exception"] = (f"{type(exception).__qualname__}: {exception}"
                          if exception is not None else None)
    state["time"] = time.time()
    state["daifu"] = __version__
    state.update(extra or {})
    size = _nbytes(state)
    if size > LARGE_BYTES and say is not None:
        say(f"saving {size / (1 << 30):.1f} GiB of state: about "
            f"{size / WRITE_BYTES_PER_S:.0f} s")
    _remove_dead_temporaries(os.path.dirname(path))
    # a Lightning or HF Trainer's own checkpoint first: the file names it
    # (``trainer.fit(ckpt_path=ck["frameworks"]["lightning"])``)
    frameworks = _framework_checkpoints(found["trainers"], path, say,
                                        state["rng"] if state["rng_at"] != "save" else None)
    state["frameworks"] = frameworks
    started = time.perf_counter()
    _write(state, path, size)
    names = {kind: sorted(named) for kind, named in objects.items() if named}
    seconds = time.perf_counter() - started
    return {"path": path, "bytes": os.path.getsize(path), "seconds": seconds,
            "objects": names, "position": found["position"], "frameworks": frameworks,
            "sharded": (sharded or {}).get("dir", "")}


def _write(state: dict[str, Any], path: str, size: int) -> None:
    """``torch.save`` into a private temporary file, then renamed to
    ``path``: never a partial file under the final name.  Raises
    ``CheckpointError`` (nothing written)."""
    torch = sys.modules["torch"]
    # (a unique name: containers that share the directory have pids alike)
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.urandom(6).hex()}"
                                              f"{_TMP}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),
                     0o600)
        try:
            _hold(fd)  # (a save killed half-way leaves a file nobody holds: removed next time)
            with os.fdopen(fd, "wb") as fh:
                torch.save(state, fh)
                fh.flush()
                os.fsync(fh.fileno())
                os.replace(tmp, path)  # (still held: nobody takes it for a dead save's)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if _disk_full(exc, os.path.dirname(path), size):
            reason = os.strerror(errno.ENOSPC)
        raise CheckpointError(f"cannot write the checkpoint {path}: {reason} "
                              "(nothing was written)") from None
    except Exception as exc:  # torch.save refused something, or its writer failed
        reason = f"{type(exc).__name__}: {exc}"
        if _disk_full(exc, os.path.dirname(path), size):
            reason = f"{os.strerror(errno.ENOSPC)} ({reason.splitlines()[0][:200]})"
        raise CheckpointError(f"cannot write the checkpoint {path}: {reason} "
                              "(nothing was written)") from None


#: the end of a temporary checkpoint file's name
_TMP = ".daifu.tmp"


def _file_name() -> str:
    """``<script>-<time>[-rank<R>]-<host>-<pid>-<random>.pt``: unique across
    the ranks of a job, the machines and the containers that share a
    directory (a container's pids repeat another's: pid 1 in each)."""
    import socket  # lazy: 3.2 ms

    main = sys.modules.get("__main__")
    stem = os.path.splitext(os.path.basename(getattr(main, "__file__", None) or "python"))[0]
    rank = distributed().get("rank")
    host = "".join(c if c.isalnum() or c in "-_." else "_" for c in socket.gethostname())
    return (f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"
            + (f"-rank{rank}" if rank is not None else "")
            + f"-{host or 'host'}-{os.getpid()}-{os.urandom(3).hex()}.pt")


def _hold(fd: int) -> None:
    """Lock the temporary file being written (released however the process
    ends: ``_remove_dead_temporaries`` tells a live save from a dead one)."""
    try:
        import fcntl  # lazy: 0.2 ms

        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except (ImportError, OSError):
        pass


def _remove_dead_temporaries(directory: str) -> None:
    """Remove the temporary files of saves that were killed half-way (SIGKILL,
    a node lost) in ``directory``: this user's, not held by a live save."""
    try:
        import fcntl  # lazy: 0.2 ms
    except ImportError:
        return
    try:
        names = [n for n in os.listdir(directory) if n.startswith(".") and n.endswith(_TMP)]
    except OSError:
        return
    for name in names:
        path = os.path.join(directory, name)
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if os.fstat(fd).st_uid != os.getuid():
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # a save in progress (this job's other rank, another job)
            os.unlink(path)
        except OSError:
            pass
        finally:
            os.close(fd)


def _disk_full(exc: BaseException, directory: str, size: int) -> bool:
    """Did the write fail for want of space?  The errno where there is one
    (torch's writer raises a RuntimeError "file write failed" without it),
    else the space left on the file system."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        seen = seen.__cause__ or seen.__context__
    if isinstance(exc, OSError) and exc.errno is not None:
        return False
    try:
        st = os.statvfs(directory)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < max(size, 1 << 20)


def load_checkpoint(path: str, map_location: Any = None) -> dict[str, Any]:
    """Load an emergency checkpoint written by daifu (``torch.load``; the
    file holds RNG states and numpy arrays besides tensors, so it is loaded
    with ``weights_only=False``: load only files you or daifu wrote)."""
    import torch  # lazy: 1.4 s

    return torch.load(path, map_location=map_location, weights_only=False)


def restore_rng(checkpoint: dict[str, Any]) -> None:
    """Set the RNG states a checkpoint saved (python, numpy, torch, CUDA)."""
    import random  # lazy: 1.1 ms

    import torch  # lazy: 1.4 s

    rng = checkpoint.get("rng") or {}
    if "python" in rng:
        random.setstate(rng["python"])
    if "numpy" in rng:
        import numpy  # lazy: 98.1 ms

        numpy.random.set_state(rng["numpy"])
    if "torch" in rng:
        torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
