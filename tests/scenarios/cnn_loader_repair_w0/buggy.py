"""Vision CNN: each epoch streams a fresh shard of records, read by the
Dataset on access, through a tqdm progress bar.  Record 100 of shard 1 is a
truncated copy: __getitem__ raises, and the DataLoader raises it from the
``for`` header of the training loop in epoch 1 (through tqdm's generator,
which dies with it).  A replica of the record is intact.  With ``--workers
N`` (case cnn_loader_repair_w2) the record fails in a worker process and the
DataLoader re-raises it in the main process when the failed batch is
reached."""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.nn.functional as F
from _common import SmallCNN, iteration_done, mnist_like, save, setup_determinism
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

CORRUPT_SHARD, CORRUPT_RECORD = 1, 100


class RecordShard(Dataset):
    """One shard of records; a truncated record fails to read until it is
    restored from its replica."""

    def __init__(self, k):
        self.records = mnist_like(256, seed=10 + k)
        self.truncated = {CORRUPT_RECORD} if k == CORRUPT_SHARD else set()

    def restore_from_replica(self, i):
        self.truncated.discard(i)

    def __len__(self):
        return len(self.records)

    def __getitem__(self, i):
        if i in self.truncated:
            raise ValueError(f"truncated record {i}: restore it from its replica")
        return self.records[i]


def make_loader(shard, workers):
    return DataLoader(shard, batch_size=32, shuffle=False, num_workers=workers,
                      persistent_workers=False)


def train_epoch(model, loader, opt, epoch):
    model.train()
    step = 0
    for x, y in tqdm(loader, desc=f"epoch {epoch}", file=sys.stderr, mininterval=0):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        iteration_done(f"train {epoch} {step}")
        step += 1


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    args = parser.parse_args()
    setup_determinism()
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for epoch in range(3):
        train_epoch(model, make_loader(RecordShard(epoch), args.workers), opt, epoch)
        iteration_done(f"epoch {epoch}")
    save(model, args.out)


if __name__ == "__main__":
    main()
