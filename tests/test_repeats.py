"""Crashes that keep coming back: capped when retried, counted when fixed.

A rule that always answers RETRY must stop at ``--max-attempts`` whatever
the failing statement is; a crash fixed the same way at every step must not
grow the log or the journal by the same lines at every step, and replay
must still re-apply the fix every time."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from .support import read_events

pytestmark = pytest.mark.slow


def daifu(args, cwd, timeout=120):
    return subprocess.run([sys.executable, "-m", "daifu", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=dict(os.environ))


ALWAYS_RETRY = textwrap.dedent('''
    import daifu

    @daifu.on(ZeroDivisionError)
    def always(crash):
        return daifu.RETRY

    def scale(x):
        return 1 / x

    def main():
        for i in range(3):
            y = scale(0)
        print("finished")

    main()
''')


def test_a_rule_that_always_retries_a_return_gives_up_at_the_cap(tmp_path):
    (tmp_path / "train.py").write_text(ALWAYS_RETRY)
    log = tmp_path / "events.jsonl"
    plain = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=60)
    got = daifu(["--max-attempts", "3", "--log-file", str(log), "train.py"], tmp_path, timeout=60)
    assert got.returncode == plain.returncode == 1
    assert got.stderr.splitlines()[-1] == "ZeroDivisionError: division by zero"
    events = read_events(log)
    taken = [e for e in events if e["event"] == "crash.intercepted" and e["function"] == "scale"]
    assert [e["attempt"] for e in taken] == [1, 2, 3, 4]
    gave_up = [e for e in events if e["event"] == "crash.gave_up"]
    assert "failed again after 3 retries" in gave_up[0]["reason"]
    assert len(events) < 40


EVERY_OTHER_STEP = textwrap.dedent('''
    import daifu

    if {rule}:
        @daifu.on(ZeroDivisionError)
        def drop(crash):
            return daifu.CONTINUE

    def main(steps):
        total = 0
        for i in range(steps):
            total += 1 / (i % 2)
        print("total", total)

    main(2000)
''')


def test_a_crash_fixed_at_every_step_is_counted_not_logged_again(tmp_path):
    (tmp_path / "train.py").write_text(EVERY_OTHER_STEP.format(rule=True))
    log, journal = tmp_path / "events.jsonl", tmp_path / "journal.jsonl"
    got = daifu(["--log-file", str(log), "--journal", str(journal), "train.py"], tmp_path)
    assert got.returncode == 0, got.stderr
    assert got.stdout == "total 1000.0\n"
    events = read_events(log)
    # a handful of crashes in full, then counts at 4, 10, 100 and the last one
    assert sum(e["event"] == "crash.intercepted" for e in events) <= 4
    counts = [e["count"] for e in events if e["event"] == "crash.repeated"]
    assert counts[:3] == [4, 10, 100] and counts[-1] >= 999
    summary = [e for e in events if e["event"] == "daifu.summary"]
    assert summary[0]["recovered"] == 1000
    records = read_events(journal)
    assert len(records) < 30
    crashes = sum(r["type"] == "crash" for r in records)
    repeats = sum(r["count"] for r in records if r["type"] == "repeat")
    assert crashes + repeats == 1000

    # replayed without the rule: the journal still fixes every one of them
    (tmp_path / "train.py").write_text(EVERY_OTHER_STEP.format(rule=False))
    again = daifu(["--log-file", str(tmp_path / "replay.jsonl"), "--replay", str(journal),
                   "train.py"], tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout == "total 1000.0\n"
    summary = [e for e in read_events(tmp_path / "replay.jsonl") if e["event"] == "daifu.summary"]
    assert summary[0]["recovered"] == 1000


def test_a_change_of_fix_is_logged_in_full(tmp_path):
    (tmp_path / "train.py").write_text(textwrap.dedent('''
        import daifu

        @daifu.on(ZeroDivisionError)
        def fix(crash):
            if crash.vars["i"] < 100:
                return daifu.CONTINUE
            crash.vars["d"] = 1
            return daifu.RETRY

        total = 0
        for i in range(200):
            d = i % 2
            total += 1 / d
        print("total", total)
    '''))
    log = tmp_path / "events.jsonl"
    got = daifu(["--log-file", str(log), "train.py"], tmp_path)
    assert got.returncode == 0, got.stderr
    assert got.stdout == "total 150.0\n"
    events = read_events(log)
    actions = [e["action"] for e in events if e["event"] == "crash.resumed"]
    # three continues in full, then the retries that replaced them, in full
    assert actions[:3] == ["continue"] * 3 and actions[3:6] == ["retry"] * 3
    repeated = [e["count"] for e in events if e["event"] == "crash.repeated"]
    # the continues' count when the fix changed, then the retries' at exit
    assert repeated == [4, 10, 50, 4, 10, 50]
