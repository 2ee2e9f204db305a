"""A distributed job that hangs, found by the job itself: every rank watches
its own progress, rank 0 judges the job's, names the rank that is behind
and its line, and the ranks save before the process group's timeout.

Each rank of a torchrun job runs a daemon thread (``daifu-watchdog``),
started when its process group is made.  Nothing of it is on the training
loop's path: every ``TICK_S`` it reads what already exists --

* the optimizer steps taken (``KEEPER.steps``, counted by torch's step hook
  for the resume point);
* the main thread's CPU time (its own clock, ``pthread_getcpuclockid``) and
  the bytes it read and wrote (``/proc/self/task/TID/io``): a main thread
  that computes, evaluates, loads data or writes a checkpoint *moves*; one
  that sleeps, waits for a lock or waits in a gloo collective does not;
* where the main thread is (``sys._current_frames``)

-- and posts them, sealed, in the job's store (``Beat``).  Rank 0's thread
(rank 1's when rank 0 stops posting) judges them (``Judge``): the job hangs
when no rank took a step and no rank moved for the threshold -- ``--hang-after
S``, or by default 3 x the slowest step seen (at least ``MIN_HANG_S``; before
every rank took its second step, ``FIRST_HANG_S``: start-up, compilation and
a slow first step are not hangs), never more than ``MAX_HANG_S``.  A rank that
stopped posting (its interpreter held in C) counts as not moving.  A rank that
waits on a crash holds the judgement (its peers wait for a fix).

On a hang, rank 0 runs the doctor (``stacks --job``: every rank's stacks and
last collectives), emits one ``hang.detected`` naming the rank that is behind,
its line and the collective the others wait in, prints it, runs ``--notify``,
then -- by default, or after ``--wait S`` without progress -- orders every
rank to save: each saves from its watchdog thread what its main thread
holds (``persist/_preempt.save_hung``), rank 0 writes the job's manifest, and
every rank ends with status ``HANG_EXIT``.  ``torchrun --max-restarts N``
then relaunches the job, which resumes with ``daifu.resume(manifest)``.
``--on-hang report`` only reports.

Stragglers: each rank also samples whether its main thread is in its own
code or in the collective path (``torch.distributed``, autograd's backward,
DDP); while every rank steps at a steady pace, a rank whose own time per
step is twice the others' (and 50 ms more) is named in one ``straggler``
event.  Nothing is stopped for it.
"""

from __future__ import annotations

import collections
import os
import socket
import sys
import threading
import time

from .._runtime import RUNTIME, state_record
from ._crash import _installed, is_plumbing
from ._events import (
    HangDetected,
    InternalError,
    NotifyFailed,
    NotifySent,
    StragglerSeen,
    emit,
)
from ._job import job_file_info

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from typing import Any

#: how often each rank reads its progress and posts it (s)
TICK_S = 0.5
#: the slowest step seen, times this, is the default threshold
STEP_FACTOR = 3.0
#: the default threshold is never below this (s): a loaded machine's jitter
MIN_HANG_S = 5.0
#: ... nor above this (s): far below gloo's (30 min) and NCCL's (10 min) timeouts
MAX_HANG_S = 300.0
#: the threshold before every rank took its second step (s)
FIRST_HANG_S = 300.0
#: a main thread that used this share of a tick's time on its CPU moved
BUSY_SHARE = 0.2
#: how a rank of a job that hung ends (as ``timeout(1)`` does)
HANG_EXIT = 124
#: the straggler check: a window of this many samples per rank (10 s)
STRAGGLER_SAMPLES = 20
#: ... a rank whose own time per step is this many times the others' median
STRAGGLER_RATIO = 2.0
#: ... and longer by at least this (s)
STRAGGLER_MIN_S = 0.05
#: how long every rank may take to save, once ordered (s)
SAVE_S = 60.0
#: ... when a rank stopped answering (it will not save)
SILENT_SAVE_S = 10.0

#: functions that write checkpoints (torch, safetensors, Lightning, the HF
#: Trainer, DCP, and a program's own ``save_checkpoint``): a main thread
#: inside one is working, however idle its CPU (a slow file system), for up
#: to ``MAX_HANG_S``
SAVERS = frozenset(("save", "_save", "save_checkpoint", "_save_checkpoint", "save_model",
                    "save_pretrained", "save_file", "save_state", "async_save",
                    "save_state_dict"))
#: the files of the collective path: a main thread there waits for its peers
_COLLECTIVE_PATH = (f"torch{os.sep}distributed{os.sep}", f"torch{os.sep}autograd{os.sep}",
                    f"torch{os.sep}nn{os.sep}parallel{os.sep}", f"torch{os.sep}_tensor.py")


def settings(env: Any = None) -> dict[str, Any]:
    """The watchdog's options from the environment (``python -m daifu`` puts
    its options there): ``hang_after`` (None: adaptive; 0: off), ``on_hang``
    ("save" or "report"), ``wait`` (seconds a person has before the ranks
    save; None: forever), ``save`` (checkpoints on), ``notify``."""
    env = os.environ if env is None else env
    text = (env.get("DAIFU_HANG_AFTER") or "auto").strip().lower()
    hang_after: float | None = None
    if text in ("off", "0", "no", "false"):
        hang_after = 0.0
    elif text != "auto":
        try:
            hang_after = max(0.0, float(text))
        except ValueError:
            hang_after = None
    wait_text = (env.get("DAIFU_WAIT") or "0").strip().lower()
    try:
        wait: float | None = None if wait_text in ("inf", "forever") else float(wait_text)
    except ValueError:
        wait = 0.0
    return {"hang_after": hang_after,
            "on_hang": "report" if (env.get("DAIFU_ON_HANG") or "").strip() == "report"
            else "save",
            "wait": wait, "save": (env.get("DAIFU_CHECKPOINT") or "1").strip() != "0",
            "notify": env.get("DAIFU_NOTIFY") or None}


# -- one rank: its own progress ---------------------------------------------------------


class MainThread:
    """What can be read of the main thread from another thread."""

    def __init__(self) -> None:
        main = threading.main_thread()
        self.ident = main.ident or 0
        self.clock: int | None = None
        try:
            self.clock = time.pthread_getcpuclockid(self.ident)
        except (AttributeError, OSError, OverflowError):
            pass
        native = getattr(main, "native_id", None)
        self.io: str | None = f"/proc/self/task/{native}/io" if native else None

    def cpu(self) -> float | None:
        if self.clock is None:
            return None
        try:
            return time.clock_gettime(self.clock)
        except OSError:
            self.clock = None
            return None

    def io_bytes(self) -> int | None:
        """Bytes the main thread passed to read and write calls (files, pipes,
        sockets), or None where the system does not say."""
        if self.io is None:
            return None
        try:
            with open(self.io, "rb") as fh:
                data = fh.read()
        except OSError:
            self.io = None
            return None
        total = 0
        for line in data.splitlines():
            if line.startswith((b"rchar:", b"wchar:")):
                total += int(line.split()[1])
        return total

    def where(self) -> tuple[str, bool, bool]:
        """Its innermost line in the program's own code (else its innermost
        line), whether it is in the collective path, and whether it is
        writing a checkpoint (``SAVERS``)."""
        frame = sys._current_frames().get(self.ident)
        innermost = own = ""
        waiting = saving = False
        while frame is not None:
            code = frame.f_code
            name = code.co_filename
            if not is_plumbing(name):
                if not innermost:
                    innermost = f"{name}:{frame.f_lineno} in {code.co_name}"
                    waiting = any(part in name for part in _COLLECTIVE_PATH)
                if not own and not _installed(name):
                    own = f"{name}:{frame.f_lineno} in {code.co_name}"
                saving = saving or code.co_name in SAVERS
            frame = frame.f_back
        return own or innermost, waiting, saving


class Progress:
    """One rank's progress, read every tick (``update``): its steps, when its
    main thread last moved, the gaps between steps, where it spends its own
    time."""

    def __init__(self, now: float) -> None:
        self.steps: int | None = None
        self.step_t = now
        #: a step was seen since the first reading (the next change is a gap)
        self.stepped = False
        #: gaps between steps measured, and the slowest (s)
        self.gaps, self.slowest = 0, 0.0
        self.moved_t = now
        #: since when the main thread writes a checkpoint (None: it does not)
        self.saving_t: float | None = None
        self.cpu: float | None = None
        self.io: int | None = None
        self.last_t = now
        #: (time, steps) over the last ~20 s: the step rate
        self.window: collections.deque = collections.deque(maxlen=40)
        #: the last samples: in the collective path or not, and where
        self.samples: collections.deque = collections.deque(maxlen=STRAGGLER_SAMPLES)
        #: when the step count was seen to change, lately
        self.changes: collections.deque = collections.deque(maxlen=4 * STRAGGLER_SAMPLES)

    def update(self, now: float, steps: int, cpu: float | None, io: int | None,
               where: str = "", waiting: bool = False, saving: bool = False) -> None:
        moved = False
        if not saving:
            self.saving_t = None
        elif self.saving_t is None:
            self.saving_t = now
        if self.saving_t is not None and now - self.saving_t < MAX_HANG_S:
            moved = True  # (writing a checkpoint, however slowly)
        if steps != self.steps:
            if self.steps is not None:
                if self.stepped:
                    self.gaps += 1
                    self.slowest = max(self.slowest, now - self.step_t)
                self.stepped = True
            self.steps, self.step_t, moved = steps, now, True
            self.changes.append(now)
        dt = now - self.last_t
        if cpu is not None and self.cpu is not None and dt > 0 \
                and cpu - self.cpu >= BUSY_SHARE * dt:
            moved = True
        if io is not None and self.io is not None and io != self.io:
            moved = True
        self.cpu, self.io, self.last_t = cpu, io, now
        if moved:
            self.moved_t = now
        self.window.append((now, steps))
        self.samples.append((waiting, where))

    def step_s(self) -> float | None:
        """The mean step time over the window, or None (no step in it)."""
        if len(self.window) < 2:
            return None
        (t0, s0), (t1, s1) = self.window[0], self.window[-1]
        return (t1 - t0) / (s1 - s0) if s1 > s0 else None

    def regular(self, now: float) -> bool:
        """Did the rank step at a steady pace over the samples' window?  (A
        straggler does; a rank that stopped once for seconds -- a slow first
        step, an evaluation, a checkpoint -- does not, until that stop has
        left the window.)"""
        since = now - TICK_S * len(self.samples)
        times = [t for t in self.changes if t >= since]
        earlier = [t for t in self.changes if t < since]
        if earlier:  # (a stop that began before the window and ended in it counts)
            times.insert(0, earlier[-1])
        gaps = sorted(b - a for a, b in zip(times, times[1:]))
        return len(gaps) >= 5 and gaps[-1] <= max(3 * gaps[len(gaps) // 2], 1.5)

    def beat(self, n: int, now: float, crash: bool, taken: int = 0) -> dict[str, Any]:
        own = [where for waiting, where in self.samples if not waiting]
        hot = collections.Counter(own).most_common(1)
        return {"n": n, "steps": self.steps, "idle": round(now - self.moved_t, 3),
                "slowest": round(self.slowest, 3), "gaps": self.gaps,
                "at": self.samples[-1][1] if self.samples else "",
                "own": (len(own) / len(self.samples)) if self.samples else None,
                "samples": len(self.samples), "hot": hot[0][0] if hot else "",
                "step_s": self.step_s(), "regular": self.regular(now), "crash": crash,
                "taken": taken, "pid": os.getpid(),
                "host": socket.gethostname()}


# -- rank 0: the job's progress ---------------------------------------------------------


class Judge:
    """Rank 0's view of every rank's beats: is the job hung?  (Pure: ``now``
    is given; the beats are the ranks' ``Progress.beat``.)"""

    def __init__(self, world: int, hang_after: float | None, now: float) -> None:
        self.world, self.fixed, self.start = world, hang_after, now
        #: rank -> [its beat counter, when it last changed on this clock]
        self.seen: dict[int, list] = {}
        self.steps: dict[int, Any] = {}
        #: when a rank last took a step (on this clock)
        self.progress_t = now
        self.fired = False
        self.named: set[int] = set()

    def threshold(self, beats: dict[int, dict]) -> tuple[float, str]:
        if self.fixed:
            return self.fixed, "--hang-after"
        if len(beats) < self.world or any((b.get("taken") or 0) < 2 for b in beats.values()):
            return FIRST_HANG_S, "before every rank's second step"
        slowest = max(float(b.get("slowest") or 0.0) for b in beats.values())
        value = min(MAX_HANG_S, max(MIN_HANG_S, STEP_FACTOR * slowest))
        return value, f"{STEP_FACTOR:g} x the slowest step, {slowest:.2f} s; at least " \
                      f"{MIN_HANG_S:g} s, at most {MAX_HANG_S:g} s"

    def look(self, beats: dict[int, dict], now: float) -> dict[str, Any] | None:
        """A verdict when the job has just been found hung, else None."""
        for r, b in beats.items():
            seen = self.seen.get(r)
            if seen is None or seen[0] != b.get("n"):
                self.seen[r] = [b.get("n"), now]
            if self.steps.get(r, -1) != b.get("steps"):
                self.steps[r] = b.get("steps")
                self.progress_t = now
        if any(b.get("crash") or b.get("ended") for b in beats.values()):
            # (a rank waits for a fix: its peers wait for it; a rank ended: so does the job)
            self.progress_t = now
            return None
        limit, why = self.threshold(beats)
        stalled = now - self.progress_t
        if stalled < limit:
            self.fired = False
            return None
        quiet: dict[int, tuple[str, float]] = {}
        for r in range(self.world):
            seen = self.seen.get(r)
            silent = now - (seen[1] if seen else self.start)
            beat = beats.get(r)
            if beat is None or silent >= limit:
                quiet[r] = ("silent", silent)
            elif float(beat.get("idle") or 0.0) >= limit:
                quiet[r] = ("idle", float(beat["idle"]))
            else:
                return None  # (a rank works: a long evaluation, a checkpoint write)
        if self.fired:
            return None
        self.fired = True
        return {"threshold": limit, "why": why, "stalled": stalled, "quiet": quiet}

    def stragglers(self, beats: dict[int, dict]) -> list[dict[str, Any]]:
        """Ranks newly seen keeping the others waiting (``STRAGGLER_*``)."""
        own: dict[int, float] = {}
        for r, b in beats.items():
            if (b.get("samples") or 0) < STRAGGLER_SAMPLES or b.get("own") is None \
                    or not b.get("step_s"):
                return []
            if float(b.get("idle") or 0.0) > max(2.0, 1.5 * float(b["step_s"])) \
                    or not b.get("regular"):
                return []  # (the job is not moving, or stopped once lately: not a straggler)
            own[r] = float(b["own"]) * float(b["step_s"])
        if len(own) < 2:
            return []
        out = []
        for r, mine in own.items():
            others = sorted(v for k, v in own.items() if k != r)
            median = others[len(others) // 2] if len(others) % 2 else \
                (others[len(others) // 2 - 1] + others[len(others) // 2]) / 2
            if r not in self.named and mine >= STRAGGLER_RATIO * median \
                    and mine - median >= STRAGGLER_MIN_S:
                self.named.add(r)
                out.append({"rank": r, "own_s": mine, "others_s": median,
                            "late_s": mine - median, "at": beats[r].get("hot") or "",
                            "samples": int(beats[r].get("samples") or 0)})
        return out


def name_the_hang(verdict: dict[str, Any], beats: dict[int, dict],
                  answers: dict[int, dict]) -> tuple[int | None, str, str]:
    """(the rank that is behind, its line, what the others wait in), from the
    verdict, the beats and the doctor's answers (``stacks``)."""
    from .remote._doctor import _short, behind_in  # lazy: 1.5 ms

    silent = sorted(r for r, (kind, _) in verdict["quiet"].items() if kind == "silent")
    recorded = {r: a["collectives"] for r, a in answers.items()
                if isinstance(a.get("collectives"), list)}
    behind: int | None = None
    waiting = ""
    if len(recorded) > 1:  # (the default process group's, where there is one)
        late, ahead, last = behind_in({r: [c for c in cs if c.get("pg") == "0"] or cs
                                       for r, cs in recorded.items()})
        if late and ahead:
            behind, waiting = late[0], _short(last[ahead[0]])
    if behind is None and silent:
        behind = silent[0]
    if behind is None:  # (no recorder: the rank whose main thread is not in torch.distributed)
        outside = sorted(r for r, a in answers.items()
                         if "torch/distributed" not in str(a.get("innermost")))
        if outside and len(outside) < len(answers):
            behind = outside[0]
    if behind is None:
        return None, "", waiting
    at = str((answers.get(behind) or {}).get("at") or "")
    if not at:
        seen = (beats.get(behind) or {}).get("at") or "?"
        at = f"{seen} (where it was last seen: it no longer answers -- its interpreter is " \
             f"held in C, or it is stopped)"
    return behind, at, waiting


# -- the thread ------------------------------------------------------------------------


class Watchdog(threading.Thread):
    def __init__(self, store: Any, key: bytes, job: str, world: int, rank: int,
                 options: dict[str, Any], engine: Any) -> None:
        super().__init__(name="daifu-watchdog", daemon=True)
        from .remote._boundary import Boundary  # lazy: 42.0 ms

        self.store, self.key, self.job, self.world, self.rank = store, key, job, world, rank
        self.options, self.engine = options, engine
        self.boundary = Boundary(store, key, job, world, rank, kind="hang")
        self.stopping = threading.Event()
        self.main = MainThread()
        self.n = 0
        #: the ranks that stopped posting, at the hang
        self.silent: list[int] = []

    def stop(self) -> None:
        """The program ends: say so to the judge (a rank that ended is not
        hung, and the job is ending), once the thread is out of the store."""
        self.stopping.set()
        self.join(2 * TICK_S)
        if self.is_alive():
            return
        try:
            self.boundary._set("beat", self.rank, {"n": self.n + 1, "ended": True})
        except Exception:
            pass

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # (never the job's problem; said unless the job ends)
            if not self.stopping.is_set():
                import traceback  # lazy: 4.2 ms

                emit(InternalError(where="watchdog", error=f"{type(exc).__name__}: {exc} "
                                   "(this rank's hangs are no longer watched)",
                                   traceback=traceback.format_exc()))

    def _run(self) -> None:
        from .persist._resume import KEEPER  # lazy: 2.6 ms
        from .remote._distributed import at_crash_here  # lazy: 0.0 ms

        now = time.monotonic()
        progress = Progress(now)
        judge = Judge(self.world, self.options["hang_after"], now)
        hung_since: float | None = None
        while not self.stopping.wait(TICK_S):
            now = time.monotonic()
            where, waiting, saving = self.main.where()
            progress.update(now, KEEPER.steps, self.main.cpu(), self.main.io_bytes(), where,
                            waiting, saving)
            self.n += 1
            self.boundary._set("beat", self.rank, progress.beat(self.n, now, at_crash_here(),
                                                                KEEPER._taken))
            order = self.boundary._get("order", None)
            if order is not None:
                self._save_and_end(order)
                return
            if not self._judging(judge, now):
                continue
            beats = self._beats()
            for s in judge.stragglers(beats):
                s["at"] = _with_source(s["at"])
                emit(StragglerSeen(straggler=s["rank"], at=s["at"], late_s=round(s["late_s"], 3),
                                   own_s=round(s["own_s"], 3), others_s=round(s["others_s"], 3),
                                   samples=s["samples"]))
                _say(f"rank {s['rank']} is a straggler: {s['own_s']:.2f} s of its own per step "
                     f"against {s['others_s']:.2f} s for the others (they wait for it); it "
                     f"spends it at {s['at'] or '?'}")
            verdict = judge.look(beats, now)
            if verdict is not None:
                hung_since = now
                self.silent = sorted(r for r, (kind, _) in verdict["quiet"].items()
                                     if kind == "silent")
                self._report(verdict, beats)
            elif hung_since is not None and not judge.fired:
                hung_since = None  # (it moved again)
            if hung_since is not None and self._save_now(now - hung_since):
                self.boundary._set("order", None, {"op": "save", "by": self.rank,
                                                   "silent": self.silent})

    def _judging(self, judge: Judge, now: float) -> bool:
        """Rank 0 judges; rank 1 does when rank 0 stopped posting."""
        if self.rank == 0:
            return True
        if self.rank != 1:
            return False
        beat = self.boundary._get("beat", 0)
        seen = judge.seen.get(0)
        if beat is not None and (seen is None or seen[0] != beat.get("n")):
            judge.seen[0] = [beat.get("n"), now]
            return False
        return now - (judge.seen.get(0) or [None, judge.start])[1] >= MIN_HANG_S

    def _beats(self) -> dict[int, dict]:
        out = {}
        for r in range(self.world):
            beat = self.boundary._get("beat", r)
            if beat is not None:
                out[r] = beat
        return out

    def _save_now(self, hung_for: float) -> bool:
        opts = self.options
        if opts["on_hang"] != "save" or not opts["save"]:
            return False
        wait = opts["wait"]
        return wait is not None and hung_for >= wait

    def _action(self) -> str:
        opts = self.options
        if opts["on_hang"] != "save" or not opts["save"]:
            return "report"
        return "save" if opts["wait"] == 0 else "wait"

    def _report(self, verdict: dict[str, Any], beats: dict[int, dict]) -> None:
        from .remote._doctor import diagnose  # lazy: 1.5 ms
        from .remote._jobstore import JobRanks  # lazy: 41.3 ms

        answers: dict[int, dict] = {}
        try:
            answers = {r: a for r, a in JobRanks(job_file_info()).stacks(timeout=5.0).items()
                       if a.get("ok", True)}
        except Exception:
            pass
        rank, at, waiting = name_the_hang(verdict, beats, answers)
        idle = max((v for _, v in verdict["quiet"].values()), default=0.0)
        action = self._action()
        diagnosis = diagnose(answers) if answers else []
        emit(HangDetected(behind=rank, at=at, waiting=waiting, idle_s=round(idle, 2),
                          threshold_s=round(verdict["threshold"], 2), why=verdict["why"],
                          diagnosis=diagnosis, action=action))
        who = f"rank {rank} has not moved for {idle:.1f} s at {at}" if rank is not None \
            else f"no rank has moved for {idle:.1f} s"
        then = {"save": "every rank saves its state, then the job ends",
                "wait": (f"the job waits {self.options['wait']:g} s for you, then every rank "
                         "saves" if self.options["wait"] is not None else "the job waits for you")
                + f" (python -m daifu stacks --job {os.getpid()})",
                "report": "daifu does nothing more (--on-hang report, or --no-checkpoint)"}[action]
        lines = [f"the job hangs: {who}" + (f"; the others wait in {waiting}" if waiting else "")
                 + f" (threshold {verdict['threshold']:.1f} s: {verdict['why']}); {then}"]
        _say("\n".join(lines + [f"  {line}" for line in diagnosis]))
        self._notify(rank, at, lines[0])

    def _notify(self, rank: int | None, at: str, text: str) -> None:
        command = self.options.get("notify")
        if not command:
            return
        import subprocess  # lazy: 4.0 ms

        env = dict(os.environ, DAIFU_HANG="1", DAIFU_PID=str(os.getpid()), DAIFU_WHERE=at,
                   DAIFU_HUNG_RANK="" if rank is None else str(rank), DAIFU_MESSAGE=text,
                   DAIFU_ATTACH=f"{sys.executable} -m daifu stacks --job {os.getpid()}",
                   DAIFU_ARGV=" ".join(sys.argv))
        try:
            subprocess.Popen(command, shell=True, env=env, stdin=subprocess.DEVNULL,
                             start_new_session=True)
        except OSError as exc:
            emit(NotifyFailed(where=at, command=command, error=str(exc)))
            return
        emit(NotifySent(where=at, command=command))

    def _save_and_end(self, order: dict[str, Any]) -> None:
        from .persist._preempt import save_hung  # lazy: 10.5 ms

        # (a rank that stopped answering will not save: rank 0 waits less for it)
        limit = SILENT_SAVE_S if order.get("silent") else SAVE_S
        done = save_hung(self.engine, self.boundary, time.monotonic() + limit)
        if done == "busy":
            return  # (SIGTERM came first: that path saves and ends the rank)
        _say(f"rank {self.rank}: {'saved its state' if done == 'saved' else 'saved nothing'} "
             f"after the hang; ending (exit {HANG_EXIT}: torchrun --max-restarts relaunches "
             "the job, and daifu.resume(manifest) resumes it)")
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(HANG_EXIT)


def _with_source(at: str) -> str:
    """``FILE:LINE in NAME`` with the line's text, where this node has the file."""
    import linecache  # lazy: 0.1 ms

    where, _, _ = at.partition(" in ")
    filename, _, line = where.rpartition(":")
    text = linecache.getline(filename, int(line)).strip() if line.isdigit() else ""
    return f"{at} ({text})" if text else at


def _say(text: str) -> None:
    try:
        sys.__stderr__.write(f"daifu: {text}\n")  # type: ignore[union-attr]
        sys.__stderr__.flush()  # type: ignore[union-attr]
    except Exception:
        pass


@state_record
class _Started:
    """This rank's watchdog (``RUNTIME.parts``)."""

    #: the watchdog ``start`` started (once per process), or None
    dog: Watchdog | None = None


_state = RUNTIME.part(__name__, _Started())


def start(engine: Any) -> None:
    """Start this rank's watchdog (once; never raises): in a launcher's rank
    (``RANK``) of a job with a store and several ranks, unless
    ``--hang-after 0``."""
    if _state.dog is not None or "RANK" not in os.environ:
        return
    options = settings()
    if options["hang_after"] == 0:
        return
    try:
        info = job_file_info()
        world = int(info.get("world_size") or 0)
        if world < 2 or "store" not in info or "rank" not in info:
            return
        from .remote._jobstore import _client  # lazy: 41.3 ms
        from .remote._seal import load_key  # lazy: 12.4 ms

        addr, _, port = info["store"].rpartition(":")
        store = _client(addr, int(port), 30.0)
        dog = Watchdog(store, load_key(create=True), str(info.get("job") or ""), world,
                       int(info["rank"]), options, engine)
    except Exception:
        return
    _state.dog = dog
    dog.start()
    try:  # stopped when the main thread ends, before anything is finalized
        threading._register_atexit(dog.stop)  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError):
        pass
