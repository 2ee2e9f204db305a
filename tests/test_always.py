"""``always DECISION`` at the console (and ``send PID always ...``): one
answer for every later crash of the same exception type at the same
statement -- an HF ``compute_metrics`` that fails at every evaluation needs
one answer, not one per evaluation.  Journaled, so ``--replay`` does the
same."""

from __future__ import annotations

import textwrap

from .support import read_events, run_daifu

PROGRAM = textwrap.dedent('''
    LABELS = {0: "neg", 1: "pos"}

    def metrics(batch):
        return [LABELS[y] for y in batch]

    def main():
        out = []
        for epoch in range(4):
            names = metrics([0, 1, 2])
            out.append(len(names))
        print(out, sorted(LABELS))

    main()
''')

# the human's console at the first crash (a rule that types into it): patch
# the label map, and answer retry for this crash and every later one
FIRST_CRASH_CONSOLE = textwrap.dedent('''
    import daifu
    from daifu.engine import ENGINE
    from daifu.engine._console import run_line

    CALLS = []

    @daifu.on(KeyError)
    def console(crash):
        CALLS.append(crash.where)
        print("rule called", len(CALLS), flush=True)
        for line in ("exec LABELS[2] = 'other'", "always retry", "always"):
            print(run_line(crash, ENGINE.door(crash), line, "console")[1].rstrip(), flush=True)
        return None
''')


def test_always_answers_later_crashes_at_the_statement_and_replays(tmp_path):
    (tmp_path / "prog.py").write_text(PROGRAM.replace(
        "names = metrics([0, 1, 2])", "LABELS.pop(2, None)\n        names = metrics([0, 1, 2])"))
    (tmp_path / "console.py").write_text(FIRST_CRASH_CONSOLE)
    got = run_daifu(["--fixes", "console.py", "--journal", "j.jsonl", "--log-file", "ev.jsonl",
                     "prog.py"], tmp_path)
    assert got.returncode == 0, got.stderr
    assert got.stdout.count("rule called") == 1  # one answer, four crashes
    assert "from now on, KeyError at" in got.stdout and ": retry after 1 exec patch" in got.stdout
    assert "[3, 3, 3, 3] [0, 1, 2]" in got.stdout
    assert "  KeyError at " in got.stdout and "(return [LABELS[y] for y in batch]): retry " \
        "after 1 exec patch(es)" in got.stdout  # `always` lists it
    resumed = [e for e in read_events(tmp_path / "ev.jsonl") if e["event"] == "crash.resumed"]
    assert len(resumed) == 4
    journal = (tmp_path / "j.jsonl").read_text()
    assert journal.count('"type": "always"') == 1
    # replay: the same answers with no rule and nobody at the console
    again = run_daifu(["--replay", "j.jsonl", "--log-file", "ev2.jsonl", "prog.py"], tmp_path)
    assert again.returncode == 0 and "[3, 3, 3, 3] [0, 1, 2]" in again.stdout, again.stderr


def test_always_list_clear_and_bad_words(tmp_path):
    (tmp_path / "prog.py").write_text(PROGRAM)
    (tmp_path / "console.py").write_text(textwrap.dedent('''
        import daifu
        from daifu.engine import ENGINE
        from daifu.engine._console import run_line

        @daifu.on(KeyError)
        def console(crash):
            for line in ("always", "always maybe", "up", "always skip", "down", "always clear",
                         "exec LABELS[2] = 'x'", "always retry"):
                c, out = run_line(crash, ENGINE.door(crash), line, "console")
                print(f"{line!r} ok={c.ok}: {out.strip()}", flush=True)
                if c.decision is not None:
                    break
            return None
    '''))
    got = run_daifu(["--fixes", "console.py", "prog.py"], tmp_path)
    assert got.returncode == 0, got.stderr
    out = got.stdout
    assert "'always' ok=True: no standing answers" in out
    assert "'always maybe' ok=False: usage: always retry|skip|next|abort" in out
    assert "'always skip' ok=False: always answers the crashed frame's statement" in out
    assert "'always clear' ok=True: forgot 0 standing answers" in out
    assert "'always retry' ok=True: from now on, KeyError at" in out
