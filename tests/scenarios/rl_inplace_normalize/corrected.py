"""Reinforcement learning (REINFORCE on a grid world).  From episode 12 the
returns are shifted and rescaled in place -- with a scale vector of the wrong
shape.  The failing statement has already shifted ``ret`` when it raises: a
blind retry shifts it twice (non-idempotent)."""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
from _common import GridWorld, Policy, iteration_done, save, setup_determinism

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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    args = parser.parse_args()
    setup_determinism()
    policy = Policy()
    opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
    train(policy, opt, 40)
    save(policy, args.out)


if __name__ == "__main__":
    main()
