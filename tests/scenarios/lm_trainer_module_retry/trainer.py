"""The training loop, in a module beside the script (as minGPT's
mingpt/trainer.py, nanoGPT's model.py): the project's, so vaccinated with
default settings -- the crash is taken here, at its failing statement."""

import torch.nn.functional as F
from _common import VOCAB, iteration_done


class Trainer:
    def __init__(self, model, opt, reader):
        self.model, self.opt, self.reader = model, opt, reader

    def run(self, epochs):
        for epoch in range(epochs):
            for step in range(len(self.reader)):
                x, y = self.reader.read_batch(step)
                logits = self.model(x)
                loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
                self.opt.zero_grad()
                loss.backward()
                self.opt.step()
                iteration_done(f"train {epoch} {step}")
