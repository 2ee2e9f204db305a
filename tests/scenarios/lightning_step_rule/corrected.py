"""The corrected program: the schedule has a weight for every step."""

import argparse
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import lightning as L  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from _common import SmallCNN, iteration_done, mnist_like, save, setup_determinism  # noqa: E402

STEPS_PLANNED = 16


class Classifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = SmallCNN()
        self.weights = [1.0 - 0.02 * i for i in range(STEPS_PLANNED)]

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        weight = self.weights[self.global_step]
        return loss * weight

    def on_train_batch_end(self, outputs, batch, batch_idx):
        iteration_done(f"train 0 {batch_idx}")

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    args = p.parse_args()
    warnings.filterwarnings("ignore")
    setup_determinism()
    L.seed_everything(0, verbose=False)
    loader = DataLoader(mnist_like(512), batch_size=32, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    model = Classifier()
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", devices=1, deterministic=True,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model, loader)
    save(model.net, args.out)


if __name__ == "__main__":
    main()
