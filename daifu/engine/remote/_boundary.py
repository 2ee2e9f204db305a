"""A distributed job preempted: the ranks agree, through the job's store, on
the one iteration boundary where each saves its state (``persist/_preempt``).

torchrun's agent passes SIGTERM on to every rank.  Each rank's handler runs
when its main thread is back in Python, so the ranks learn of it at
different points; each goes on training meanwhile, and never blocks on the
store (a rank that waited there would hold its peers in their next
collective).  At every header of the training-step loop after its SIGTERM,
a rank

1. posts once the optimizer steps it has taken (``post``);
2. asks for the target (``decide``).  Rank 0, once every rank has posted,
   sets it: its own step count plus one.  No rank can be past it then --
   a rank gets through an iteration's collectives only with rank 0 in them
   -- and every rank is at the header of that step before rank 0's next
   collective returns, so each finds the target there;
3. saves at the header where its step count is the target, says where
   (``saved``), and dies of SIGTERM.  Rank 0 gathers the files (``saved_by``)
   into the job's manifest.

Everything read from the store is sealed with this user's key for its place
(the job, the attempt, the phase, the rank): one that is not is dropped
(``store.dropped``), as for the job's decisions (``_distributed``).
"""

from __future__ import annotations

import os
import sys
import time

from .._job import distributed
from ._jobstore import dropped
from ._seal import SealError, load_key, seal, unseal

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from typing import Any

class Boundary:
    """One rank's part in agreeing where a preempted job saves."""

    def __init__(self, store: Any, key: bytes, job: str, world: int, rank: int,
                 kind: str = "preempt") -> None:
        self.store, self.key, self.job = store, key, job
        #: what the ranks save for: "preempt" (SIGTERM) or "hang" (``_watchdog``)
        self.kind = kind
        self.world, self.rank = world, rank
        #: torchrun's restart count: each attempt of the job agrees afresh
        self.attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self.posted = False
        #: the step count every rank saves at, once agreed
        self.target: int | None = None

    def _name(self, phase: str, rank: int | None = None) -> str:
        tail = f"/{rank}" if rank is not None else ""
        return f"daifu/{self.kind}/{self.job}/{self.attempt}/{phase}{tail}"

    def _place(self, phase: str, rank: int | None) -> str:
        return f"{self.kind}|{self.job}|{self.attempt}|{phase}|{rank}"

    def _set(self, phase: str, rank: int | None, payload: dict) -> None:
        self.store.set(self._name(phase, rank), seal(self.key, self._place(phase, rank), payload))

    def _get(self, phase: str, rank: int | None) -> dict | None:
        """The sealed value there, or None (absent, or dropped as forged)."""
        name = self._name(phase, rank)
        if not self.store.check([name]):
            return None
        try:
            return unseal(self.key, self._place(phase, rank), self.store.get(name))
        except SealError as exc:
            dropped(name, str(exc))
            return None

    def post(self, step: int) -> None:
        """This rank got SIGTERM and is at a header after ``step`` steps."""
        if not self.posted:
            self._set("posted", self.rank, {"step": step})
            self.posted = True

    def decide(self, step: int) -> int | None:
        """The step count to save at, once known.  Rank 0 sets it, at its
        first header after every rank has posted."""
        if self.target is not None:
            return self.target
        got = self._get("target", None)
        if got is not None and isinstance(got.get("step"), int):
            self.target = got["step"]
            return self.target
        if self.rank != 0:
            return None
        names = [self._name("posted", r) for r in range(self.world)]
        if not self.store.check(names):
            return None
        if any(self._get("posted", r) is None for r in range(self.world)):
            return None  # (a forged post: not every rank has posted yet)
        self._set("target", None, {"step": step + 1})
        self.target = step + 1
        return self.target

    def shards(self, step: int, have: bool, directory: str | None,
               wait_s: float) -> str | None:
        """Where the job's sharded state is written with DCP (a collective)
        at ``step``, or None: each rank's file holds its own.  Every rank
        says whether it holds sharded state (``have``); rank 0 names its
        ``directory`` once every rank said yes at that step within
        ``wait_s``, else None; the others wait up to ``wait_s`` for that.
        (A rank that gave up waiting while rank 0 chose DCP would leave rank
        0 alone in the collective: the others wait longer than rank 0.)"""
        self._set("shards-ready", self.rank, {"step": step, "have": have})
        deadline = time.monotonic() + max(0.0, wait_s)
        if self.rank == 0:
            chosen = directory if have else None
            while chosen is not None:
                said = [self._get("shards-ready", r) for r in range(self.world)]
                if any(v is not None and (v.get("step") != step or not v.get("have"))
                       for v in said) or time.monotonic() >= deadline:
                    chosen = None
                elif all(v is not None for v in said):
                    break
                else:
                    time.sleep(0.05)
            self._set("shards", None, {"step": step, "dir": chosen})
            return chosen
        while have:  # (a rank with none saves alone whatever rank 0 decides)
            got = self._get("shards", None)
            if got is not None:
                return got.get("dir") if got.get("step") == step else None
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)
        return None

    def saved(self, path: str | None, step: int, state: str) -> None:
        """Where this rank saved (None: it could not)."""
        self._set("saved", self.rank, {"path": path, "step": step, "state": state,
                                       "pid": os.getpid()})

    def finished(self) -> None:
        """Rank 0: the job's manifest is written (or will not be)."""
        self._set("finished", None, {"pid": os.getpid()})

    def wait_finished(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for rank 0's ``finished``."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        while self._get("finished", None) is None:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def saved_by(self, timeout_s: float) -> dict[int, dict | None]:
        """Rank 0: what every rank saved, waiting up to ``timeout_s`` for
        them (a rank that never says is None)."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        found: dict[int, dict | None] = {}
        while True:
            for r in range(self.world):
                if found.get(r) is None:
                    found[r] = self._get("saved", r)
            if all(v is not None for v in found.values()) or time.monotonic() >= deadline:
                return found
            time.sleep(0.05)


def job_boundary() -> Boundary | None:
    """This rank's ``Boundary`` in an initialized process group of several
    ranks, else None (a single process: it saves at its own next header)."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        world = dist.get_world_size()
        if world < 2:
            return None
        store = dist.distributed_c10d._get_default_store()
        rank = dist.get_rank()
    except Exception:
        return None
    try:
        key = load_key(create=True)
    except SealError:
        return None
    return Boundary(store, key, str(distributed().get("job") or ""), world, rank)
