"""The console in a distributed job: ``ranks``, ``rank N`` and ``all COMMAND``."""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

from .. import _job
from .._queue import Apply
from ..remote._control import EndpointError
from ..remote._jobstore import JobRanks, place

if TYPE_CHECKING:
    from .._crash import Crash


class Ranks:
    """The distributed-job commands of the console (``_console.Console``)."""

    if TYPE_CHECKING:
        crash: Crash
        ok: bool
        local: bool
        scope: str
        apply: Apply
        origin: str
        stdout: Any

        def say(self, text: str = "") -> None: ...

        def onecmd(self, line: str) -> bool: ...

        def _readline(self, prompt: str) -> str | None: ...

    def _job_ranks(self):
        """(the job's ranks, the *other* ranks that wait on a crash, every
        rank's status that answered), or None outside a distributed job."""

        info = _job.job_file_info()
        if info.get("job") is None:
            self.ok = False
            self.say("this process is not a rank of a distributed job")
            return None
        ranks = JobRanks(info)
        statuses = ranks.statuses()
        me = info.get("rank")
        others = [s for r, s in sorted(statuses.items())
                  if r != me and s.get("state") == "waiting"]
        return ranks, others, statuses

    def do_ranks(self, arg: str) -> bool:
        """ranks: the job's ranks that wait on a crash (on every node, through the job's store)"""

        found = self._job_ranks()
        if found is None:
            return False
        ranks, others, statuses = found
        me = _job.distributed()
        self.say(f"> rank {me.get('rank')} (pid {os.getpid()}): {self.crash.where} "
                 f"{type(self.crash.exception).__qualname__}: {self.crash.statement}")
        for job in others:
            self.say(f"  rank {job.get('rank')} ({place(job)}): {job['where']} "
                     f"{job['exc_type']}: {job['statement']}")
        running = sorted(r for r, s in statuses.items()
                         if s.get("state") != "waiting" and r != me.get("rank"))
        if running:
            self.say(f"  running (not at a crash): rank {', '.join(map(str, running))}")
        statuses.setdefault(int(me.get("rank", -1)), {})  # (this rank answered, of course)
        unanswered = ranks.unanswered(statuses)
        if unanswered:
            self.say(f"  {unanswered}")
        return False

    def do_rank(self, arg: str) -> bool:
        """rank N: talk to rank N's crash (``back`` returns here)"""

        found = self._job_ranks()
        if found is None:
            return False
        ranks, others, _ = found
        if arg.strip() == str(_job.distributed().get("rank")):
            self.say(f"this is rank {arg.strip()}'s own crash (the console already talks to "
                     "it)")
            return False
        target = [j for j in others if str(j.get("rank")) == arg.strip()]
        if not target:
            self.ok = False
            self.say(f"rank {arg.strip()!r} does not wait on a crash (see `ranks`)")
            return False
        session = ranks.session(target[0])
        try:
            hello = session.open()
            if not hello.get("ok"):
                raise EndpointError(hello.get("error") or "refused")
            self.say(hello.get("report", ""))
            prompt = f"(daifu rank {arg.strip()}) "
            while True:
                line = self._readline(prompt)
                if line is None or line.strip() == "back":
                    self.say(f"back at rank {_job.distributed().get('rank')}")
                    return False
                if not line.strip():
                    continue
                reply = session.command(line)
                if reply.get("output"):
                    self.say(reply["output"])
                if reply.get("error"):
                    self.say(reply["error"])
                    return False
                if reply.get("resumed") or reply.get("decision"):
                    self.say(f"rank {arg.strip()}: {reply.get('decision')}; back at rank "
                             f"{_job.distributed().get('rank')}")
                    return False
        except (EndpointError, OSError) as exc:
            self.ok = False
            self.say(f"rank {arg.strip()}: {exc}")
            return False
        finally:
            session.close()

    def do_all(self, arg: str) -> bool:
        """all COMMAND: COMMAND on every waiting rank of the job, together"""

        if not arg.strip():
            self.ok = False
            self.say("usage: all COMMAND   (e.g. all exec lr = 0.01, all retry)")
            return False
        found = self._job_ranks()
        if found is None:
            return False
        ranks, others, _ = found
        replies: dict[int, dict] = {}
        sender = threading.Thread(target=lambda: replies.update(ranks.send(others, arg)),
                                  daemon=True)
        sender.start()  # the others at once: a decision waits until every rank took it
        self.scope = "job"
        try:
            stop = self.onecmd(arg)
        finally:
            self.scope = "rank"
        sender.join()
        for job in others:
            reply = replies.get(int(job["rank"]), {})
            text = (reply.get("output") or "").rstrip() or reply.get("error") or (
                reply.get("decision") or "ok")
            self.say(f"rank {job.get('rank')}: {text}")
        return stop
