"""A small CNN on MNIST-shaped synthetic data -- with two bugs that surface in
epoch 2, after a full epoch of training:

* evaluation (every 2nd epoch) flattens the images before the CNN;
* the checkpoint directory (first used in epoch 2) does not exist.

Run it plainly and it dies in epoch 2.  Run it under daifu with the fixes file
and both crashes are repaired in the live process; training finishes with the
same parameters as a run of the corrected script:

    python -m daifu --fixes examples/mnist/fixes.py examples/mnist/train.py
"""

import argparse
import hashlib
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def synthetic_mnist(n, seed):
    """MNIST-shaped data: each class is a fixed random template plus noise."""
    g = torch.Generator().manual_seed(seed)
    templates = torch.randn(10, 1, 28, 28, generator=torch.Generator().manual_seed(1234))
    labels = torch.randint(0, 10, (n,), generator=g)
    images = templates[labels] + 0.8 * torch.randn(n, 1, 28, 28, generator=g)
    return TensorDataset(images, labels)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3)
        self.conv2 = nn.Conv2d(8, 16, 3)
        self.fc = nn.Linear(16 * 5 * 5, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def predict(model, data):
    return model(data.flatten(1))  # BUG: the CNN wants (N, 1, 28, 28) images


def train(model, loader, optimizer, epoch):
    model.train()
    total = 0.0
    for data, target in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()
        total += loss.item()
    print(f"epoch {epoch}: train loss {total / len(loader):.4f}", flush=True)


def evaluate(model, loader):
    model.eval()
    correct = 0
    with torch.no_grad():
        for data, target in loader:
            output = predict(model, data)
            correct += (output.argmax(1) == target).sum().item()
    print(f"           test accuracy {correct / len(loader.dataset):.3f}", flush=True)


def checksum(model):
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(bytes(p.detach().contiguous().untyped_storage()))
    return h.hexdigest()[:16]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--eval-every", type=int, default=2)
    parser.add_argument("--ckpt-dir", default=os.path.join("runs", "mnist", "checkpoints"))
    parser.add_argument("--out", help="save the final parameters here")
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    train_loader = DataLoader(synthetic_mnist(1024, seed=1), batch_size=64, shuffle=True)
    test_loader = DataLoader(synthetic_mnist(256, seed=2), batch_size=128)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    for epoch in range(1, args.epochs + 1):
        train(model, train_loader, optimizer, epoch)
        if epoch % args.eval_every == 0:
            evaluate(model, test_loader)
            ckpt_path = os.path.join(args.ckpt_dir, f"epoch{epoch}.pt")
            torch.save(model.state_dict(), ckpt_path)
            print(f"           saved {ckpt_path}", flush=True)

    print(f"final parameters sha256: {checksum(model)}", flush=True)
    if args.out:
        torch.save(model.state_dict(), args.out)


if __name__ == "__main__":
    main()
