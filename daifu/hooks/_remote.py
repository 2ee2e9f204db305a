"""``python -m daifu ps | attach PID | send PID COMMAND``: reach a job that waits
on a crash, from another terminal (same user only; see engine/remote/_control.py)."""

from __future__ import annotations

import json
import os
import sys
import time

from ..engine import (
    ARMED_S,
    EndpointError,
    JobRanks,
    Session,
    diagnose,
    list_jobs,
    place,
    request,
    running_jobs,
    stacks_path,
)
from ..engine import render_diagnosis as render

#: exit statuses of ``send``
RESUMED, STILL_WAITING, FAILED, NO_JOB = 0, 1, 2, 3


def ps(args: list[str]) -> int:
    as_json = "--json" in args
    unknown = [a for a in args if a != "--json"]
    if unknown:
        print("usage: python -m daifu ps [--json]", file=sys.stderr)
        return FAILED
    try:
        waiting = list_jobs()
        running = running_jobs()
    except EndpointError as exc:
        print(f"daifu ps: {exc}", file=sys.stderr)
        return NO_JOB
    now = time.time()
    waiting_pids = {job["pid"] for job in waiting}
    jobs = [{**job, "state": "waiting"} for job in waiting]
    jobs += [job for job in running if job["pid"] not in waiting_pids]
    jobs += _other_nodes(jobs, running)
    # the ranks of one distributed job together, in rank order
    jobs.sort(key=lambda j: (str(j.get("job", "")), j.get("rank", -1), j["pid"]))
    if as_json:
        print(json.dumps(jobs, indent=1, default=str))
        return 0
    if not jobs:
        print("no daifu job is running")
        return 0
    print(f"{'PID':>7}  {'STATE':<8} {'FOR':>7}  WHERE / PROGRAM")

    for job in jobs:
        if job["state"] == "waiting":
            how = " (console on its terminal)" if job.get("console") else ""
            print(f"{job['pid']:>7}  {'waiting':<8} {job['waiting_s']:>6.0f}s  "
                  f"{job['exc_type']} at {job['where']} in {job['function']}(){how}")
            print(f"{'':>27}{job['statement']}")
        else:
            since = now - float(job.get("started") or now)
            print(f"{job['pid']:>7}  {'running':<8} {_duration(since):>7}  "
                  f"{job.get('cwd', '')}")
        print(f"{'':>27}{' '.join(str(a) for a in job.get('argv', []))}")
        if "rank" in job:
            where = place(job).partition(" on ")[2]
            print(f"{'':>27}rank {job['rank']} of {job.get('world_size', '?')} (local rank "
                  f"{job.get('local_rank', '?')}), job {job.get('job', '?')}"
                  + (f", on {where}" if where else ""))
    return 0


def _other_nodes(here: list[dict], running: list[dict]) -> list[dict]:
    """The ranks on other nodes of the distributed jobs that have ranks here
    (through each job's store; ``_jobstore``)."""

    out = []
    for info in {j["job"]: j for j in running if "job" in j and "store" in j}.values():
        ranks = JobRanks(info)
        if not ranks.everywhere:
            continue
        mine = {j.get("rank") for j in here if j.get("job") == info["job"]}
        out += [status for rank, status in ranks.statuses(3.0).items() if rank not in mine]
    return out


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}"


def send(args: list[str]) -> int:
    job = bool(args) and args[0] == "--job"
    if job:
        args = args[1:]
    rank = None
    if job and len(args) > 2 and args[1] == "--rank":
        if not args[2].isdigit():
            args = []
        else:
            rank, args = int(args[2]), [args[0], *args[3:]]
    if len(args) < 2 or not args[0].isdigit():
        print("usage: python -m daifu send [--job] PID COMMAND ...   (e.g. send 1234 retry,\n"
              "       send 1234 exec 'lr = 0.01', send 1234 p loss; --job: to every waiting\n"
              "       rank of PID's distributed job, a decision for all ranks together)\n"
              "       python -m daifu send --job PID --rank N COMMAND ...   (rank N of PID's\n"
              "       job alone, on whichever node it runs)",
              file=sys.stderr)
        return FAILED
    pid, words = int(args[0]), args[1:]
    if words == ["break"] and not job:
        return pause(pid, "daifu send")
    text = " ".join(words)
    if words[0] == "exec" and len(words) > 1:
        text = "exec\n" + " ".join(words[1:]) + "\n"
    if rank is not None:
        return _send_rank(pid, rank, text)
    if job:
        return _send_job(pid, text)
    try:
        reply = request(pid, {"op": "send", "cmd": text})
    except (EndpointError, OSError) as exc:
        print(f"daifu send: {exc}", file=sys.stderr)
        return NO_JOB
    return _answer(reply)


def _waiting(pid: int) -> bool:
    try:
        return bool(request(pid, {"op": "status"}, timeout=2.0).get("ok"))
    except (EndpointError, OSError):
        return False


def pause(pid: int, who: str, timeout: float = 10.0) -> int:
    """``send PID break``: pause a running job at its next statement in a
    vaccinated frame (``engine/human/_break.py``); it then waits like a crash
    (``attach PID``, ``send PID continue``).  Exit status 1: paused and
    waiting."""
    if _waiting(pid):
        print(f"{who}: job {pid} is already waiting (attach to it, or send it a command)",
              file=sys.stderr)
        return STILL_WAITING
    jobs = {j["pid"]: j for j in running_jobs()}
    if pid not in jobs:
        print(f"{who}: no daifu job of yours with pid {pid} is running "
              "(python -m daifu ps lists them)", file=sys.stderr)
        return NO_JOB
    signum = jobs[pid].get("break_signal")
    if not signum:
        print(f"{who}: job {pid} cannot be paused (its program handles the signal break "
              "uses, or it started without daifu's runner)", file=sys.stderr)
        return FAILED
    try:
        os.kill(pid, int(signum))
    except OSError as exc:
        print(f"{who}: {exc}", file=sys.stderr)
        return NO_JOB
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            status = request(pid, {"op": "status"}, timeout=2.0)
        except (EndpointError, OSError):
            time.sleep(0.1)
            continue
        if status.get("ok"):
            print(f"paused at {status.get('where')} in {status.get('function')}(): "
                  f"{status.get('statement')}")
            return STILL_WAITING
        time.sleep(0.1)
    print(f"{who}: job {pid} has not paused within {timeout:g}s: its main thread has not "
          "reached a statement of a vaccinated function (it may be in a long C call: "
          f"python -m daifu stacks {pid} shows where); it pauses if it does within "
          f"{ARMED_S:g}s of the request, else the job drops the break and runs on",
          file=sys.stderr)
    return FAILED


def _answer(reply: dict, prefix: str = "") -> int:
    if reply.get("error"):
        print(f"daifu send: {prefix}{reply['error']}", file=sys.stderr)
        return NO_JOB if "permission denied" in reply["error"] else FAILED
    if reply.get("output"):
        out = reply["output"] if not prefix else "".join(
            prefix + line for line in reply["output"].splitlines(keepends=True))
        print(out, end="" if out.endswith("\n") else "\n")
    if not reply.get("ok"):
        return FAILED
    return RESUMED if reply.get("resumed") else STILL_WAITING


def _job_of(pid: int) -> dict:
    """The job file (or, for a job started without the runner, the status)
    of PID, a rank of a distributed job; ``EndpointError`` saying why not."""
    info = {j["pid"]: j for j in running_jobs()}.get(pid)
    if info is None:
        info = request(pid, {"op": "status"}, timeout=3.0)
        if not info.get("ok"):
            raise EndpointError(info.get("error") or f"job {pid} did not answer")
    if "job" not in info or "rank" not in info:
        raise EndpointError(f"job {pid} is not a rank of a distributed job (no RANK, "
                            "WORLD_SIZE, and MASTER_ADDR/MASTER_PORT or TORCHELASTIC_RUN_ID): "
                            "send it without --job")
    return info


def _send_job(pid: int, text: str) -> int:
    try:
        info = _job_of(pid)
        ranks = JobRanks(info)
        statuses = ranks.statuses()
    except (EndpointError, OSError) as exc:
        print(f"daifu send: {exc}", file=sys.stderr)
        return NO_JOB
    waiting = [s for _, s in sorted(statuses.items()) if s.get("state") == "waiting"]
    running = sorted(r for r, s in statuses.items() if s.get("state") != "waiting")
    if running:
        print(f"daifu send: rank{'s' if len(running) > 1 else ''} "
              f"{', '.join(map(str, running))} of job {info['job']} "
              f"{'are' if len(running) > 1 else 'is'} running, not waiting at a crash; "
              "a decision for all ranks will be refused", file=sys.stderr)
    unanswered = ranks.unanswered(statuses)
    if unanswered:
        print(f"daifu send: {unanswered}", file=sys.stderr)
    if not waiting:
        print(f"daifu send: no rank of job {info['job']} waits on a crash", file=sys.stderr)
        return NO_JOB
    replies = ranks.send(waiting, text)
    statuses_out = [_answer(replies.get(int(s["rank"])) or
                            {"ok": False, "error": "no answer in time (DAIFU_SEND_TIMEOUT)"},
                            prefix=f"rank {s['rank']} ({place(s)}): ") for s in waiting]
    if any(s == NO_JOB for s in statuses_out):
        return NO_JOB
    if any(s == FAILED for s in statuses_out):
        return FAILED
    return RESUMED if all(s == RESUMED for s in statuses_out) else STILL_WAITING


def _send_rank(pid: int, rank: int, text: str) -> int:
    """``send --job PID --rank N COMMAND``: to rank N of PID's job alone (a
    rank-local command, checked there as one), on any node."""

    try:
        info = _job_of(pid)
        ranks = JobRanks(info)
        statuses = ranks.statuses()
    except (EndpointError, OSError) as exc:
        print(f"daifu send: {exc}", file=sys.stderr)
        return NO_JOB
    status = statuses.get(rank)
    if status is None:
        if not 0 <= rank < ranks.world:
            print(f"daifu send: job {info['job']} has no rank {rank} (world size "
                  f"{ranks.world})", file=sys.stderr)
        else:
            print(f"daifu send: {ranks.unanswered(statuses) or f'rank {rank} did not answer'}",
                  file=sys.stderr)
        return NO_JOB
    if status.get("state") != "waiting":
        print(f"daifu send: rank {rank} of job {info['job']} ({place(status)}) is running, not "
              "waiting at a crash", file=sys.stderr)
        return NO_JOB
    if text.strip() == "break":
        print("daifu send: break pauses a running job: send it to the rank's pid on its node",
              file=sys.stderr)
        return FAILED
    reply = ranks.send([status], text, scope="rank").get(rank) or \
        {"ok": False, "error": "no answer"}
    return _answer(reply, prefix=f"rank {rank} ({place(status)}): ")


def attach(args: list[str]) -> int:
    if len(args) != 1 or not args[0].isdigit():
        print("usage: python -m daifu attach PID", file=sys.stderr)
        return FAILED
    pid = int(args[0])
    if not _waiting(pid) and pid in {j["pid"] for j in running_jobs()}:
        status = pause(pid, "daifu attach")  # a running job: pause it first
        if status != STILL_WAITING:
            return status
    try:
        session = Session(pid)
        hello = session.open()
    except (EndpointError, OSError) as exc:
        print(f"daifu attach: {exc}", file=sys.stderr)
        return NO_JOB
    if not hello.get("ok"):
        print(f"daifu attach: {hello.get('error')}", file=sys.stderr)
        return NO_JOB
    print(hello.get("report", ""))
    print("attached; type help for commands, Ctrl-D to detach (the job keeps waiting)")
    try:
        import readline  # noqa: F401 - line editing and history for input()  # lazy: 1.0 ms
    except ImportError:  # pragma: no cover
        pass
    try:
        while True:
            try:
                line = input("(daifu) ")
            except EOFError:
                print("\ndetached; the job keeps waiting")
                return STILL_WAITING
            if line.strip() == "exec":
                lines = []
                while (more := input("... ")).strip():
                    lines.append(more)
                line = "exec\n" + "\n".join(lines) + "\n"
            if not line.strip():
                continue
            reply = session.command(line)
            if reply.get("error"):
                print(f"daifu attach: {reply['error']}")
                return FAILED
            if reply.get("output"):
                print(reply["output"], end="" if reply["output"].endswith("\n") else "\n")
            if reply.get("decision") and reply.get("decision") != "pass" or reply.get("resumed"):
                print(f"job {pid}: {reply.get('decision')}")
                return RESUMED if reply.get("resumed") else STILL_WAITING
            if reply.get("decision") == "pass":
                return STILL_WAITING
    finally:
        session.close()



def _read_stacks(job: dict, timeout: float = 3.0) -> str | None:
    """Ask a running job for its threads' stacks (``_rundir.serve_stacks``)."""

    pid, signum = job["pid"], job.get("stacks_signal")
    if not signum:
        return None
    path = stacks_path(pid)
    try:
        with open(path, "r+", encoding="utf-8", errors="replace") as fh:
            fh.truncate(0)
            os.kill(pid, int(signum))
            deadline, size, stable = time.monotonic() + timeout, -1, 0
            while time.monotonic() < deadline:
                time.sleep(0.05)
                now = os.fstat(fh.fileno()).st_size
                stable = stable + 1 if now == size and now > 0 else 0
                size = now
                if stable >= 2:
                    break
            fh.seek(0)
            return fh.read()
    except OSError:
        return None


def _main_stack(text: str, main: str | None) -> list[str]:
    """The main thread's frames (innermost first) in faulthandler's dump."""
    blocks = text.split("\n\n")
    for block in blocks:
        head = block.strip().splitlines()[:1]
        if head and main and main.lower() in head[0].lower():
            return [line.strip() for line in block.strip().splitlines()[1:]]
    return []


def stacks(args: list[str]) -> int:
    """``python -m daifu stacks [--job] PID``: every thread's Python stack of a
    running job (of every rank of its distributed job with ``--job``)."""
    job_wide = "--job" in args
    rest = [a for a in args if a != "--job"]
    if len(rest) != 1 or not rest[0].isdigit():
        print("usage: python -m daifu stacks [--job] PID", file=sys.stderr)
        return FAILED
    pid = int(rest[0])
    jobs = {j["pid"]: j for j in running_jobs()}
    if pid not in jobs:
        print(f"daifu stacks: no daifu job of yours with pid {pid} is running "
              "(python -m daifu ps lists them)", file=sys.stderr)
        return NO_JOB
    targets = [jobs[pid]]
    if job_wide:
        if "job" not in jobs[pid]:
            print(f"daifu stacks: job {pid} is not a rank of a distributed job: "
                  "use it without --job", file=sys.stderr)
            return NO_JOB
        from ..engine import JobRanks  # lazy: 40.5 ms

        ranks = JobRanks(jobs[pid])
        if ranks.everywhere:  # every rank, on every node, through the job's store
            return _stacks_everywhere(ranks)
        targets = sorted((j for j in jobs.values() if j.get("job") == jobs[pid]["job"]),
                         key=lambda j: (j.get("rank", -1), j["pid"]))
    innermost: dict[str, str] = {}
    status = 0
    for job in targets:
        name = f"rank {job['rank']} " if "rank" in job else ""
        print(f"=== {name}pid {job['pid']}: {' '.join(str(a) for a in job.get('argv', []))}")
        text = _read_stacks(job)
        if not text:
            print("  (no answer: the job cannot report its stacks)")
            status = FAILED
            continue
        print(text.rstrip())
        frames = _main_stack(text, job.get("main_thread"))
        if frames and "rank" in job:
            innermost[str(job["rank"])] = frames[0]
    if job_wide and len(innermost) > 1:
        in_collective = {r for r, f in innermost.items() if "torch/distributed" in f}
        elsewhere = sorted(set(innermost) - in_collective)
        if in_collective and elsewhere:
            print(f"\nranks {', '.join(sorted(in_collective))} wait in a collective; rank"
                  f"{'s' if len(elsewhere) > 1 else ''} {', '.join(elsewhere)} "
                  f"{'are' if len(elsewhere) > 1 else 'is'} elsewhere (behind):")
            for rank in elsewhere:
                print(f"  rank {rank}: {innermost[rank]}")
    return status


def _stacks_everywhere(ranks) -> int:
    """``stacks --job`` through the job's store: every rank's threads and last
    collectives, then what is out of step (``engine/remote/_doctor``)."""

    answers = ranks.stacks()
    for rank, answer in sorted(answers.items()):
        print("\n".join(render(rank, answer, place(answer))))
        print()
    print("side by side (each rank's main thread, its last collective):")
    for rank, answer in sorted(answers.items()):
        last = (answer.get("collectives") or [{}])[-1]
        print(f"  rank {rank}: {answer.get('at', '?')}"
              + (f"  | last #{last['seq']} {last['name']}" if last else ""))
    missing = ranks.unanswered(answers)
    if missing:
        print(f"  {missing}")
    findings = diagnose(answers)
    if findings:
        print()
        print("\n".join(findings))
    return 0 if answers and not missing else FAILED
