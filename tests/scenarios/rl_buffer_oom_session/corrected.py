"""Reinforcement learning (REINFORCE on a grid world).  From episode 10 the
agent earns a novelty bonus for rarely visited cells, counted in a replay
buffer of visited observations.  Corrected: a capacity of 10000 transitions."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
from _common import GridWorld, discounted, iteration_done, rl_main

NOVELTY_FROM, NOVELTY_SCALE = 10, 0.05


def run_episode(env, policy, g):
    obs, observations, logps, rewards, done = env.reset(), [], [], [], False
    while not done:
        observations.append(obs)
        probs = torch.softmax(policy(obs), -1)
        action = torch.multinomial(probs, 1, generator=g).item()
        logps.append(torch.log(probs[action]))
        obs, reward, done = env.step(action)
        rewards.append(reward)
    return torch.stack(observations), logps, rewards


def train(policy, opt, episodes):
    env, g = GridWorld(seed=1), torch.Generator().manual_seed(2)
    capacity = 10000
    buffer, filled = None, 0
    for episode in range(episodes):
        if episode == NOVELTY_FROM:
            buffer = torch.zeros(capacity, GridWorld.size * GridWorld.size)
        observations, logps, rewards = run_episode(env, policy, g)
        ret = discounted(rewards)
        if buffer is not None:
            visits = observations @ buffer[: min(filled, capacity)].T  # earlier visits per step
            ret = ret + NOVELTY_SCALE / torch.sqrt(1.0 + visits.sum(1))
            slots = (filled + torch.arange(len(observations))) % capacity
            buffer[slots] = observations
            filled += len(observations)
        loss = -(torch.stack(logps) * ret).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        iteration_done(f"episode {episode}")


if __name__ == "__main__":
    rl_main(train)
