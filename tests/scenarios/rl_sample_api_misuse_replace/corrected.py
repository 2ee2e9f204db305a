"""Reinforcement learning (REINFORCE on a grid world).  From episode 10 the
agent samples at a lower temperature to exploit what it learned -- and the
helper's temperature path hands the scaled logits, not probabilities, to
torch.multinomial.  Corrected: the softmax of the scaled logits."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
from _common import GridWorld, discounted, iteration_done, rl_main

EXPLOIT_FROM, EXPLOIT_TEMPERATURE = 10, 0.5


def select_action(logits, g, temperature):
    """Sample an action at ``temperature``; return it and its log-probability."""
    if temperature == 1.0:
        probs = torch.softmax(logits, -1)
    else:
        probs = torch.softmax(logits / temperature, -1)
    action = torch.multinomial(probs, 1, generator=g).item()
    return action, torch.log(probs[action])


def run_episode(env, policy, g, temperature):
    obs, logps, rewards, done = env.reset(), [], [], False
    while not done:
        action, logp = select_action(policy(obs), g, temperature)
        logps.append(logp)
        obs, reward, done = env.step(action)
        rewards.append(reward)
    return logps, rewards


def train(policy, opt, episodes):
    env, g = GridWorld(seed=1), torch.Generator().manual_seed(2)
    for episode in range(episodes):
        temperature = 1.0 if episode < EXPLOIT_FROM else EXPLOIT_TEMPERATURE
        logps, rewards = run_episode(env, policy, g, temperature)
        loss = -(torch.stack(logps) * discounted(rewards)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        iteration_done(f"episode {episode}")


if __name__ == "__main__":
    rl_main(train)
