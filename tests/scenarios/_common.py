"""Shared pieces of the crash-benchmark programs (tests/scenarios/*/).

Programs are plain scripts: they put this directory on ``sys.path`` and
import what they need.  Everything is CPU, synthetic and seeded.

* ``setup_determinism()`` -- seeds, one thread, deterministic algorithms;
* ``mnist_like()``, ``token_corpus()``, ``GridWorld`` -- the three families'
  data and environment;
* ``iteration_done(tag)`` -- marks the end of a training/evaluation iteration
  (for restore-time measurement; a no-op unless ``DAIFU_BENCH_LOG`` is set);
* ``save(module_or_state, path)`` -- the final parameters the proof compares;
* ``train_epoch()`` (vision), ``discounted()``, ``run_episode()`` and
  ``rl_main()`` (RL) -- the parts of the training programs that several cases
  share and that are not where their crash happens (a crash site must stay in
  the case's own script: that is the module ``python -m daifu`` vaccinates).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset

_LOG = os.environ.get("DAIFU_BENCH_LOG")


def setup_determinism(seed: int = 0) -> None:
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)


def iteration_done(tag: str) -> None:
    """Record that iteration ``tag`` (e.g. "train 1 7") just finished."""
    if _LOG:
        with open(_LOG, "a") as fh:
            fh.write(f"{tag}\t{time.time():.6f}\n")


def save(obj, path: str | None) -> None:
    if path:
        state = obj.state_dict() if hasattr(obj, "state_dict") else obj
        torch.save(state, path)


# -- vision: MNIST-shaped images --------------------------------------------------------


class ImageSet(Dataset):
    """MNIST-shaped (1x28x28) images: a fixed template per class plus noise."""

    def __init__(self, n: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        templates = torch.randn(10, 1, 28, 28, generator=torch.Generator().manual_seed(1234))
        self.labels = torch.randint(0, 10, (n,), generator=g)
        self.images = templates[self.labels] + 0.8 * torch.randn(n, 1, 28, 28, generator=g)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i):
        return self.images[i], self.labels[i]


def mnist_like(n: int = 512, seed: int = 1) -> ImageSet:
    return ImageSet(n, seed)


def train_epoch(model, loader, opt, epoch):
    model.train()
    for step, (x, y) in enumerate(loader):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        iteration_done(f"train {epoch} {step}")


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 3)
        self.conv2 = nn.Conv2d(6, 12, 3)
        self.fc = nn.Linear(12 * 5 * 5, 10)

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


# -- language: a token corpus ------------------------------------------------------------

VOCAB = 64


def token_corpus(n_tokens: int = 20_000, seed: int = 3) -> torch.Tensor:
    """A synthetic corpus with learnable structure (a noisy cyclic walk)."""
    g = torch.Generator().manual_seed(seed)
    steps = torch.randint(1, 4, (n_tokens,), generator=g)
    noise = (torch.rand(n_tokens, generator=g) < 0.1) * torch.randint(0, VOCAB, (n_tokens,),
                                                                      generator=g)
    tokens = torch.cumsum(steps, 0) % VOCAB
    return torch.where(noise > 0, noise, tokens)


def lm_batches(corpus: torch.Tensor, batch: int = 16, seq: int = 32):
    """Consecutive (input, target) batches of a corpus, in a fixed order."""
    span = batch * seq
    for start in range(0, len(corpus) - span - 1, span):
        chunk = corpus[start : start + span + 1]
        yield chunk[:-1].view(batch, seq), chunk[1:].view(batch, seq)


class TinyLM(nn.Module):
    def __init__(self, vocab: int = VOCAB, dim: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.rnn = nn.GRU(dim, dim, batch_first=True)
        self.head = nn.Linear(dim, vocab)

    def forward(self, x):
        out, _ = self.rnn(self.embed(x))
        return self.head(out)


# -- reinforcement learning: a grid world -------------------------------------------------


class GridWorld:
    """A 5x5 grid; reach the goal corner.  Deterministic given the seed."""

    size = 5
    n_actions = 4

    def __init__(self, seed: int = 0):
        self.g = torch.Generator().manual_seed(seed)
        self.pos = (0, 0)
        self.steps = 0

    def reset(self) -> torch.Tensor:
        self.pos = (0, 0)
        self.steps = 0
        return self.observe()

    def observe(self) -> torch.Tensor:
        obs = torch.zeros(self.size * self.size)
        obs[self.pos[0] * self.size + self.pos[1]] = 1.0
        return obs

    def step(self, action: int):
        r, c = self.pos
        dr, dc = [(-1, 0), (1, 0), (0, -1), (0, 1)][action]
        if torch.rand(1, generator=self.g).item() < 0.1:  # slippery
            dr, dc = dc, dr
        self.pos = (min(max(r + dr, 0), self.size - 1), min(max(c + dc, 0), self.size - 1))
        self.steps += 1
        done = self.pos == (self.size - 1, self.size - 1) or self.steps >= 30
        reward = 1.0 if self.pos == (self.size - 1, self.size - 1) else -0.01
        return self.observe(), reward, done


class Policy(nn.Module):
    def __init__(self, n_obs: int = 25, n_actions: int = 4):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(n_obs, 32), nn.Tanh(), nn.Linear(32, n_actions))

    def forward(self, obs):
        return self.net(obs)


GAMMA = 0.95


def discounted(rewards):
    out, running = [], 0.0
    for r in reversed(rewards):
        running = r + GAMMA * running
        out.append(running)
    return torch.tensor(out[::-1])


def run_episode(env, policy, g):
    obs, logps, rewards, done = env.reset(), [], [], False
    while not done:
        probs = torch.softmax(policy(obs), -1)
        action = torch.multinomial(probs, 1, generator=g).item()
        logps.append(torch.log(probs[action]))
        obs, reward, done = env.step(action)
        rewards.append(reward)
    return logps, rewards


def rl_main(train, episodes: int = 30) -> None:
    """``--out FILE``; a Policy trained with Adam by ``train(policy, opt, episodes)``."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    args = parser.parse_args()
    setup_determinism()
    policy = Policy()
    opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
    train(policy, opt, episodes)
    save(policy, args.out)
