"""The console as pdb's users expect it: ``up``/``down`` (the paper's
*focus*: inspect, exec and retry in a caller's frame), ``bt``, ``l``/``ll``,
``pp``, bare expressions, ``n = 5`` as Python, attribute completion; the
report's summaries and effects; log lines held back while the console has
the terminal."""

from __future__ import annotations

import io

import pytest

import daifu
from daifu.engine import ENGINE, _events
from daifu.engine._events import capture
from daifu.engine.human._console import Console, _loop, run_line
from daifu.engine.human._report import build

from .support import crashes, vaccinate

PROGRAM = '''
def load(path, attempts):
    attempts.append(path)
    return {"a.txt": 1, "b.txt": 2}[path]


def step(path, attempts):
    n = 5
    value = load(path, attempts)
    return value * 10


def train(paths):
    attempts = []
    out = []
    for path in paths:
        out.append(step(path, attempts))
    return out, attempts
'''


@pytest.fixture
def program():
    return vaccinate(PROGRAM, entries=("step", "train"))


def _session(crash, lines):
    transcript = []
    for line in lines:
        console, out = run_line(crash, ENGINE.door(crash), line, "test")
        transcript.append((line, console.ok, out.rstrip(), console.decision))
    return transcript


def test_up_inspects_and_changes_a_caller_then_retries_there(program):
    seen = {}

    @daifu.on(KeyError)
    def console(crash):
        if crash.function != "step":
            return None
        # load() is not vaccinated: the crash is at step()'s statement; the fix
        # belongs to train(), which picked the path
        seen["session"] = _session(crash, [
            "bt", "up", "p path", "!path = 'b.txt'", "down", "p n", "up", "retry"])
        return None  # the console queued the decision

    with capture() as events:
        out, attempts = program["train"](["a.txt", "c.txt"])
    assert out == [10, 20] and attempts == ["a.txt", "c.txt", "b.txt"]
    session = {line: (ok, text, decision) for line, ok, text, decision in seen["session"]}
    bt = session["bt"][1].splitlines()
    assert ">  0" in bt[-2] and "in step()" in bt[-2] and "crashed here" in bt[-2]
    assert any("in train()" in line for line in bt)
    assert "> frame 1" in session["up"][1] and "in train()" in session["up"][1]
    assert session["p path"][1] == "'c.txt'"  # train()'s variable
    assert session["p n"][1] == "5"  # down: step()'s again
    assert session["retry"][2] is daifu.RETRY
    passed = [e for e in events if e["event"] == "crash.passed"]
    assert len(passed) == 1 and "retry in caller frame 1 (train)" in passed[0]["reason"]
    crashes = [e["function"] for e in events if e["event"] == "crash.intercepted"]
    assert crashes == ["step", "train"]  # train's barrier took the retry, nobody was asked
    resumed = [e for e in events if e["event"] == "crash.resumed"]
    assert len(resumed) == 1 and resumed[0]["where"].endswith(":17")


def test_a_decision_for_a_caller_that_is_not_vaccinated_is_refused(program):
    answers = []

    @daifu.on(KeyError)
    def console(crash):
        answers.extend(_session(crash, ["up 2", "retry", "down 2", "!path = 'a.txt'",
                                        "retry"]))
        return None

    # frame 2 is this test function: not vaccinated, no barrier to retry in
    out, _ = program["train"](["c.txt"])
    assert out == [10]
    up2, retry_up, *_rest, retry = answers
    assert "frame 2" in up2[2]
    assert retry_up[1] is False and "is not vaccinated" in retry_up[2]
    assert retry[3] is daifu.RETRY


def test_a_line_that_looks_like_python_is_python_not_a_command(program):
    lines = {}

    @daifu.on(KeyError)
    def console(crash):
        if crash.function != "step":
            return None
        lines.update({line: (ok, text, decision) for line, ok, text, decision in _session(
            crash, ["n = 7", "p n", "n * 2", "r = 3", "pp {'k': [1, 2]}", "p (n)",
                    "!(n, r) = (1, 2)", "p (n, r)", "!path = 'a.txt'", "retry"])})
        return None

    out, attempts = program["train"](["c.txt"])
    assert out == [10]
    assert lines["n = 7"][2] is None and lines["r = 3"][2] is None  # no decision taken
    assert lines["p n"][1] == "7" and lines["n * 2"][1] == "14" and lines["p (n)"][1] == "7"
    assert lines["pp {'k': [1, 2]}"][1] == "{'k': [1, 2]}"
    assert lines["p (n, r)"][1] == "(1, 2)"  # `!(...` is a statement, not cmd's shell
    assert lines["retry"][2] is daifu.RETRY


def test_listing_and_completion_follow_the_focus(program):
    seen = {}

    @daifu.on(KeyError)
    def console(crash):
        if crash.function != "step":
            return None
        c = Console(crash, ENGINE.door(crash), stdin=io.StringIO(), stdout=io.StringIO(),
                    local=False)
        seen["names"] = c.completedefault("pa", "pa", 0, 2)
        seen["attrs"] = c.completedefault("attempts.app", "attempts.app", 0, 12)
        seen["call"] = c.completedefault("load(1).x", "load(1).x", 0, 9)  # never called
        seen["l"] = _session(crash, ["l"])[0][2]
        seen["ll_up"] = _session(crash, ["up", "ll"])[1][2]
        _session(crash, ["down", "!path = 'a.txt'", "retry"])
        return None

    program["train"](["c.txt"])
    assert "path" in seen["names"] and "paths" not in seen["names"]  # step()'s, not train()'s
    assert seen["attrs"] == ["attempts.append"]
    assert seen["call"] == []
    assert "->     value = load(path, attempts)" in seen["l"]
    assert "def train(paths):" in seen["ll_up"] and "->         out.append(step(" in seen["ll_up"]


def test_report_does_not_claim_the_call_that_raised():
    ns = vaccinate('''
def f(x):
    return x + 1

def g(x):
    raise ValueError("g failed")

def train(xs):
    for x in xs:  # iterate over the data (a comment)
        y = g(f(x))
''', entries=("train",))
    reports = []

    @daifu.on(ValueError)
    def look(crash):
        reports.append(build(crash))
        return daifu.ABORT

    with crashes(ValueError):
        ns["train"]([1])
    assert reports[0].done_before == ["call: f(x)"]  # g(f(x)) raised: it did not do its work


def test_a_loop_header_is_shown_without_its_comment():
    ns = vaccinate('''
def data():
    raise OSError("shard missing")

def train():
    for x in data():  # iterate over the data (a comment)
        pass
''', entries=("train",))
    statements = []

    @daifu.on(OSError)
    def look(crash):
        statements.append(crash.statement)
        return daifu.ABORT

    with crashes(OSError):
        ns["train"]()
    assert statements == ["for x in data():"]


def test_report_summarises_user_modules_and_batches_on_one_line():
    torch = pytest.importorskip("torch", reason="PyTorch not available")
    from daifu.engine.human._report import summarize

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3, 2)

    class Adam2(torch.optim.Adam):
        pass

    net = Net()
    assert summarize(net) == "Net module, 8 parameters, training=True"
    assert summarize(Adam2(net.parameters(), lr=0.5)).startswith("Adam2 optimizer, 1 param group")
    batch = [torch.ones(2, 3), torch.zeros(2, dtype=torch.int64)]
    assert summarize(batch) == ("list of 2: [tensor(2, 3) float32 cpu min=1 max=1, "
                                "tensor(2,) int64 cpu min=0 max=0]")
    assert summarize({"x": torch.ones(1), "n": 3}) == \
        "dict of 2: {'x': tensor(1,) float32 cpu min=1 max=1, 'n': 3}"
    assert "\n" not in summarize(torch.nn.Sequential(torch.nn.Linear(2, 2)))


def test_log_lines_wait_while_the_console_has_the_terminal(program, monkeypatch):
    timeline = []
    texts = []

    class Recorder(io.StringIO):
        def __init__(self, who):
            super().__init__()
            self.who = who

        def write(self, text):
            timeline.append(self.who)
            texts.append((self.who, text))
            return len(text)

        def isatty(self):
            return False

    monkeypatch.setattr("sys.stderr", Recorder("log"))
    _events.configure()  # daifu's events on (the current) sys.stderr

    @daifu.on(KeyError)
    def console(crash):
        if crash.function != "step":
            return None
        c = Console(crash, ENGINE.door(crash), stdin=io.StringIO("!path = 'a.txt'\nretry\n"),
                    stdout=Recorder("console"), local=True)
        c.use_rawinput = False
        _loop(c, crash)
        timeline.append("closed")
        return None

    try:
        assert program["train"](["c.txt"])[0] == [10]
    finally:
        _events.configure()
    first_console = timeline.index("console")
    last_console = len(timeline) - 1 - timeline[::-1].index("console")
    assert "log" in timeline[:first_console]  # crash.intercepted comes before the report
    # patch.applied (the exec, the decision) waited for the console to finish...
    assert "log" not in timeline[first_console:last_console], [t for t in texts if t[0] == "log"]
    assert "log" in timeline[last_console:timeline.index("closed")]  # ...then was written


def test_a_change_made_in_a_caller_is_journaled_with_its_frame_and_replayed(program, tmp_path):
    from daifu.engine.persist._journal import Journal, Replay

    from .support import read_events

    journal = tmp_path / "j.jsonl"
    ENGINE.journal = Journal(str(journal))

    @daifu.on(KeyError)
    def console(crash):
        if crash.function != "step":
            return None
        _session(crash, ["up", "!path = 'b.txt'", "retry"])
        return None

    first = program["train"](["a.txt", "c.txt"])
    records = [r for r in read_events(journal) if r["type"] == "patch"]
    exec_record = next(r for r in records if r["kind"] == "exec")
    assert exec_record["frame"] == 1 and exec_record["frame_function"] == "train"

    ENGINE.reset()
    ENGINE.replay = Replay(str(journal))  # no rule now: the journal fixes it
    assert program["train"](["a.txt", "c.txt"]) == first == ([10, 20],
                                                              ["a.txt", "c.txt", "b.txt"])


def test_up_and_down_by_function_name(program):
    # `send --job PID up` moved every rank by one frame although the ranks'
    # stacks differed in depth: `up NAME` lands in the same function on each
    seen = {}

    @daifu.on(KeyError)
    def console(crash):
        if crash.function != "step":
            return None
        seen["session"] = _session(crash, [
            "up train", "p path", "down step", "p n", "up nowhere", "down train",
            "up train", "!path = 'b.txt'", "retry"])
        return None

    out, _ = program["train"](["a.txt", "c.txt"])
    assert out == [10, 20]
    s = seen["session"]
    assert s[0][1] and "in train()" in s[0][2]
    assert s[1][2] == "'c.txt'"
    assert s[2][1] and s[3][2] == "5"
    assert not s[4][1] and "no frame of nowhere() above" in s[4][2]
    assert not s[5][1] and "no frame of train() below" in s[5][2]
    assert s[8][3] is daifu.RETRY


def test_all_bang_statement_and_checkpoint_path_are_commands_not_python(program):
    # `all !x = 1` was rejected as "not Python either"; `checkpoint /tmp/x.pt`
    # would have been evaluated as a division
    seen = {}

    @daifu.on(KeyError)
    def console(crash):
        if crash.function != "step":
            return None
        seen["all"] = run_line(crash, ENGINE.door(crash), "all !n = 6", "test")[1]
        seen["checkpoint"] = run_line(crash, ENGINE.door(crash), "checkpoint /nonexistent/x.pt",
                                      "test")[1]
        seen["assign"] = run_line(crash, ENGINE.door(crash), "checkpoint = 3", "test")
        crash.vars["path"] = "b.txt"
        return daifu.RETRY

    program["train"](["c.txt"])
    assert "not Python" not in seen["all"] and "distributed" in seen["all"]
    assert "NameError" not in seen["checkpoint"] and "ZeroDivision" not in seen["checkpoint"]
    assert seen["assign"][0].ok  # (an assignment to a variable named checkpoint)


def test_rank_n_on_rank_ns_own_console(program, monkeypatch):
    # `rank 1` on rank 1's console said rank 1 does not wait, though `ranks` listed it
    from daifu.engine import _job
    from daifu.engine.remote import _jobstore

    monkeypatch.setattr(_job, "distributed", lambda: {"job": "j", "rank": 1,
                                                         "world_size": 2})
    monkeypatch.setattr(_jobstore.JobRanks, "statuses", lambda self, timeout=5.0: {})
    seen = {}

    @daifu.on(KeyError)
    def console(crash):
        if crash.function != "step":
            return None
        seen["own"] = run_line(crash, ENGINE.door(crash), "rank 1", "test")[1]
        seen["other"] = run_line(crash, ENGINE.door(crash), "rank 0", "test")[1]
        crash.vars["path"] = "b.txt"
        return daifu.RETRY

    program["train"](["c.txt"])
    assert "this is rank 1's own crash" in seen["own"]
    assert "rank '0' does not wait on a crash" in seen["other"]


def test_abort_gives_up_the_crash_wherever_the_focus_is(program):
    answers = []

    @daifu.on(KeyError)
    def console(crash):
        if crash.function != "step":
            return None
        answers.extend(_session(crash, ["up", "abort"]))
        return None

    with capture() as events, crashes(KeyError):
        program["train"](["c.txt"])
    (_, up_ok, _, _), (_, abort_ok, text, decision) = answers
    assert up_ok and abort_ok and decision is daifu.ABORT, text
    assert [e["reason"] for e in events if e["event"] == "crash.gave_up"] == ["aborted by a fix"]


def test_a_decision_the_callers_statement_cannot_take_is_refused_at_once(program):
    answers = []

    @daifu.on(KeyError)
    def console(crash):
        if crash.function != "step":
            return None
        # train()'s statement is inside its for loop: next works there; frame 1
        # is train(), whose `out.append(step(...))` can be retried or skipped
        answers.extend(_session(crash, ["up", "next"]))
        return None

    out, _ = program["train"](["c.txt", "a.txt"])
    assert out == [10]
    assert answers[1][1] and answers[1][3] is daifu.CONTINUE


def test_next_in_a_caller_without_a_loop_is_refused_before_anything_moves():
    ns = vaccinate(PROGRAM + '''
def main():
    return step("c.txt", [])
''', entries=("step", "main"))
    answers = []

    @daifu.on(KeyError)
    def console(crash):
        if crash.function != "step":
            return None
        answers.extend(_session(crash, ["up", "next", "down", "!path = 'a.txt'", "retry"]))
        return None

    assert ns["main"]() == 10
    _, (_, ok, text, decision), *_ = answers
    assert not ok and decision is None
    assert "cannot continue in caller frame 1 (main)" in text, text


def test_up_says_when_a_retry_there_would_remake_a_dataloader_iterator():
    pytest.importorskip("torch", reason="PyTorch not available")
    ns = vaccinate('''
import torch
from torch.utils.data import DataLoader

def epoch(loader, seen):
    for batch in loader:
        seen.append(batch)
        if len(seen) == 2:
            raise RuntimeError("bad batch")

def train(loader, seen):
    for _ in range(1):
        epoch(loader, seen)
    return seen
''', entries=("epoch", "train"))
    answers = []

    options = []

    @daifu.on(RuntimeError)
    def console(crash):
        from daifu.engine.human._report import build

        options.extend(build(crash).options)
        answers.extend(_session(crash, ["up", "down", "up", "skip"]))
        return None

    import torch
    from torch.utils.data import DataLoader

    loader = DataLoader(torch.arange(8), batch_size=2, shuffle=True)
    assert len(ns["train"](loader, [])) == 2  # skip in train(): the epoch call is left
    # the report's options say it before anyone chooses
    assert [o for o in options if o.startswith("retry in caller train() (up train, retry) -- note: "
                                               "epoch() iterates loader (a DataLoader)")], options
    up, down, _, _ = answers
    assert "note: retry here re-executes the call: epoch() iterates loader (a DataLoader): " \
           "the retry makes a new iterator of it, which draws a new seed" in up[2]
    assert "note:" not in down[2]  # (frame 0: a retry repeats the statement alone)


def test_library_frames_are_collapsed_and_passed_by_up_and_down():
    pytest.importorskip("torch", reason="PyTorch not available")
    ns = vaccinate('''
import torch

class Net(torch.nn.Module):
    def forward(self, x):
        return x / self.scale

def train(net, xs):
    out = []
    for x in xs:
        out.append(net(x))
    return out
''', entries=("Net.forward", "train"))
    answers = []

    @daifu.on(AttributeError)
    def console(crash):
        if crash.function == "train":
            return daifu.SKIP  # (passed on by the session below: skipped in the loop)
        report = build(crash).render()
        answers.append(("report", True, report, None))
        answers.extend(_session(crash, ["bt", "bt all", "up", "p len(out)", "down", "skip"]))
        return None

    import torch

    assert ns["train"](ns["Net"](), [torch.ones(2)]) == []
    said = {line: text for line, _, text, _ in answers}
    assert "frames of torch (the console's bt all shows them)" in said["report"]
    assert "_call_impl" not in said["report"]
    assert "frames of torch (bt all shows them)" in said["bt"] and "_call_impl" not in said["bt"]
    assert "_call_impl" in said["bt all"]
    assert "in train()" in said["up"] and said["p len(out)"] == "0"
    assert "frame 0" in said["down"] and "in Net.forward()" in said["down"]
