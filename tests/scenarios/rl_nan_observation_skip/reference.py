"""Reinforcement learning (REINFORCE on a grid world).  The agent reads its
position from a noisy sensor every step; one reading (episode 9, reading 5)
comes back NaN.  The reference drops a non-finite reading explicitly: the step
is skipped (no action, no reward) and the next step reads the sensor again,
with fresh noise -- exactly what ``daifu.CONTINUE`` does at the crash."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
from _common import GridWorld, discounted, iteration_done, rl_main

MAX_STEPS = 40


class SensorGridWorld(GridWorld):
    """The grid world seen through a noisy sensor that glitches once."""

    def __init__(self, seed, glitch):
        super().__init__(seed)
        self.noise = torch.Generator().manual_seed(seed + 100)
        self.glitch = glitch  # (episode, reading) that comes back NaN
        self.episode, self.readings = -1, 0

    def reset(self):
        self.episode, self.readings = self.episode + 1, 0
        return super().reset()

    def sense(self):
        obs = self.observe() + 0.1 * torch.randn(self.size * self.size, generator=self.noise)
        if (self.episode, self.readings) == self.glitch:
            obs[self.pos[0] * self.size + self.pos[1]] = float("nan")
        self.readings += 1
        return obs


def run_episode(env, policy, g):
    env.reset()
    logps, rewards = [], []
    for _step in range(MAX_STEPS):
        obs = env.sense()
        if not torch.isfinite(obs).all():
            continue  # a corrupted frame: skip this step, read the sensor again
        probs = torch.softmax(policy(obs), -1)
        action = torch.multinomial(probs, 1, generator=g).item()
        logps.append(torch.log(probs[action]))
        _, reward, done = env.step(action)
        rewards.append(reward)
        if done:
            break
    return logps, rewards


def train(policy, opt, episodes):
    env, g = SensorGridWorld(seed=1, glitch=(9, 5)), torch.Generator().manual_seed(2)
    for episode in range(episodes):
        logps, rewards = run_episode(env, policy, g)
        loss = -(torch.stack(logps) * discounted(rewards)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        iteration_done(f"episode {episode}")


if __name__ == "__main__":
    rl_main(train)
