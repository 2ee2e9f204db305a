"""Lightning's Trainer, not fixed: resumed from its own checkpoint and daifu's.

A small classifier with dropout over a shuffled DataLoader.  With ``--bug``
``training_step`` raises at step 5 of 16, mid-epoch; nobody fixes it, and
daifu's emergency checkpoint asks the Trainer on the stack for its own
(``...-lightning.ckpt``: model, optimizer, loop counters) and names it in
daifu's file.  Lightning alone restarts the epoch's loader with a new
shuffle and no RNG; so the program, started again with ``--resume``
(daifu's file), first gives the loader its place and the RNG back with
``daifu.resume(path, loader=loader)``, then calls ``trainer.fit(...,
ckpt_path=ck["frameworks"]["lightning"])``, as the user guide shows."""

import argparse
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import lightning as L  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from _common import iteration_done, save, setup_determinism  # noqa: E402

BAD_STEP = 5


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    p.add_argument("--resume")
    p.add_argument("--bug", action="store_true")
    args = p.parse_args()
    warnings.filterwarnings("ignore")

    class Net(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 16)
            self.out = torch.nn.Linear(16, 2)
            self.drop = torch.nn.Dropout(0.3)
            #: the loss weight of each step (with --bug, step 5's is missing)
            self.weights = {s: 1.0 for s in range(100) if not (args.bug and s == BAD_STEP)}

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = F.cross_entropy(self.out(self.drop(self.lin(x).relu())), y)
            return loss * self.weights[self.global_step]

        def on_train_batch_end(self, outputs, batch, batch_idx):
            iteration_done(f"train {self.current_epoch} {self.global_step}")

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    setup_determinism()
    L.seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(64, 4, generator=g), torch.randint(0, 2, (64,), generator=g))
    loader = DataLoader(data, batch_size=8, shuffle=True)
    trainer = L.Trainer(max_epochs=2, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, deterministic=True)
    net = Net()
    own = None
    if args.resume:
        import daifu

        own = daifu.load_checkpoint(args.resume)["frameworks"]["lightning"]
        daifu.resume(args.resume, loader=loader)  # the loader's place and the RNG
    trainer.fit(net, loader, ckpt_path=own)
    save(net, args.out)


if __name__ == "__main__":
    main()
