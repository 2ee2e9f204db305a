"""The corrected program: the label map names all three classes."""

import argparse
import json
import os
import sys
import tempfile
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402
from transformers import (  # noqa: E402
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)
from transformers.utils import logging as hf_logging  # noqa: E402

from _common import iteration_done, save, setup_determinism  # noqa: E402

LABELS = {0: "negative", 1: "positive", 2: "neutral"}
REPORTED = ["negative", "positive", "neutral"]


class Sequences(Dataset):
    """Token sequences whose class is decided by their first token."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(3, 40, (n, 12), generator=g)
        self.labels = self.ids[:, 0] % 3

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def compute_metrics(eval_pred):
    logits, labels = eval_pred
    predicted = logits.argmax(-1)
    names = {LABELS[int(k)]: 0 for k in range(3)}
    for p, y in zip(predicted, labels):
        names[LABELS[int(y)]] += int(p == y)
    return {"accuracy": float((predicted == labels).mean()),
            **{f"correct_{n}": c for n, c in names.items() if n in REPORTED}}


class Marks(TrainerCallback):
    def on_step_end(self, args, state, control, **kw):
        iteration_done(f"train 0 {state.global_step}")

    def on_evaluate(self, args, state, control, metrics=None, **kw):
        iteration_done(f"eval {state.global_step}")
        Marks.metrics.append({k: v for k, v in metrics.items() if "runtime" not in k
                              and "per_second" not in k})


Marks.metrics = []


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    args = p.parse_args()
    warnings.filterwarnings("ignore")
    hf_logging.set_verbosity_error()
    setup_determinism()
    config = BertConfig(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=16, num_labels=3)
    torch.manual_seed(0)
    model = BertForSequenceClassification(config)
    with tempfile.TemporaryDirectory() as out:
        training = TrainingArguments(
            output_dir=out, num_train_epochs=2, per_device_train_batch_size=16,
            per_device_eval_batch_size=32, learning_rate=5e-3, eval_strategy="steps",
            eval_steps=8, save_strategy="no", logging_strategy="no", report_to=[],
            use_cpu=True, seed=0, data_seed=0, disable_tqdm=True, dataloader_num_workers=0)
        trainer = Trainer(model=model, args=training, train_dataset=Sequences(256, 1),
                          eval_dataset=Sequences(96, 2), compute_metrics=compute_metrics,
                          callbacks=[Marks()])
        trainer.train()
    print(json.dumps(Marks.metrics))
    save(model, args.out)


if __name__ == "__main__":
    main()
