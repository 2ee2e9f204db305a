"""SIGTERM (a scheduler preempting the job): save the training state at a
consistent point, then end the way plain python ends on SIGTERM.

SLURM's time limit, a Kubernetes eviction or a spot instance taken back send
SIGTERM, wait (Kubernetes: 30 s), then kill.  Without a handler python dies
at once and every step since the last periodic checkpoint is lost.  The
runner installs this handler (unless ``--no-checkpoint``); a program that
installs its own SIGTERM handler replaces it, and daifu then does nothing.

On SIGTERM the handler finds, on the main thread's stack, the outermost
vaccinated frame that runs a loop (``train()``'s ``for epoch`` / ``for
step``) and waits for that frame to reach one of its loop headers -- the
current iteration has finished, nothing is half-updated -- through a line
tracer set on that frame alone (``sys.settrace`` with a global function that
traces no other frame).  There it saves the checkpoint (``_checkpoint.save``,
``"state": "iteration-complete"``), and re-sends SIGTERM with the default
disposition: the process is killed by SIGTERM (status 143 in a shell), as
without daifu.  If the frame returns first, it saves there.  The wait is
bounded by ``--grace S`` (default 25 s, under Kubernetes' 30): then a thread
saves where the program is (``"state": "mid-iteration"``) and ends it.  With
nothing to save (no torch, no module in reach, no loop on the stack) it ends
at once.

In a rank of a distributed job (an initialized process group of several
ranks) the ranks first agree, through the job's store, on the one header
where all of them save (``remote/_boundary``, handed in at ``install``):
each goes on training until its step count is the agreed one, saves its
own file, and rank 0 writes the job's manifest naming every rank's file
(``<rank 0's file>-manifest.json``); ``daifu.resume(manifest)`` takes this
rank's entry.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import types

from ..._record import field
from ..._runtime import RUNTIME, state_record
from ..._version import __version__
from ...cells import cells_of, original_code, read_locals
from .._events import CheckpointFailed, CheckpointNote, CheckpointSaved, ManifestSaved, emit
from ._resume import KEEPER, MANIFEST_FORMAT

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from typing import Any

#: seconds to wait for the loop header after SIGTERM
DEFAULT_GRACE_S = 25.0


@state_record
class _Preempt:
    """The SIGTERM handler's process state (``RUNTIME.parts``)."""

    grace: float = DEFAULT_GRACE_S
    #: a SIGTERM is being handled (the handler's second call does nothing)
    handling: bool = False
    #: held by the one save a SIGTERM makes
    done: threading.Lock = field(default_factory=threading.Lock)
    #: the process that installed the handler
    pid: int = -1
    #: the engine (its ``checkpoint_dir`` and ``checkpoints``), given at ``install``
    engine: Any = None
    #: () -> this rank's ``remote._boundary.Boundary``, or None outside a job of several ranks
    boundary: Any = None
    #: the fork hooks are registered with ``os`` (once per process)
    fork_hook: bool = False
    #: the watcher's end of the signal wakeup pipe (-1: none)
    wakeup_read: int = -1
    #: thread id -> was SIGTERM blocked in that thread before its fork?
    blocked_before: dict[int, bool] = field(default_factory=dict)


_state = RUNTIME.part(__name__, _Preempt())

#: what rank 0 leaves for the others to say where they saved, of the grace (s)
_MANIFEST_MARGIN_S = 3.0
#: how long rank 0 waits for every rank to say it holds sharded state at
#: the agreed step (``Boundary.shards``), at most
_SHARDS_WAIT_S = 5.0


def install(engine: Any, grace: float = DEFAULT_GRACE_S, boundary: Any = None) -> bool:
    """Handle SIGTERM (main thread only; not over a handler the program set):
    save into ``engine.checkpoint_dir``, and add the file to ``engine.checkpoints``.
    ``boundary``: () -> the rank's ``Boundary`` in a distributed job, or None."""
    _state.grace, _state.pid, _state.engine, _state.boundary = grace, os.getpid(), engine, boundary
    if threading.current_thread() is not threading.main_thread():
        return False
    try:
        if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
            return False
        signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError):
        return False
    if "RANK" in os.environ:  # (a rank of a launcher's job: torchrun's)
        _watch_for_a_stuck_main_thread()
    if not _state.fork_hook and hasattr(os, "register_at_fork"):
        os.register_at_fork(before=_block_for_fork, after_in_parent=_unblock_after_fork,
                            after_in_child=_default_in_child)
        _state.fork_hook = True
    return True


#: how long the watcher gives the main thread to run the SIGTERM handler
#: before it takes the main thread for stuck in C (s; at most the grace)
STUCK_S = 5.0


def _watch_for_a_stuck_main_thread() -> None:
    """A rank's main thread may be in C when SIGTERM comes -- in a collective
    whose peer is gone or hung -- where the Python handler cannot run until
    the call returns, and torchrun's agent kills it 30 s later with nothing
    saved.  So Python's own C signal handler is asked to write each signal's
    number to a pipe (``signal.set_wakeup_fd``), which a daemon thread reads:
    a SIGTERM that the main thread has not begun to handle ``STUCK_S`` later
    is saved from that thread (``"mid-iteration"``), and the rank dies of
    SIGTERM.  Not over a wakeup fd the program set (asyncio's)."""
    if _state.wakeup_read != -1:
        return
    try:
        r, w = os.pipe()
        os.set_blocking(w, False)
        previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except (ValueError, OSError):
        return
    if previous != -1:  # (the program's: keep it, and do without)
        signal.set_wakeup_fd(previous)
        os.close(r)
        os.close(w)
        return
    _state.wakeup_read = r
    threading.Thread(target=_watch, args=(r,), name="daifu-sigterm", daemon=True).start()


def _watch(r: int) -> None:
    while True:
        try:
            data = os.read(r, 256)
        except OSError:
            return
        if not data:
            return
        if signal.SIGTERM not in data or signal.getsignal(signal.SIGTERM) is not _on_sigterm:
            continue
        until = time.monotonic() + min(STUCK_S, _state.grace)
        while not _state.handling and time.monotonic() < until:
            time.sleep(0.05)
        if not _state.handling:
            _stuck()
            return


def _stuck() -> None:
    """SIGTERM came and the main thread never got back to Python to handle
    it: save what it holds as it is, from this thread, and end."""
    _state.handling = True  # (the handler, should the main thread get back: nothing more)
    if not _state.done.acquire(blocking=False):
        return
    main = sys._current_frames().get(threading.main_thread().ident or 0)
    if "torch" in sys.modules and os.getpid() == _state.pid and main is not None:
        _save(main, "mid-iteration")
    _die()


def _block_for_fork() -> None:
    """Before a fork: hold SIGTERM back in the forking thread (the child
    inherits the mask) until the child has the default action back."""
    try:
        if signal.getsignal(signal.SIGTERM) is _on_sigterm:
            before = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
            _state.blocked_before[threading.get_ident()] = signal.SIGTERM in before
    except (ValueError, OSError, AttributeError):
        pass


def _unblock_after_fork() -> None:
    """Let SIGTERM in again (one that came meanwhile is delivered now)."""
    was = _state.blocked_before.pop(threading.get_ident(), None)
    if was is False:
        try:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM])
        except (ValueError, OSError, AttributeError):
            pass


def _default_in_child() -> None:
    """A forked child (a DataLoader or ``multiprocessing.Pool`` worker) gets
    SIGTERM's default action back, as without daifu: the kernel ends it.

    A Python handler runs only when the main thread next executes bytecode,
    or when a blocking call it is in fails with EINTR; a SIGTERM that comes
    just before the call blocks is then never seen.  ``Pool.terminate()``
    sends SIGTERM to workers that may be about to block on the task queue's
    lock: one stayed blocked there for good, and the pool's ``join`` with it
    (toolz's own test suite under daifu, CPython 3.13).  SIGTERM is blocked
    from just before the fork until the default action is back: one sent to
    the child meanwhile waits, then ends it."""
    try:
        if signal.getsignal(signal.SIGTERM) is _on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if _state.wakeup_read != -1:  # (the parent's pipe, read by the parent's watcher)
            signal.set_wakeup_fd(-1)
    except (ValueError, OSError):  # (not the main thread: cannot happen after fork)
        pass
    _unblock_after_fork()


def _die() -> None:
    """End as python ends on SIGTERM: killed by the signal."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    try:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        else:  # (the grace timer: Python sets handlers on the main thread only)
            import ctypes  # lazy: 3.9 ms

            ctypes.CDLL(None).signal(signal.SIGTERM, 0)  # SIG_DFL
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM])
        os.kill(os.getpid(), signal.SIGTERM)
    finally:
        os._exit(128 + signal.SIGTERM)  # (not reached: the default action kills)


def _loop_frame(frame: types.FrameType | None) -> tuple[types.FrameType, set[int]] | None:
    """The outermost vaccinated frame running a loop, and its loop-header lines."""

    found = None
    while frame is not None:
        info = cells_of(frame.f_code)
        if info is not None:
            headers = {c.lineno for c in info.cells if c.role == "loop-header" and c.lineno}
            if headers:
                found = (frame, headers)
        frame = frame.f_back
    return found


def _training_loop_frame(frame: types.FrameType | None) -> tuple[types.FrameType, set[int]] | None:
    """The frame running the training-step loop (the loop around the
    program's ``optimizer.step()`` call: ``engine/persist/_resume.py``), of any kind,
    vaccinated or not, and the lines that start its next iteration: a
    gradient-accumulation loop inside it is not it."""

    try:
        target = KEEPER.loop_target()
    except Exception:
        return None
    if target is None:
        return None
    code, lines = target
    while frame is not None:
        if original_code(frame.f_code) is code:
            return frame, lines
        frame = frame.f_back
    return None


def _save(frame: types.FrameType | None, state: str, reason: str = "SIGTERM",
          shards: Any = None) -> str | None:
    """Save; the file's path, or None (nothing to save, or it failed: said).
    ``shards``: see ``_checkpoint.save``."""
    from ._checkpoint import CheckpointError, save  # lazy: 14.3 ms

    where = (f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "?")

    def say(message: str) -> None:
        emit(CheckpointNote(where=where, message=message))

    try:
        done = save(frame, where, None, _state.engine.checkpoint_dir, read_locals=read_locals,
                    say=say, extra={"reason": reason, "state": state}, point=KEEPER,
                    shards=shards)
    except CheckpointError as exc:
        emit(CheckpointFailed(where=where, reason=str(exc)))
        return None
    except Exception as exc:  # never keep a preempted job alive
        emit(CheckpointFailed(where=where, reason=f"internal error: {type(exc).__name__}: {exc}"))
        return None
    if done is None:
        return None
    _state.engine.checkpoints.append(done["path"])
    emit(CheckpointSaved(where=where, path=done["path"], bytes=done["bytes"],
                         seconds=round(done["seconds"], 3), objects=done["objects"],
                         position={**done["position"], "state": state},
                         frameworks=done["frameworks"], sharded=done["sharded"]))
    return str(done["path"])


def _save_in_job(frame: types.FrameType | None, state: str, boundary: Any, step: int,
                 deadline: float, reason: str = "SIGTERM") -> str | None:
    """Save this rank's state and say where in the job's store; once the
    ranks agreed where to save, rank 0 then writes the job's manifest of
    every rank's file.  Without that agreement (the loop's frame ended
    first, a peer failed and never posted, the grace ran out) each file
    stands alone and nobody waits for the others.  This rank's file, or None.
    At the agreed header, sharded state goes into one DCP directory for
    the job (``_sharded``)."""
    at_target = state == "iteration-complete" and boundary.target is not None \
        and step == boundary.target
    path = _save(frame, state, reason,
                 _shards_at(boundary, step, deadline) if at_target else None)
    try:
        boundary.saved(path, step, state)
        if boundary.rank != 0 or boundary.target is None:
            return path
        ranks = boundary.saved_by(deadline - time.monotonic() - _MANIFEST_MARGIN_S)
    except Exception as exc:  # (the store gone: the files stand alone)
        emit(CheckpointFailed(where="manifest", reason=f"the job's store: {exc}"))
        return path
    if path is not None:
        _write_manifest(path, boundary, step, ranks, reason)
    return path


def _shards_at(boundary: Any, step: int, deadline: float) -> Any:
    """``_checkpoint.save``'s ``shards`` at the header every rank saves at:
    the ranks agree through the store (``Boundary.shards``) on one DCP
    directory, rank 0's, and write into it together."""
    from ._sharded import ShardError, write  # lazy: 0.3 ms

    def shards(plan: Any, path: str) -> dict[str, Any] | None:
        # (rank 0's file's name, ``.dcp``: beside it, in its private directory)
        directory = os.path.splitext(path)[0] + ".dcp" \
            if boundary.rank == 0 and plan is not None else None
        left = deadline - time.monotonic() - _MANIFEST_MARGIN_S
        wait = min(_SHARDS_WAIT_S, left / 4) if boundary.rank == 0 else left / 2
        try:
            chosen = boundary.shards(step, plan is not None, directory, wait)
        except Exception as exc:  # (the store gone: each file holds its own)
            emit(CheckpointNote(where="sharded state", message=f"the job's store: {exc}"))
            return None
        if chosen is None or plan is None:
            return None
        try:
            return write(plan, chosen)
        except ShardError as exc:
            emit(CheckpointNote(where="sharded state", message=f"{exc}; this rank's file "
                                "holds its shards instead"))
            return None

    return shards


def _write_manifest(path0: str, boundary: Any, step: int, ranks: dict[int, dict | None],
                    reason: str = "SIGTERM") -> None:
    """``<rank 0's file>-manifest.json``: every rank's file, for ``daifu.resume``."""
    import json  # lazy: 3.0 ms

    manifest = {
        "daifu": __version__, "format": MANIFEST_FORMAT, "reason": reason,
        "job": boundary.job, "world_size": boundary.world, "step": step,
        "time": time.time(),
        "ranks": {str(r): (v or {}).get("path") for r, v in sorted(ranks.items())},
        "states": {str(r): (v or {}).get("state", "not saved") for r, v in sorted(ranks.items())},
        "steps": {str(r): (v or {}).get("step") for r, v in sorted(ranks.items())},
    }
    #: every rank saved, at the same step, at the loop's header (a hung job:
    #: where each rank stood, its resume point that step's): a resume is exact
    states = ("iteration-complete",) if reason == "SIGTERM" else ("iteration-complete",
                                                                 "mid-iteration")
    manifest["consistent"] = all(
        v and v.get("path") and v.get("step") == step and v.get("state") in states
        for v in ranks.values())
    target = os.path.splitext(path0)[0] + "-manifest.json"
    tmp = f"{target}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),
                     0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(manifest, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except OSError as exc:
        emit(CheckpointFailed(where="manifest", reason=f"{target}: {exc}"))
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return
    missing = sorted(r for r, v in ranks.items() if not v or not v.get("path"))
    emit(ManifestSaved(path=target, world_size=boundary.world, step=step,
                       ranks=manifest["ranks"], missing=missing,
                       consistent=bool(manifest["consistent"])))


def save_hung(engine: Any, boundary: Any, deadline: float) -> str:
    """A hung job (``engine/_watchdog``): save what this rank's main thread
    holds, from the calling thread, "mid-iteration" -- its resume point is
    the last optimizer step's, the same in every rank of a job stuck in one
    iteration -- and say where in the job's store; rank 0 writes the job's
    manifest.  Every rank then waits for rank 0 to have written it (a rank
    that ended sooner would wake its peers' collectives with an error).
    What it did, in a few words: "saved", "not saved" or "busy" (SIGTERM is
    being handled: that path saves)."""
    if not _state.done.acquire(blocking=False):
        return "busy"
    _state.handling = True  # (a SIGTERM now: the watchdog ends the job)
    if _state.engine is None:
        _state.engine = engine
    main = sys._current_frames().get(threading.main_thread().ident or 0)
    step = KEEPER.steps
    boundary.target = step
    path = None
    if "torch" in sys.modules and main is not None:
        path = _save_in_job(main, "mid-iteration", boundary, step, deadline, reason="hang")
    else:
        boundary.saved(None, step, "not saved")
    try:
        if boundary.rank == 0:
            boundary.finished()
        else:
            boundary.wait_finished(deadline - time.monotonic())
    except Exception:
        pass
    return "saved" if path is not None else "not saved"


def _on_sigterm(signum: int, frame: types.FrameType | None) -> None:
    if _state.handling:
        return  # (a second SIGTERM while waiting: the grace timer ends it)
    _state.handling = True
    target = None
    if "torch" in sys.modules and os.getpid() == _state.pid:
        target = _training_loop_frame(frame) or _loop_frame(frame)
    if target is None:
        _die()
        return
    loop, headers = target
    main = threading.get_ident()
    deadline = time.monotonic() + _state.grace
    boundary = None
    if _state.boundary is not None:
        try:
            boundary = _state.boundary()
        except Exception:
            boundary = None

    def finish(at: types.FrameType | None, state: str) -> None:
        if not _state.done.acquire(blocking=False):
            return  # (the other path is saving)
        if boundary is None:
            _save(at, state)
        else:
            _save_in_job(at, state, boundary, KEEPER.steps, deadline)
        _die()

    def on_line(f: types.FrameType, event: str, arg: Any):
        if event == "line" and f.f_lineno in headers and boundary is not None \
                and not _at_target(boundary):
            return on_line  # (not yet the header every rank saves at)
        if event == "return" or (event == "line" and f.f_lineno in headers):
            sys.settrace(None)
            f.f_trace = None
            finish(f, "iteration-complete")
            return None
        return on_line

    def grace_over() -> None:
        frames = sys._current_frames()
        finish(frames.get(main), "mid-iteration")

    timer = threading.Timer(_state.grace, grace_over)
    timer.daemon = True
    timer.start()
    loop.f_trace_lines = True
    loop.f_trace = on_line
    sys.settrace(lambda f, e, a: None)  # (line events for ``loop`` only)


def _at_target(boundary: Any) -> bool:
    """At a header of the training-step loop in a distributed job: is this
    the header every rank saves at?  Posts this rank's step count first.  A
    store that fails says yes: each rank then saves where it is, alone."""
    step = KEEPER.steps
    try:
        boundary.post(step)
        target = boundary.decide(step)
    except Exception as exc:
        emit(CheckpointFailed(where="agreement", reason=f"the job's store: {exc}; saving "
                              "this rank where it is"))
        boundary.target = None
        return True
    return target is not None and step >= target
