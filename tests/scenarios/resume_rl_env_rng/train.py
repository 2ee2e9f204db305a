"""Reinforcement learning, resumed: REINFORCE on a gymnasium-style env that
owns its randomness (``self.np_random``, a numpy Generator: random start
cells, slippery moves) and samples actions with a ``torch.Generator`` of its
own.  With ``--bug`` the reward shaping looks the goal's bonus up strictly:
in episode 10 the agent first reaches the goal, which the table lacks --
KeyError at the episode's last move, after the env and the sampler drew.
Nobody fixes it; daifu saves the emergency checkpoint with both generators
as they were when episode 10 began (at the optimizer step of episode 9).
Without ``--bug`` a missing cell has no bonus (the reference), and
``--resume PATH`` goes on with ``daifu.resume(..., env=env,
sampler=sampler)``."""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
import torch
from _common import GAMMA, Policy, iteration_done, save, setup_determinism

GOAL = (4, 4)
BONUS = {(2, 2): 0.05, (3, 3): 0.1, (4, 3): 0.2, (3, 4): 0.2}


def bonus(cell, strict):
    return BONUS[cell] if strict and cell == GOAL else BONUS.get(cell, 0.0)


class SlipperyGrid:
    """A 5x5 grid, gymnasium's shape: ``reset``/``step`` and ``np_random``."""

    size = 5

    def __init__(self, seed):
        self.np_random = np.random.default_rng(seed)

    def observe(self):
        obs = torch.zeros(self.size * self.size)
        obs[self.pos[0] * self.size + self.pos[1]] = 1.0
        return obs

    def reset(self):
        self.pos = tuple(int(v) for v in self.np_random.integers(0, 3, size=2))
        self.steps = 0
        return self.observe()

    def step(self, action):
        dr, dc = [(-1, 0), (1, 0), (0, -1), (0, 1)][action]
        if self.np_random.random() < 0.15:  # slippery
            dr, dc = dc, dr
        r, c = self.pos
        self.pos = (min(max(r + dr, 0), self.size - 1), min(max(c + dc, 0), self.size - 1))
        self.steps += 1
        goal = self.pos == (self.size - 1, self.size - 1)
        return self.observe(), 1.0 if goal else -0.01, goal or self.steps >= 25


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    p.add_argument("--resume")
    p.add_argument("--bug", action="store_true", help="the goal's bonus looked up strictly")
    args = p.parse_args()
    setup_determinism(0)
    env = SlipperyGrid(seed=7)
    sampler = torch.Generator().manual_seed(11)
    policy = Policy()
    opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
    start = 0
    if args.resume:
        import daifu
        start = daifu.resume(args.resume, model=policy, optimizer=opt, env=env,
                             sampler=sampler)["episode"]
    for episode in range(start, 20):
        obs, done, logps, rewards = env.reset(), False, [], []
        while not done:
            probs = torch.softmax(policy(obs), -1)
            action = torch.multinomial(probs, 1, generator=sampler).item()
            logps.append(torch.log(probs[action]))
            obs, reward, done = env.step(action)
            rewards.append(reward + bonus(env.pos, args.bug))
        returns, running = [], 0.0
        for r in reversed(rewards):
            running = r + GAMMA * running
            returns.insert(0, running)
        returns = torch.tensor(returns)
        loss = -(torch.stack(logps) * (returns - returns.mean())).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        iteration_done(f"train 0 {episode}")
    save(policy, args.out)


if __name__ == "__main__":
    main()
