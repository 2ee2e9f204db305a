"""Reinforcement learning (REINFORCE on a grid world).  From episode 12 the
returns are shifted and rescaled in place -- with a scale vector of the wrong
shape.  The failing statement has already shifted ``ret`` when it raises: a
blind retry shifts it twice (non-idempotent)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
from _common import GridWorld, discounted, iteration_done, rl_main, run_episode


def train(policy, opt, episodes):
    env, g = GridWorld(seed=1), torch.Generator().manual_seed(2)
    baseline_shift = 0.5
    scale_vec = torch.ones(())
    for episode in range(episodes):
        logps, rewards = run_episode(env, policy, g)
        ret = discounted(rewards)
        if episode >= 12:
            ret.add_(baseline_shift).div_(scale_vec)
        loss = -(torch.stack(logps) * ret).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        iteration_done(f"episode {episode}")


if __name__ == "__main__":
    rl_main(train, episodes=40)
