"""Reinforcement learning (REINFORCE on a grid world).  The environment runs
in a simulator server; every step is a request over a connection that is
reset once mid-run (request 250, in episode 8).  The server refuses the
request before touching the environment, so resending the same step is exact
-- but the training loop has no retry: one dropped connection kills the run."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
from _common import GridWorld, discounted, iteration_done, rl_main

DROPPED_REQUEST = 250  # the simulated network drops this one request


class RemoteGridWorld(GridWorld):
    """A grid world behind a (simulated) connection to a simulator server."""

    def __init__(self, seed, dropped=DROPPED_REQUEST):
        super().__init__(seed)
        self.requests, self.dropped = 0, dropped

    def step(self, action):
        self.requests += 1
        if self.requests == self.dropped:  # the server never saw this request
            raise ConnectionResetError(104, "Connection reset by peer")
        return super().step(action)


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
    env, g = RemoteGridWorld(seed=1), torch.Generator().manual_seed(2)
    for episode in range(episodes):
        logps, rewards = run_episode(env, policy, g)
        loss = -(torch.stack(logps) * discounted(rewards)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        iteration_done(f"episode {episode}")


if __name__ == "__main__":
    rl_main(train)
