"""The Hugging Face Trainer, not fixed: resumed from its own checkpoint.

A BERT classifier with dropout, trained by the Trainer over a shuffled
loader.  With ``--bug`` a subclass's ``compute_loss`` raises at step 5;
nobody fixes it, and daifu's emergency checkpoint asks the Trainer on the
stack for its own (``output_dir/checkpoint-5``: model, optimizer, scheduler,
RNG states, the sampler's place) and names it in daifu's file.  The program,
started again with ``--resume`` (daifu's file), goes on with
``trainer.train(resume_from_checkpoint=ck["frameworks"]["transformers"])``,
as the user guide shows."""

import argparse
import os
import sys
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

BAD_STEP = 5


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


class Marks(TrainerCallback):
    def on_step_end(self, args, state, control, **kw):
        iteration_done(f"train 0 {state.global_step}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    p.add_argument("--resume")
    p.add_argument("--bug", action="store_true")
    args = p.parse_args()
    warnings.filterwarnings("ignore")
    hf_logging.set_verbosity_error()
    setup_determinism()

    class Weighted(Trainer):
        #: the loss weight of each step (with --bug, step 5's is missing)
        weights = {s: 1.0 for s in range(100) if not (args.bug and s == BAD_STEP)}

        def compute_loss(self, model, inputs, *a, **kw):
            loss = super().compute_loss(model, inputs, *a, **kw)
            return loss * self.weights[self.state.global_step]

    config = BertConfig(vocab_size=40, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=16, num_labels=3,
                        hidden_dropout_prob=0.2)
    torch.manual_seed(0)
    model = BertForSequenceClassification(config)
    training = TrainingArguments(
        output_dir="hf-out", max_steps=12, per_device_train_batch_size=16,
        learning_rate=5e-3, save_strategy="no", logging_strategy="no", report_to=[],
        use_cpu=True, seed=0, data_seed=0, disable_tqdm=True, dataloader_num_workers=0)
    trainer = Weighted(model=model, args=training, train_dataset=Sequences(256, 1),
                       callbacks=[Marks()])
    own = None
    if args.resume:
        import daifu

        own = daifu.load_checkpoint(args.resume)["frameworks"]["transformers"]
    trainer.train(resume_from_checkpoint=own)
    save(model, args.out)


if __name__ == "__main__":
    main()
