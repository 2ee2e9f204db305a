"""``python -m daifu ps | attach PID | send PID COMMAND``: reach a job that waits
on a crash, from another terminal (same user only; see engine/_control.py)."""

from __future__ import annotations

import sys

from ..engine._control import EndpointError, Session, list_jobs, request

#: exit statuses of ``send``
RESUMED, STILL_WAITING, FAILED, NO_JOB = 0, 1, 2, 3


def ps(args: list[str]) -> int:
    try:
        jobs = list_jobs()
    except EndpointError as exc:
        print(f"daifu ps: {exc}", file=sys.stderr)
        return NO_JOB
    if not jobs:
        print("no daifu job is waiting on a crash")
        return 0
    print(f"{'PID':>7}  {'WAITING':>8}  {'EXCEPTION':<24} WHERE / STATEMENT")
    for job in jobs:
        how = " (console on its terminal)" if job.get("console") else ""
        print(f"{job['pid']:>7}  {job['waiting_s']:>7.0f}s  {job['exc_type']:<24} "
              f"{job['where']} in {job['function']}(){how}")
        print(f"{'':>44}{job['statement']}")
        print(f"{'':>44}{' '.join(job.get('argv', []))}")
    return 0


def send(args: list[str]) -> int:
    if len(args) < 2 or not args[0].isdigit():
        print("usage: python -m daifu send PID COMMAND ...   (e.g. send 1234 retry,\n"
              "       send 1234 exec 'lr = 0.01', send 1234 p loss)", file=sys.stderr)
        return FAILED
    pid, words = int(args[0]), args[1:]
    text = " ".join(words)
    if words[0] == "exec" and len(words) > 1:
        text = "exec\n" + " ".join(words[1:]) + "\n"
    try:
        reply = request(pid, {"op": "send", "cmd": text})
    except (EndpointError, OSError) as exc:
        print(f"daifu send: {exc}", file=sys.stderr)
        return NO_JOB
    if reply.get("error"):
        print(f"daifu send: {reply['error']}", file=sys.stderr)
        return NO_JOB if "permission denied" in reply["error"] else FAILED
    if reply.get("output"):
        print(reply["output"], end="" if reply["output"].endswith("\n") else "\n")
    if not reply.get("ok"):
        return FAILED
    return RESUMED if reply.get("resumed") else STILL_WAITING


def attach(args: list[str]) -> int:
    if len(args) != 1 or not args[0].isdigit():
        print("usage: python -m daifu attach PID", file=sys.stderr)
        return FAILED
    pid = int(args[0])
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
        import readline  # noqa: F401 - line editing and history for input()
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

