"""The crash benchmark: every case recovered in situ and proved exact.

    python -m tests.scenarios.run                  # all cases, prints the table
    python -m tests.scenarios.run --fast           # the CI subset
    python -m tests.scenarios.run --table docs/benchmark.md   # rewrite the doc's table

Each case folder holds ``case.json`` (metadata), ``buggy.py`` (crashes
mid-run; or ``"buggy"`` names the reference program, run with the
``"buggy_args"`` that switch its fault on), ``corrected.py`` (the fixed program, the reference) or
``reference.py`` (for skip semantics: the same work skipped explicitly), and
its in-situ fix: ``fix.py`` (rules, possibly editing the source and
returning ``daifu.RELOAD``) and/or ``session.txt`` (console commands sent
over the control socket, one per line, as a person would type them).
A case may instead name another case's folder in ``"program"`` and run those
programs with its own ``"args"`` (cnn_loader_corrupt_w2 = w0 with workers).
Code several programs share lives in ``_common.py``; a crash site never does
(only the script itself is vaccinated).

A case with ``"mode": "resume"`` is not fixed in situ: nobody fixes the
crash (or, with ``"hang"``, the job hangs and daifu's watchdog ends it;
with ``"sigterm_after": TAG``, SIGTERM preempts the job after
that iteration), daifu saves its emergency checkpoint, and the corrected
program, started again with ``--resume PATH``, goes on with
``daifu.resume``; its restore time runs from that launch.  A case with
``"mode": "watch"`` only looks hung, or has a straggler: under daifu it
must run to its end unchanged, its straggler named, no hang named.

For every case the runner checks that the crash was intercepted at the
expected statement with the expected exception, that the fix was applied and
the run finished, and compares the final parameters with the reference run
bit for bit.  It also measures the restore time the paper's way -- from the
exception to the end of the crashing iteration -- against restarting from
scratch: a fresh process of the corrected program up to the end of the same
iteration (the reference run provides it).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..support import load_params, read_events, same_params

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


@dataclass
class Case:
    name: str
    path: Path
    meta: dict

    @property
    def fast(self) -> bool:
        return bool(self.meta.get("fast"))

    @property
    def programs(self) -> Path:
        """The folder with the case's programs and fix: its own, or the one
        ``"program"`` names (a case that runs another's programs with other
        ``"args"``)."""
        return HERE / self.meta.get("program", self.name)


@dataclass
class Result:
    name: str
    scenario: str
    family: str
    exception: str
    patch: str
    recovered: bool = False
    exact: bool | None = None
    restore_ms: float | None = None
    restart_s: float | None = None
    ratio: float | None = None
    statement: str = ""
    problems: list[str] = field(default_factory=list)
    note: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems


def load_cases(names: list[str] | None = None, fast: bool = False) -> list[Case]:
    cases = []
    for meta_path in sorted(HERE.glob("*/case.json")):
        meta = json.loads(meta_path.read_text())
        case = Case(meta_path.parent.name, meta_path.parent, meta)
        if names and case.name not in names:
            continue
        if fast and not case.fast and not names:
            continue
        cases.append(case)
    return cases


def _env(log: Path) -> dict:
    # (PYTHONFAULTHANDLER: a process killed by a signal prints every thread's stack)
    env = dict(os.environ, PYTHONHASHSEED="0", DAIFU_BENCH_LOG=str(log), OMP_NUM_THREADS="1",
               PYTHONFAULTHANDLER="1")
    env.pop("DAIFU_MODULES", None)
    return env


def _iterations(path: Path) -> list[tuple[str, float]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        tag, _, stamp = line.rpartition("\t")
        out.append((tag, float(stamp)))
    return out


def _stamp(event: dict) -> float:
    return dt.datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()


def _run_session(proc: subprocess.Popen, lines: list[str], timeout: float) -> list[dict]:
    from daifu.engine.remote._control import request
    from daifu.engine.remote._rundir import EndpointError

    sock = Path(os.environ.get("DAIFU_RUNTIME_DIR", "")) / f"{proc.pid}.sock"
    replies = []
    deadline = time.monotonic() + timeout
    for line in lines:
        while True:  # the endpoint exists only while a crash waits
            if proc.poll() is not None:
                return replies
            if time.monotonic() > deadline:
                raise TimeoutError("the job never waited on a crash")
            try:
                if sock.exists():
                    reply = request(proc.pid, {"op": "send", "cmd": line.replace("\\n", "\n")},
                                    timeout=timeout)
                    break
            except OSError:
                pass
            except EndpointError:  # gone between two crashes: nothing was sent
                if sock.exists():
                    raise
            time.sleep(0.02)
        replies.append(reply)
    return replies


def _run_rank_session(proc: subprocess.Popen, lines: list[str], timeout: float,
                      waiting: int, delay: float) -> list[dict]:
    """A session with a distributed job: once ``waiting`` ranks wait on a
    crash (and ``delay`` seconds more), each line goes to the first waiting
    rank, or -- ``job: COMMAND`` -- to every waiting rank (``send --job``)."""
    from daifu.engine.remote._control import list_jobs, request, send_to_ranks

    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            return []
        if time.monotonic() > deadline:
            raise TimeoutError(f"{waiting} rank(s) never waited on a crash")
        ranks = sorted((j for j in list_jobs() if "rank" in j), key=lambda j: j["rank"])
        if len(ranks) >= waiting:
            break
        time.sleep(0.1)
    time.sleep(delay)
    replies = []
    for line in lines:
        text = line.replace("\\n", "\n")
        if text.startswith("job:"):
            answers = send_to_ranks(ranks, text[4:].strip())
            replies += [answers[j["pid"]] for j in ranks]
        else:
            replies.append(request(ranks[0]["pid"], {"op": "send", "cmd": text},
                                   timeout=timeout))
    return replies


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _Launchers:
    """The live run of a distributed case with more than one launcher.

    * ``nodes`` > 1: one job on simulated nodes -- one torchrun launcher per
      node (``--nnodes``, a c10d rendezvous on 127.0.0.1), each node with a
      runtime directory of its own; the session is typed on the *last* node
      (``python -m daifu send --job``), so it reaches the others only through
      the job's store.
    * ``concurrent``: the same job twice, side by side, both launched alike
      (no ``--standalone``, no ``--rdzv-id``: the run id ``none`` for both);
      the session fixes the first, which must finish exact while the second
      still waits untouched (then it is aborted, and must fail as without
      daifu)."""

    def __init__(self, cmd: list[str], cwd: Path, env: dict, ranks: int, nodes: int,
                 concurrent: bool):
        tail = cmd[cmd.index("daifu") - 1:]  # (-m daifu ... buggy.py ...)
        self.cwd = cwd
        self.procs: list[subprocess.Popen] = []
        self.runtime: list[str] = []
        self.pids: set[int] = set()
        self.other: subprocess.Popen | None = None
        run = [sys.executable, "-m", "torch.distributed.run"]
        if nodes > 1:
            port = _free_port()
            for node in range(nodes):
                directory = cwd.parent / f"node{node}"
                directory.mkdir(mode=0o700, exist_ok=True)
                self.runtime.append(str(directory))
                self.procs.append(subprocess.Popen(
                    [*run, "--nnodes", str(nodes), "--nproc-per-node", str(ranks // nodes),
                     "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                     "--rdzv-id", f"bench-{port}", *tail], cwd=cwd, env={
                         **env, "DAIFU_RUNTIME_DIR": str(directory)},
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                    text=True, start_new_session=True))
        else:
            self.runtime.append(os.environ["DAIFU_RUNTIME_DIR"])
            twin = cwd.parent / f"{cwd.name}-twin"
            shutil.copytree(cwd, twin)
            for where in (cwd, twin):
                # (the twin logs elsewhere: its events are not the case's)
                argv = tail if where == cwd else [
                    a.replace("events-{rank}", "twin-events-{rank}") for a in tail]
                self.procs.append(subprocess.Popen(
                    [*run, "--nproc-per-node", str(ranks), "--master-addr", "127.0.0.1",
                     "--master-port", str(_free_port()), *argv], cwd=where,
                    env={**env, "DAIFU_BENCH_LOG": env["DAIFU_BENCH_LOG"] if where == cwd
                         else str(cwd.parent / "twin.iter")},
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                    text=True, start_new_session=True))
            self.other = self.procs.pop()

    def _daifu(self, node: int, *args: str, timeout: float = 120.0):
        return subprocess.run([sys.executable, "-m", "daifu", *map(str, args)], cwd=self.cwd,
                              capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "DAIFU_RUNTIME_DIR": self.runtime[node]})

    def _ps(self, node: int) -> list[dict]:
        listed = json.loads(self._daifu(node, "ps", "--json").stdout or "[]")
        ranks = [j for j in listed if "rank" in j]
        self.pids |= {j["pid"] for j in ranks}
        return ranks

    def _mine(self, ranks: list[dict]) -> list[dict]:
        """The ranks of the job under test (not the twin's), waiting."""
        here = str(self.cwd) + os.sep
        return [j for j in ranks if j.get("state") == "waiting"
                and str(j.get("where", "")).startswith(here)]

    def session(self, lines: list[str], timeout: float, waiting: int
                ) -> tuple[list[dict], list[str]]:
        node = len(self.runtime) - 1  # the session is typed on the last node
        others = 2 * waiting if self.other is not None else waiting
        deadline = time.monotonic() + timeout
        while True:
            ranks = self._ps(node)
            if len([j for j in ranks if j.get("state") == "waiting"]) >= others:
                break
            if any(p.poll() is not None for p in self.procs) or time.monotonic() > deadline:
                seen = ", ".join(f"rank {j.get('rank')} {j.get('state')}" for j in ranks)
                return [], [f"{others} rank(s) never waited on a crash (the last ps from node "
                            f"{node} listed: {seen or 'none'})"]
            time.sleep(0.3)
        target = next(j for j in self._mine(ranks) if j.get("host") is None)
        twin_job = {j["job"] for j in ranks} - {target["job"]}
        replies = []
        for line in lines:
            text = line.replace("\\n", "\n")
            job = text.startswith("job:")
            words = text[4:].strip() if job else text
            argv = ["send", *(["--job"] if job else []), str(target["pid"]), *(
                words.split(" ", 1) if words.startswith("exec ") else [words])]
            done = self._daifu(node, *argv, timeout=timeout)
            replies.append({"ok": done.returncode in (0, 1), "command": line,
                            "output": done.stdout + done.stderr})
        problems = []
        if self.other is not None:
            still = [j for j in self._ps(node) if j.get("job") in twin_job
                     and j.get("state") == "waiting"]
            if len(still) != waiting or self.other.poll() is not None:
                problems.append(f"the other job was touched: {len(still)} of its ranks wait")
            self._daifu(node, "send", "--job", str(still[0]["pid"]) if still else "0", "abort")
            _, err = self.other.communicate(timeout=timeout)
            if self.other.returncode == 0 or "Traceback" not in err:
                problems.append("the other job, aborted, did not fail as without daifu")
        return replies, problems

    def finish(self, timeout: float) -> tuple[int, str]:
        """The first non-zero exit code, and the end of every launcher's
        stderr (a rank that dies takes the others down with it: the first to
        fail is seldom the last to print)."""
        code, errors = 0, ""
        for node, proc in enumerate(self.procs):
            _, err = proc.communicate(timeout=timeout)
            code = code or proc.returncode
            if proc.returncode:
                # the ranks print before the launcher's own traceback, which
                # says only that they failed: show the ranks' end, then its summary
                cut = err.rfind("Traceback (most recent call last)")
                ranks = err[:cut] if cut > 0 else ""
                errors += (f"\n--- launcher {node} (exit {proc.returncode}):\n"
                           f"{ranks[-2500:]}\n[launcher]\n{err[-700:]}")
        return code, errors

    def close(self) -> None:
        import signal

        for pid in self.pids:  # (torchrun starts each rank in a session of its own)
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for proc in [*self.procs, *([self.other] if self.other else [])]:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.communicate()


def run_case(case: Case, workdir: Path, timeout: float = 300.0) -> Result:
    meta = case.meta
    res = Result(case.name, meta["scenario"], meta["family"], meta["exception"], meta["patch"],
                 note=meta.get("note", ""))
    missing = [m for m in meta.get("requires", []) if importlib.util.find_spec(m) is None]
    if missing:
        res.problems.append(f"needs {', '.join(missing)}: install the test extras "
                            "(pip install -e '.[test,frameworks]')")
        return res
    work = workdir / case.name
    own = [f for f in ("fix.py", "session.txt") if (case.path / f).exists()]
    for side in ("reference", "live"):  # separate trees: runs leave files behind
        shutil.copytree(case.programs, work / side / case.name)
        shutil.copy(HERE / "_common.py", work / side / "_common.py")
        if own and case.path != case.programs:  # the case's own fix replaces the program's
            for name in ("fix.py", "session.txt"):
                (work / side / case.name / name).unlink(missing_ok=True)
                if name in own:
                    shutil.copy(case.path / name, work / side / case.name / name)
    rdir, cdir = work / "reference" / case.name, work / "live" / case.name
    args = meta.get("args", [])
    reference = meta.get("reference", "corrected.py")
    ranks = int(meta.get("ranks", 0))
    # a distributed case: every program runs as `ranks` processes under torchrun
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone",
              "--nproc-per-node", str(ranks)] if ranks else [sys.executable]

    # 1. the reference: a fresh process of the corrected program (also the restart baseline)
    ref_log = work / "reference.iter"
    started = time.time()
    ref = subprocess.run([*launch, reference, "--out", "reference.pt", *args], cwd=rdir,
                         capture_output=True, text=True, timeout=timeout, env=_env(ref_log))
    for _ in range(3):
        if not (ranks and ref.returncode != 0 and "(SIGABRT)" in ref.stderr):
            break
        time.sleep(1.0)
        # the reference runs without daifu: torch 2.13's gloo aborting a rank
        # (std::terminate, SIGABRT; a few runs in a hundred under load, with
        # or without daifu) is not what this case tests -- run it again, from
        # scratch (three times at most)
        ref_log.unlink(missing_ok=True)
        started = time.time()
        ref = subprocess.run([*launch, reference, "--out", "reference.pt", *args], cwd=rdir,
                             capture_output=True, text=True, timeout=timeout, env=_env(ref_log))
    if ref.returncode != 0:
        res.problems.append(f"reference run failed: {ref.stderr[-1500:]}")
        return res
    ref_iters = [(tag, t - started) for tag, t in _iterations(ref_log)]
    if meta.get("mode") == "resume":
        return _resume_case(res, meta, work, rdir, cdir, args, ref_iters, timeout, launch, ranks)
    if meta.get("mode") == "watch":
        return _watched_case(res, meta, work, cdir, args, timeout, launch, ranks)

    # 2. the buggy program under daifu, with its fix
    live_log, events_path = work / "live.iter", work / "events.jsonl"
    if ranks:  # one event log per rank (torchrun takes --log for its --log-dir)
        cmd = [*launch, "-m", "daifu", "--log-file", str(work / "events-{rank}.jsonl")]
    else:
        cmd = [*launch, "-m", "daifu", "--log", str(events_path), "--journal",
               str(work / "journal.jsonl")]
    if (cdir / "fix.py").exists():
        cmd += ["--fixes", "fix.py"]
    session = (cdir / "session.txt").read_text().splitlines() if (cdir / "session.txt").exists() \
        else []
    if session:
        cmd += ["--wait", "60"]
    cmd += [_buggy(meta), "--out", "live.pt", *args, *meta.get("buggy_args", [])]
    nodes = int(meta.get("nodes", 1))
    replies: list[dict] = []
    if nodes > 1 or meta.get("concurrent"):
        # several launchers: two nodes of one job, or two jobs side by side
        group = _Launchers(cmd, cdir, _env(live_log), ranks, nodes, bool(meta.get("concurrent")))
        try:
            replies, problems = group.session([s for s in session if s.strip()], timeout,
                                              int(meta.get("waiting_ranks", 1)))
            res.problems += problems
            returncode, err = group.finish(timeout)
        finally:
            group.close()
    else:
        proc = subprocess.Popen(cmd, cwd=cdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, text=True, env=_env(live_log))
        try:
            if session and ranks:
                replies = _run_rank_session(proc, [s for s in session if s.strip()], timeout,
                                            int(meta.get("waiting_ranks", 1)),
                                            float(meta.get("session_delay_s", 0)))
            elif session:
                replies = _run_session(proc, [s for s in session if s.strip()], timeout)
            _, err = proc.communicate(timeout=timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
        returncode = proc.returncode
    if ranks:
        events = sorted((e for r in range(ranks)
                         for e in read_events(work / f"events-{r}.jsonl")), key=_stamp)
    else:
        events = read_events(events_path)
    for reason in meta.get("refused", []):
        if not [e for e in events if e["event"] == "patch.rejected" and reason in e["reason"]]:
            res.problems.append(f"no decision was refused with {reason!r}")
    crashes = [e for e in events if e["event"] == "crash.intercepted"]
    if returncode != 0 and ranks:
        for r in range(ranks):
            said = [e["event"] for e in read_events(work / f"events-{r}.jsonl")]
            res.problems.append(f"rank {r} logged: {', '.join(said) or 'nothing'}")
    if returncode != 0:
        res.problems.append(f"the run under daifu failed (exit {returncode}): {err[-8000:]}")
    if not crashes:
        res.problems.append("no crash was intercepted")
        return res
    first = crashes[0]
    if first["exc_type"] != meta["exception"]:
        res.problems.append(f"intercepted {first['exc_type']}, expected {meta['exception']}")
    # the crash is taken first where it is raised, then handed up to the
    # caller whose rule fixes it: the expected statement is where the fix is
    # (first-call vaccination reaches helpers without a loop, too)
    # (one exception, one report: a caller that took it after frames below
    # passed it up is named by the outcome -- crash.resumed, crash.gave_up)
    taken = crashes + [e for e in events if e["event"] in ("crash.resumed", "crash.gave_up")
                       and e.get("passed_through")]
    at = [c for c in taken if meta["statement"] in c.get("statement", "")
          and c.get("function") == meta["function"]]
    res.statement = (at[0] if at else first)["statement"]
    if not at:
        res.problems.append(f"intercepted at {first['function']}: {first['statement']!r}, expected "
                            f"{meta['function']}: {meta['statement']!r}")
    if not [e for e in events if e["event"] == "patch.applied"]:
        res.problems.append("no patch was applied")
    if [e for e in events if e["event"] == "crash.gave_up"]:
        res.problems.append("daifu gave up on a crash")
    for reply in replies:
        if not reply.get("ok"):
            res.problems.append(f"session command failed: {reply}")
    res.recovered = returncode == 0 and bool(
        [e for e in events if e["event"] == "crash.resumed"])
    if meta.get("mutating_call"):
        reports = [e for e in events if e["event"] == "crash.report"]
        said = " ".join(x for r in reports for x in r.get("done_before", []))
        if meta["mutating_call"] not in said:
            res.problems.append(
                f"the report did not warn about {meta['mutating_call']!r}: {said!r}")

    # 3. proof: bit-identical parameters
    if (cdir / "live.pt").exists():
        res.exact = same_params(load_params(cdir / "live.pt"), load_params(rdir / "reference.pt"))
        if not res.exact and meta.get("exact", True):
            res.problems.append("final parameters differ from the reference run")
    else:
        res.problems.append("the run under daifu saved no parameters")

    # 4. a blind retry would have been wrong (non-idempotent cases)
    if meta.get("blind_fix"):
        shutil.rmtree(cdir)
        shutil.copytree(case.programs, cdir)
        blind = subprocess.run([sys.executable, "-m", "daifu", "--log", str(work / "blind.jsonl"),
                                "--fixes", meta["blind_fix"], _buggy(meta), "--out", "blind.pt",
                                *args, *meta.get("buggy_args", [])], cwd=cdir, capture_output=True, text=True,
                               timeout=timeout, env=_env(work / "blind.iter"))
        if blind.returncode != 0:
            res.problems.append(f"the blind-retry run failed: {blind.stderr[-1000:]}")
        elif same_params(load_params(cdir / "blind.pt"), load_params(rdir / "reference.pt")):
            res.problems.append(
                "a blind retry gave the exact result too: not a non-idempotent case")

    # 5. restore time vs restart from scratch
    crash_t = _stamp(first)
    live_iters = _iterations(live_log)
    after = [(tag, t) for tag, t in live_iters if t >= crash_t]
    if ranks:  # the crashing iteration is the crashed rank's (tags end "rank N")
        after = [(tag, t) for tag, t in after if tag.endswith(f" rank {first.get('rank')}")]
    ref_tags = dict(ref_iters)
    for tag, t in after:
        if tag in ref_tags:
            res.restore_ms = round((t - crash_t) * 1000.0, 1)
            res.restart_s = round(ref_tags[tag], 2)
            res.ratio = round(res.restart_s * 1000.0 / max(res.restore_ms, 0.1), 0)
            break
    else:
        res.problems.append("no iteration finished after the crash in both runs")
    return res


def _buggy(meta: dict) -> str:
    """The program that crashes: ``buggy.py``, or -- a case whose bug is a
    switch of the reference program (``"buggy": "train.py"``, with its
    ``"buggy_args"``) -- that program."""
    return meta.get("buggy", "buggy.py")


def _resume_case(res: Result, meta: dict, work: Path, rdir: Path, cdir: Path, args: list,
                 ref_iters: list, timeout: float, launch: list, ranks: int) -> Result:
    """A case that is not fixed in situ: nobody fixes the crash (or SIGTERM
    preempts the job), daifu saves the emergency checkpoint, and the
    corrected program, started again with ``--resume PATH``, goes on from it
    with ``daifu.resume`` -- bit-identical to the reference.  Restore time:
    from the resumed process's launch to the end of the crashed iteration,
    against the reference's from its launch (a restart from scratch).  A
    distributed case (``ranks``) is preempted through torchrun's agent, and
    resumed from the manifest rank 0 wrote."""
    env = {**_env(work / "live.iter"), "DAIFU_CONSOLE": "0", "DAIFU_WAIT": "0",
           "DAIFU_CHECKPOINT_DIR": str(work / "ck")}
    logs = ["--log-file", str(work / "events-{rank}.jsonl")] if ranks else \
        ["--log", str(work / "events.jsonl")]
    cmd = [*launch, "-m", "daifu", *logs, _buggy(meta), "--out", "crashed.pt", *args,
           *meta.get("buggy_args", [])]
    proc = subprocess.Popen(cmd, cwd=cdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, env=env)
    try:
        if meta.get("sigterm_after"):  # preempted once this iteration is done
            import signal

            deadline = time.monotonic() + timeout
            while not any(tag == meta["sigterm_after"]
                          for tag, _ in _iterations(work / "live.iter")):
                if proc.poll() is not None or time.monotonic() > deadline:
                    break
                time.sleep(0.01)
            proc.send_signal(signal.SIGTERM)  # (torchrun's agent passes it on to the ranks)
        _, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    events = sorted((e for r in range(ranks) for e in read_events(work / f"events-{r}.jsonl")),
                    key=_stamp) if ranks else read_events(work / "events.jsonl")
    _check_ended(res, meta, proc.returncode, err, events, ranks)
    saved = [e for e in events if e["event"] == "checkpoint.saved"]
    if len(saved) != max(ranks, 1):
        res.problems.append(f"{len(saved)} checkpoints saved, expected {max(ranks, 1)}: "
                            f"{err[-3000:]}")
        return res
    path = saved[0]["path"]
    if ranks:
        manifests = [e for e in events if e["event"] == "checkpoint.manifest"]
        if len(manifests) != 1 or not manifests[0]["consistent"]:
            res.problems.append(f"no consistent manifest of the ranks' files: {manifests}")
            return res
        path = manifests[0]["path"]
    # the corrected program, started again from the checkpoint
    resumed_log = work / "resumed.iter"
    launched = time.time()
    again = [*launch, meta.get("reference", "corrected.py"), "--resume", path, "--out",
             "live.pt", *args]
    resumed = subprocess.run(again, cwd=cdir, capture_output=True, text=True, timeout=timeout,
                             env=_env(resumed_log))
    for _ in range(2):  # (gloo aborting a rank of a run without daifu: as for the reference)
        if not (ranks and resumed.returncode != 0 and "(SIGABRT)" in resumed.stderr):
            break
        resumed_log.unlink(missing_ok=True)
        launched = time.time()
        resumed = subprocess.run(again, cwd=cdir, capture_output=True, text=True,
                                 timeout=timeout, env=_env(resumed_log))
    if resumed.returncode != 0:
        res.problems.append(f"the resumed run failed: {resumed.stderr[-3000:]}")
        return res
    res.recovered = True
    res.exact = same_params(load_params(cdir / "live.pt"), load_params(rdir / "reference.pt"))
    if not res.exact:
        res.problems.append("final parameters differ from the reference run")
    # restore: the resumed process's first iteration done (the crashed one,
    # run again) against the reference's time to the same iteration
    ref_tags = dict(ref_iters)
    first = _iterations(resumed_log)[:1]
    if first and first[0][0] in ref_tags:
        tag, t = first[0]
        res.restore_ms = round((t - launched) * 1000.0, 1)
        res.restart_s = round(ref_tags[tag], 2)
        res.ratio = round(res.restart_s * 1000.0 / max(res.restore_ms, 0.1), 1)
    else:
        res.problems.append(f"the resumed run's first iteration {first} is not the reference's")
    return res


def _watched_case(res: Result, meta: dict, work: Path, cdir: Path, args: list,
                  timeout: float, launch: list, ranks: int) -> Result:
    """A distributed job that only looks hung, or has a straggler
    (``"mode": "watch"``): under daifu it runs to its end, bit-identical to
    the reference; daifu's watchdog names the straggler (``"watch":
    {"straggler": RANK}``) and never a hang."""
    env = {**_env(work / "live.iter"), "DAIFU_CONSOLE": "0", "DAIFU_WAIT": "0",
           "DAIFU_CHECKPOINT_DIR": str(work / "ck")}
    cmd = [*launch, "-m", "daifu", "--log-file", str(work / "events-{rank}.jsonl"),
           *meta.get("daifu_args", []), _buggy(meta), "--out", "live.pt", *args,
           *meta.get("buggy_args", [])]
    run = subprocess.run(cmd, cwd=cdir, capture_output=True, text=True, timeout=timeout,
                         env=env, stdin=subprocess.DEVNULL)
    if run.returncode != 0:
        res.problems.append(f"the job did not run to its end (exit {run.returncode}): "
                            f"{run.stderr[-3000:]}")
        return res
    events = [e for r in range(ranks) for e in read_events(work / f"events-{r}.jsonl")]
    hangs = [e for e in events if e["event"] == "hang.detected"]
    if hangs:
        res.problems.append(f"a hang was named where there is none: {hangs}")
    stragglers = [e for e in events if e["event"] == "straggler"]
    expected = meta["watch"].get("straggler")
    if expected is None and stragglers:
        res.problems.append(f"a straggler was named where there is none: {stragglers}")
    if expected is not None:
        if [e["straggler"] for e in stragglers] != [expected] or \
                meta["statement"] not in stragglers[0]["at"]:
            res.problems.append(f"rank {expected} was not named once as the straggler at "
                                f"{meta['statement']!r}: {stragglers}")
        else:
            res.statement = stragglers[0]["at"]
    res.recovered = not res.problems
    res.exact = same_params(load_params(cdir / "live.pt"),
                            load_params(work / "reference" / cdir.name / "reference.pt"))
    if not res.exact:
        res.problems.append("final parameters differ from the reference run")
    return res


def _check_ended(res: Result, meta: dict, returncode: int, err: str, events: list,
                 ranks: int) -> None:
    """The preempted or crashed job ended as it would without daifu: killed
    by SIGTERM (a distributed job: torchrun's agent ends with an error), or
    the exception's traceback and status 1; a hung job (``"hang"``) named
    by daifu's watchdog within its threshold, then ended with status 124."""
    crashes = [e for e in events if e["event"] == "crash.intercepted"]
    if meta.get("hang"):  # ended by daifu's watchdog: named, then status 124
        hangs = [e for e in events if e["event"] == "hang.detected"]
        if returncode == 0 or "exitcode  : 124" not in err:
            res.problems.append(f"the hung job did not end with status 124 (exit {returncode})"
                                f": {err[-3000:]}")
        if len(hangs) != 1 or hangs[0]["behind"] != meta["hang"]["rank"] \
                or meta["statement"] not in hangs[0]["at"]:
            res.problems.append(f"the hang was not named as rank {meta['hang']['rank']} at "
                                f"{meta['statement']!r}: {hangs}")
        elif hangs[0]["idle_s"] > hangs[0]["threshold_s"] + 2.0:
            res.problems.append(f"the hang was named late: {hangs[0]}")
        res.statement = hangs[0]["at"] if hangs else ""
        return
    if meta.get("sigterm_after"):
        if (returncode == 0) if ranks else (returncode != -15):
            res.problems.append(f"SIGTERM did not end the job as python's (exit {returncode})"
                                f": {err[-3000:]}")
        return
    if returncode != 1 or f"{meta['exception']}:" not in err:
        res.problems.append(f"the crash did not end the job as without daifu (exit "
                            f"{returncode}): {err[-3000:]}")
    if not crashes:
        res.problems.append("no crash was intercepted")
    elif crashes[0]["exc_type"] != meta["exception"] or \
            meta["statement"] not in crashes[0].get("statement", ""):
        res.problems.append(f"intercepted {crashes[0]['exc_type']} at "
                            f"{crashes[0].get('statement')!r}, expected {meta['exception']} "
                            f"at {meta['statement']!r}")
    res.statement = crashes[0].get("statement", "") if crashes else ""


_VERSION = f"{sys.version_info[0]}.{sys.version_info[1]}"
#: each Python version's results go between its own markers in the doc
TABLE_START = f"<!-- scenario-table:start {_VERSION} -->"
TABLE_END = f"<!-- scenario-table:end {_VERSION} -->"


def table(results: list[Result]) -> str:
    import platform

    try:
        import torch
        versions = f"Python {platform.python_version()}, torch {torch.__version__}"
    except ImportError:
        versions = f"Python {platform.python_version()}"
    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} on {platform.machine()}, {os.cpu_count()} cores, "
        f"{versions}.",
        "",
        "| case | scenario | family | exception | patch | recovered | exact | restore (ms) "
        "| restart (s) | ratio |",
        "|---|---|---|---|---|---|---|---:|---:|---:|",
    ]
    for r in results:
        exact = {True: "yes", False: "no", None: "-"}[r.exact]
        lines.append(
            f"| {r.name} | {r.scenario} | {r.family} | {r.exception} | {r.patch} | "
            f"{'yes' if r.recovered else 'NO'} | {exact} | {r.restore_ms} | {r.restart_s} | "
            f"{r.ratio:.0f}x |" if r.ratio is not None else
            f"| {r.name} | {r.scenario} | {r.family} | {r.exception} | {r.patch} | "
            f"{'yes' if r.recovered else 'NO'} | {exact} | - | - | - |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.scenarios.run",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="*", help="case names (default: all)")
    parser.add_argument("--fast", action="store_true", help="only the cases marked fast (CI)")
    parser.add_argument("--table", metavar="FILE", help="rewrite the table in this Markdown file")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON")
    ns = parser.parse_args(argv)
    cases = load_cases(ns.cases, ns.fast)
    results = []
    with tempfile.TemporaryDirectory(prefix="daifu-scenarios-") as tmp:
        os.environ.setdefault("DAIFU_RUNTIME_DIR", os.path.join(tmp, "run"))
        os.makedirs(os.environ["DAIFU_RUNTIME_DIR"], mode=0o700, exist_ok=True)
        os.environ.setdefault("XDG_STATE_HOME", os.path.join(tmp, "state"))
        for case in cases:
            t0 = time.monotonic()
            result = run_case(case, Path(tmp))
            results.append(result)
            status = "ok " if result.ok else "FAIL"
            print(f"{status} {case.name:32s} {time.monotonic() - t0:5.1f}s  restore "
                  f"{result.restore_ms} ms  restart {result.restart_s} s  "
                  f"{'; '.join(result.problems)}", flush=True)
    print()
    print(table(results))
    if ns.json:
        Path(ns.json).write_text(json.dumps([asdict(r) for r in results], indent=1))
    if ns.table:
        doc = Path(ns.table)
        text = doc.read_text()
        if TABLE_START not in text:  # a version measured for the first time: a new section
            text += f"\n### CPython {_VERSION}\n\n{TABLE_START}\n{TABLE_END}\n"
        start, end = text.index(TABLE_START) + len(TABLE_START), text.index(TABLE_END)
        doc.write_text(text[:start] + "\n" + table(results) + "\n" + text[end:])
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
