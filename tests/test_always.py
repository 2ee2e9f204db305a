"""``always DECISION`` at the console (and ``send PID always ...``): one
answer for every later crash of the same exception type at the same
statement -- an HF ``compute_metrics`` that fails at every evaluation needs
one answer, not one per evaluation.  Journaled, so ``--replay`` does the
same."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

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
    from daifu.engine.human._console import run_line

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
        "after 1 exec patch" in got.stdout and "patch(es)" not in got.stdout  # `always` lists it
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
        from daifu.engine.human._console import run_line

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


HF_METRICS = textwrap.dedent('''
    import json, sys, warnings
    import torch
    from torch.utils.data import Dataset
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments
    from transformers.utils import logging as hf_logging

    warnings.filterwarnings("ignore")
    hf_logging.set_verbosity_error()
    LABELS = {0: "negative", 1: "positive"}  # the bug: three classes are predicted
    REPORTED = ["negative", "neutral", "positive"]

    class Sequences(Dataset):
        def __init__(self, n, seed):
            g = torch.Generator().manual_seed(seed)
            self.ids = torch.randint(3, 40, (n, 12), generator=g)
        def __len__(self):
            return len(self.ids)
        def __getitem__(self, i):
            return {"input_ids": self.ids[i], "labels": self.ids[i, 0] % 3}

    def compute_metrics(eval_pred):
        logits, labels = eval_pred
        names = dict(LABELS)  # made again at every evaluation: it fails at every one
        correct = dict.fromkeys(REPORTED, 0)
        for p, y in zip(logits.argmax(-1), labels):
            correct[names[int(y)]] += int(p == y)
        return {f"correct_{n}": c for n, c in correct.items()}

    config = BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=16, num_labels=3)
    torch.manual_seed(0)
    training = TrainingArguments(output_dir="hf-out", max_steps=6, per_device_train_batch_size=8,
                                 per_device_eval_batch_size=16, eval_strategy="steps",
                                 eval_steps=2, learning_rate=5e-3, save_strategy="no",
                                 logging_strategy="no", report_to=[], use_cpu=True, seed=0,
                                 disable_tqdm=True)
    trainer = Trainer(model=BertForSequenceClassification(config), args=training,
                      train_dataset=Sequences(48, 1), eval_dataset=Sequences(16, 2),
                      compute_metrics=compute_metrics)
    trainer.train()
    print("metrics", json.dumps([{k: v for k, v in e.items() if k.startswith("eval_correct")}
                                 for e in trainer.state.log_history if "eval_loss" in e]))
    print("weights", float(sum(p.double().sum() for p in trainer.model.parameters())))
''')


@pytest.mark.slow
def test_always_answers_an_hf_compute_metrics_that_fails_at_every_evaluation(tmp_path):
    pytest.importorskip("transformers", reason="transformers not installed")
    corrected = HF_METRICS.replace('1: "positive"}', '1: "positive", 2: "neutral"}')
    (tmp_path / "fixed.py").write_text(corrected)
    want = subprocess.Popen([sys.executable, "fixed.py"], cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # meanwhile
    (tmp_path / "train.py").write_text(HF_METRICS)
    # the human at the first crash: fix this evaluation's label map, answer every later one
    (tmp_path / "console.py").write_text(FIRST_CRASH_CONSOLE.replace(
        "exec LABELS[2] = 'other'", "exec names[2] = 'neutral'"))
    try:
        got = run_daifu(["--fixes", "console.py", "--journal", "j.jsonl", "--log-file",
                         "ev.jsonl", "train.py"], tmp_path)
        want_out, want_err = want.communicate(timeout=120)
    finally:
        if want.poll() is None:
            want.kill()
            want.communicate()
    assert want.returncode == 0, want_err[-3000:]
    assert got.returncode == 0, got.stderr[-3000:]
    assert got.stdout.count("rule called") == 1  # one answer, three evaluations
    assert "from now on, KeyError at" in got.stdout
    assert "(correct[names[int(y)]] += int(p == y)): retry after 1 exec patch" in got.stdout
    events = read_events(tmp_path / "ev.jsonl")
    assert [e["action"] for e in events if e["event"] == "crash.resumed"] == ["retry"] * 3
    assert (tmp_path / "j.jsonl").read_text().count('"type": "always"') == 1
    # every evaluation's metrics, and the weights, as the corrected program's
    ours, theirs = ([line for line in out.splitlines() if line.startswith(("metrics", "weights"))]
                    for out in (got.stdout, want_out))
    assert ours == theirs and len(ours) == 2
    assert ours[0].count("eval_correct_neutral") == 3
