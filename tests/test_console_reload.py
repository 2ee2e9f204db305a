"""In-process tests of the report, console commands, reload and replay."""

from __future__ import annotations

import ast
import contextlib
import importlib
import sys
import textwrap

import pytest

import daifu
from daifu import cells as _registry
from daifu.cells._source import ModuleSource, map_statement
from daifu.engine import ENGINE
from daifu.engine._events import capture as capture_logs
from daifu.engine.human._console import run_line
from daifu.engine.human._report import build, summarize
from daifu.engine.persist._journal import Journal, Replay

from .support import crashes, read_events


def test_summaries_are_compact():
    torch = pytest.importorskip("torch", reason="PyTorch not available")
    t = torch.tensor([[1.0, float("nan")], [3.0, -2.0]], requires_grad=True)
    assert summarize(t) == "tensor(2, 2) float32 cpu requires_grad min=-2 max=3 HAS NaN"
    assert summarize(torch.arange(5)) == "tensor(5,) int64 cpu min=0 max=4"
    assert summarize(torch.nn.Linear(3, 2)) == "Linear module, 8 parameters, training=True"
    assert summarize(list(range(100))).startswith("list of 100: [0, 1, 2, 3, 4, 5, ...]")

    class Broken:
        def __repr__(self):
            raise RuntimeError("no")

    assert "Broken" in summarize(Broken())  # a broken __repr__ does not break the report


MODULE = '''
def work(xs, log):
    for x in xs:
        log.append(x); y = 10 // x
    return log

class Net:
    def scale(self, v):
        return v * 2

def use(net, xs):
    out = []
    for x in xs:
        out.append(net.scale(x))
    return out
'''


@contextlib.contextmanager
def installed(tmp_path, monkeypatch, name: str, source: str):
    """``name`` written from ``source``, imported vaccinated; (module, path)."""
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    daifu.install(modules=name)
    try:
        yield importlib.import_module(name), path
    finally:
        daifu.uninstall()
        sys.modules.pop(name, None)
        _registry.forget(str(path))  # a later reload must not see this file


@pytest.fixture
def module(tmp_path, monkeypatch):
    with installed(tmp_path, monkeypatch, "reload_target", MODULE) as loaded:
        yield loaded


def test_report_names_effects_done_before_the_failure(module):
    mod, _ = module
    reports = []

    @daifu.on(ZeroDivisionError)
    def look(crash):
        reports.append(build(crash))
        return daifu.ABORT

    with crashes(ZeroDivisionError):
        mod.work([0], [])
    report = reports[0]
    assert report.statement == "log.append(x); y = 10 // x" or report.statement == "y = 10 // x"
    text = report.render()
    assert "ZeroDivisionError: integer division or modulo by zero" in text
    assert "options: retry; skip (continue after the statement)" in text


def test_console_commands_in_process(module):
    mod, _ = module
    transcript = []

    @daifu.on(ZeroDivisionError)
    def console(crash):
        for line in ["vars", "p x + 1", "!x = 5", "exec\nlog.append('patched')\n", "bogus",
                     "bogus command", "p undefined", "retry"]:
            c, out = run_line(crash, ENGINE.door(crash), line, "test")
            transcript.append((line.split("\n")[0], c.ok, out.strip(), c.decision))
        return None  # the console queued the decision

    assert mod.work([0], []) == [0, "patched"]
    by_cmd = {cmd: (ok, out, decision) for cmd, ok, out, decision in transcript}
    assert by_cmd["vars"][0] and "x = 0" in by_cmd["vars"][1]
    assert by_cmd["p x + 1"] == (True, "1", None)
    assert by_cmd["bogus"][0] is False and "unknown command 'bogus'" in by_cmd["bogus"][1]
    assert by_cmd["bogus command"][0] is False and "unknown command" in by_cmd["bogus command"][1]
    assert by_cmd["p undefined"][0] is False and "NameError" in by_cmd["p undefined"][1]
    assert by_cmd["retry"][2] is daifu.RETRY


def test_reload_changes_functions_everywhere_and_reports(module):
    mod, path = module
    net = mod.Net()
    bound = net.scale
    path.write_text(MODULE.replace("return v * 2", "return v * 3")
                    + "\ndef helper():\n    return 'new'\n")
    results = []

    @daifu.on(ZeroDivisionError)
    def reload_now(crash):
        return daifu.RELOAD

    @daifu.on(Exception)
    def record(crash):  # reached only when the reload rule's reload was rejected
        results.append(crash.attempt)

    # a crash anywhere triggers the rule; the reload applies to the whole file.
    # work() itself did not change: retried in old code, it fails again; a
    # second reload changes nothing, so it is rejected and the next rule runs
    with capture_logs() as logs, crashes(ZeroDivisionError):
        mod.work([0], [])
    assert bound(2) == 6 and net.scale(1) == 3
    assert mod.helper() == "new"
    assert results == [2]
    rejected = [e["reason"] for e in logs if e["event"] == "patch.rejected"]
    assert len(rejected) == 1 and "no source file changed" in rejected[0]
    summary = next(e["summary"] for e in logs if e["event"] == "patch.applied")
    assert "changed  reload_target.py: Net.scale()" in summary
    assert "added    reload_target.py: helper()" in summary


def test_reload_syntax_error_changes_nothing(module):
    mod, path = module
    path.write_text(MODULE.replace("return v * 2", "return v * (3"))
    errors = []

    @daifu.on(ZeroDivisionError)
    def reload_now(crash):
        from daifu.engine._queue import ReloadPatch

        try:
            ENGINE.submit(ReloadPatch(), crash)
        except daifu.PatchError as err:
            errors.append(str(err))
        return daifu.ABORT

    with crashes(ZeroDivisionError):
        mod.work([0], [])
    assert errors and "nothing was changed" in errors[0]
    assert mod.Net().scale(1) == 2


def _scope(src: str):
    msrc = ModuleSource(textwrap.dedent(src), "m.py")
    fn = msrc.tree.body[0]
    return msrc, fn


OLD = '''
def train(data):
    total = 0
    for x in data:
        y = 10 // x
        total += y
    return total
'''


@pytest.mark.parametrize("new,expected", [
    (OLD.replace("y = 10 // x", "y = 10 // (x + 1)"), "y = 10 // (x + 1)"),
    (OLD.replace("    total = 0\n", "    total = 0\n    extra = 1\n"), "y = 10 // x"),
    (OLD.replace("        y = 10 // x\n", "        x = x or 1\n        y = 10 // x\n"),
     "x = x or 1"),
])
def test_statement_mapping(new, expected):
    old_msrc, old_fn = _scope(OLD)
    new_msrc, new_fn = _scope(new)
    stmt = old_fn.body[1].body[0]
    mapped = map_statement(old_msrc, old_fn, stmt, new_msrc, new_fn)
    assert not isinstance(mapped, str), mapped
    assert ast.unparse(mapped) == expected


def test_statement_mapping_refuses_a_changed_structure():
    old_msrc, old_fn = _scope(OLD)
    new_msrc, new_fn = _scope(OLD.replace("    for x in data:", "    while data:\n        x = 1"))
    stmt = old_fn.body[1].body[0]
    reason = map_statement(old_msrc, old_fn, stmt, new_msrc, new_fn)
    assert isinstance(reason, str) and "changed from For to While" in reason


def test_journal_records_and_replay_matches_by_statement(tmp_path, module):
    mod, _ = module
    path = tmp_path / "j.jsonl"
    ENGINE.journal = Journal(str(path))

    @daifu.on(ZeroDivisionError)
    def fix(crash):
        crash.exec("x = 2")
        return daifu.RETRY

    assert mod.work([0], []) == [0]
    records = read_events(path)
    assert [r["type"] for r in records] == ["crash", "patch", "patch", "outcome"]
    assert records[1]["code"] == "x = 2" and records[2]["decision"] == "retry"

    ENGINE.reset()
    ENGINE.replay = Replay(str(path))
    assert mod.work([0], []) == [0]  # replayed: no rule registered now
    ENGINE.reset()
    with crashes(ZeroDivisionError):  # the journal entry was used up
        mod.work([0], [])


def test_journal_numbers_every_crash_and_survives_unprintable_exceptions(tmp_path, module,
                                                                          monkeypatch):
    mod, _ = module
    path = tmp_path / "j.jsonl"
    ENGINE.journal = Journal(str(path))
    internal = []
    monkeypatch.setattr(ENGINE, "_internal", lambda what, crash: internal.append(what))

    class Unprintable(ZeroDivisionError):
        def __str__(self):
            raise RuntimeError("broken __str__")

    class Bad:
        def __rfloordiv__(self, other):
            raise Unprintable()

    @daifu.on(ZeroDivisionError)
    def fix(crash):
        if isinstance(crash.exception, Unprintable):
            return daifu.SKIP
        crash.vars["x"] = Bad()  # the retry raises an exception with a broken __str__
        return daifu.RETRY

    assert mod.work([0, 0], []) == [0, 0]
    crashes = [r for r in read_events(path) if r["type"] == "crash"]
    assert [r["crash"] for r in crashes] == [1, 2, 3, 4]  # one number per crash
    assert [r["message"] for r in crashes][1::2] == ["<unprintable>", "<unprintable>"]
    assert internal == []


def test_reload_picks_up_an_edited_module_daifu_did_not_vaccinate(tmp_path, module):
    mod, _ = module
    helper = tmp_path / "reload_helper.py"
    helper.write_text("def factor():\n    return 2\n")
    import reload_helper

    try:
        helper.write_text("def factor():\n    return 3  # edited\n")  # nobody read it before

        @daifu.on(ZeroDivisionError)
        def reload_now(crash):
            return daifu.RELOAD

        with crashes(ZeroDivisionError):
            mod.work([0], [])  # the reload happens; work() itself did not change
        assert reload_helper.factor() == 3
    finally:
        sys.modules.pop("reload_helper", None)


CALLERS = '''
def divide(a, b):
    return a / b

def train(items, log):
    for a, b in items:
        log.append(divide(a, b))     # the bug is here: b can be 0
    return log
'''


@pytest.fixture
def callers(tmp_path, monkeypatch):
    with installed(tmp_path, monkeypatch, "reload_callers", CALLERS) as loaded:
        yield loaded


FIXED_CALLER = CALLERS.replace("log.append(divide(a, b))     # the bug is here: b can be 0",
                               "log.append(divide(a, b or 1))")


@pytest.mark.parametrize("focus", ["up", ""])
def test_an_edited_caller_continues_in_its_new_code(callers, focus):
    """The crash is in divide(), which did not change; train(), which called
    it, did: after ``up`` (or without it: the innermost changed frame) and
    ``reload``, train() re-executes the failing call in its new code."""
    mod, path = callers
    said = []

    @daifu.on(ZeroDivisionError)
    def console(crash):
        assert crash.function == "divide"
        path.write_text(FIXED_CALLER)
        for line in [focus, "reload"] if focus else ["reload"]:
            c, out = run_line(crash, ENGINE.door(crash), line, "test")
            said.append(out)
            assert c.ok, out
        return None

    with capture_logs() as logs:
        assert mod.train([(4, 2), (6, 0), (8, 4)], []) == [2.0, 6.0, 2.0]
    assert "running in caller frame 1: re-executes its call at line" in said[-1]
    assert [e["reason"] for e in logs if e["event"] == "crash.passed"] == [
        "reload in caller frame 1 (train)"]
    resumed = [e for e in logs if e["event"] == "crash.resumed"]
    assert [(e["where"].rsplit(":", 1)[1], e["action"]) for e in resumed] == [("7", "reload")]
    assert mod.train([(5, 0)], []) == [5.0]  # later calls run the new code


def test_an_edited_caller_that_cannot_continue_is_refused_and_changes_nothing(callers):
    mod, path = callers
    said = []

    @daifu.on(ZeroDivisionError)
    def console(crash):
        # train()'s loop is now another kind of loop: its call has no place there
        path.write_text(CALLERS.replace("    for a, b in items:\n",
                                        "    while items:\n        a, b = items.pop()\n"))
        for line in ["up", "reload"]:
            c, out = run_line(crash, ENGINE.door(crash), line, "test")
            said.append((c.ok, out))
        return daifu.ABORT

    with crashes(ZeroDivisionError):
        mod.train([(6, 0)], [])
    ok, out = said[-1]
    assert not ok and "train() in caller frame 1 cannot continue in its new code" in out
    assert "nothing was changed" in out


def test_deleting_the_failing_line_of_a_caller_continues_after_it(callers):
    mod, path = callers

    @daifu.on(ZeroDivisionError)
    def console(crash):
        path.write_text(CALLERS.replace("        log.append(divide(a, b))     # the bug is "
                                        "here: b can be 0\n", "        log.append(-a)\n"))
        c, out = run_line(crash, ENGINE.door(crash), "reload", "test")
        assert c.ok, out
        return None

    # the new statement in the old one's place runs for the failing item
    assert mod.train([(4, 2), (6, 0), (8, 4)], []) == [2.0, -6, -8]


DELETED = '''
def accumulate(items, log):
    for a, b in items:
        q = a / b
        log.append(q)
    log.append("end")
    return log
'''


def test_deleting_the_failing_lines_of_the_crashed_function_continues_in_the_new_code(
        tmp_path, monkeypatch):
    path = tmp_path / "reload_deleted.py"
    path.write_text(DELETED)
    monkeypatch.syspath_prepend(str(tmp_path))
    daifu.install(modules="reload_deleted")
    try:
        import reload_deleted

        @daifu.on(ZeroDivisionError)
        def console(crash):
            path.write_text(DELETED.replace("        q = a / b\n        log.append(q)\n",
                                            "        pass\n"))
            c, out = run_line(crash, ENGINE.door(crash), "reload", "test")
            assert c.ok, out
            return None

        assert reload_deleted.accumulate([(4, 2), (6, 0), (8, 4)], []) == [2.0, "end"]
    finally:
        daifu.uninstall()
        sys.modules.pop("reload_deleted", None)
        _registry.forget(str(path))


RESTRUCTURED = '''
def accumulate(items, log):
    for a, b in items:
        log.append(a / b)
    return log

def run(items):
    return accumulate(items, [])
'''
#: the same function with another kind of loop: its running call cannot continue in it
WHILE_LOOP = RESTRUCTURED.replace(
    "    for a, b in items:\n        log.append(a / b)\n",
    "    while items:\n        a, b = items.pop(0)\n        log.append(a / (b or 1))\n")


@pytest.fixture
def restructured(tmp_path, monkeypatch):
    with installed(tmp_path, monkeypatch, "reload_restructured", RESTRUCTURED) as (mod, path):
        yield (lambda: mod), path


def test_a_running_function_that_cannot_continue_is_called_again_from_its_caller(restructured):
    load, path = restructured
    mod = load()
    said = []

    @daifu.on(ZeroDivisionError)
    def console(crash):
        path.write_text(WHILE_LOOP)
        c, out = run_line(crash, ENGINE.door(crash), "reload", "test")
        said.append(out)
        assert c.ok, out
        return None

    assert mod.run([(4, 2), (6, 0), (8, 4)]) == [2.0, 6.0, 2.0]
    assert "its call is re-executed from caller frame 1 (run), in the new code" in said[0]


def test_a_refused_reload_keeps_the_edit_for_the_next_one_and_the_listing_shows_running_code(
        restructured):
    load, path = restructured
    mod = load()
    said = []

    @daifu.on(ZeroDivisionError)
    def console(crash):
        path.write_text(WHILE_LOOP)
        for line in ["reload", "reload", "l"]:
            c, out = run_line(crash, ENGINE.door(crash), line, "test")
            said.append((line, c.ok, out))
        return daifu.ABORT

    with crashes(ZeroDivisionError):
        mod.accumulate([(6, 0)], [])  # called from here: no vaccinated caller to call it again
    (_, ok1, out1), (_, ok2, out2), (_, ok3, listing) = said
    assert not ok1 and "changed from For to While" in out1 and "nothing was changed" in out1
    assert (ok2, out2) == (ok1, out1)  # the same edit is still there to reload
    assert ok3 and "for a, b in items:" in listing and "while" not in listing


DEFINES = '''
def step(closure):
    return closure() * 2

def fit(batches, log):
    for scale in batches:
        def closure():
            total = 0
            for v in (1, 2):
                total += v / scale       # the bug: scale can be 0
            return total
        log.append(step(closure))
    return log
'''


def test_a_def_in_a_running_loop_makes_the_new_function_after_a_reload(tmp_path, monkeypatch):
    """An LBFGS-style closure: fit()'s loop defines the function that fails.
    After the edit and reload, the crashed call continues in the new code,
    fit() keeps running its own code, and its next ``def closure`` makes the
    *new* function: the fix holds at every later step, with one crash."""
    with installed(tmp_path, monkeypatch, "reload_defines", DEFINES) as (mod, path):
        said = []

        @daifu.on(ZeroDivisionError)
        def console(crash):
            path.write_text(DEFINES.replace("v / scale       # the bug: scale can be 0",
                                            "v / (scale or 1)"))
            c, out = run_line(crash, ENGINE.door(crash), "reload", "test")
            said.append(out)
            assert c.ok, out
            return None

        assert mod.fit([1, 0, 0, 3], []) == [6.0, 6.0, 6.0, 2.0]
        assert len(said) == 1, said  # the later steps ran the corrected closure
        assert "fit() in caller frame 2 keeps its own code: the def at line 7 makes the new " \
               "function from now on" in said[0]


PIPELINE = '''
def batches(n):
    for i in range(n):
        yield 12 // (i - 2)      # fails at i == 2

def total(n, log):
    for b in batches(n):
        log.append(100 // (b + 6))
    return log
'''


def test_code_still_running_after_a_reload_is_shown_with_its_own_text(tmp_path, monkeypatch):
    """A generator suspended during a reload goes on in its old code; when it
    crashes later, the report and ``l`` show the text it runs, not the edit."""
    fixed = PIPELINE.replace("yield 12 // (i - 2)      # fails at i == 2",
                             "yield 12 // (i - 2 or 1)  # fixed") \
                    .replace("100 // (b + 6)", "100 // (b + 6 or 1)")
    with installed(tmp_path, monkeypatch, "reload_pipeline", PIPELINE) as (mod, path):
        seen = []

        @daifu.on(ZeroDivisionError)
        def console(crash):
            if crash.function == "total":
                path.write_text(fixed)
                return daifu.RELOAD
            c, listing = run_line(crash, ENGINE.door(crash), "l .", "test")
            seen.append((build(crash).source, listing))
            return daifu.ABORT

        with crashes(ZeroDivisionError):
            mod.total(4, [])
        [(source, listing)] = seen
        assert [text for _, text, failing in source if failing] == [
            "        yield 12 // (i - 2)      # fails at i == 2"]
        assert "->         yield 12 // (i - 2)      # fails at i == 2" in listing
        assert "fixed" not in listing
        assert mod.total(3, []) == [100, -17, 5]  # later calls run the new code
