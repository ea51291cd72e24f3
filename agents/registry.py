"""The default set of algorithms: PPO and the off-policy family.

``default_registry()`` builds a fresh ``AlgorithmRegistry`` each call; whoever needs
algorithms (pod, generator, CLI) receives one as an argument.
"""

from __future__ import annotations

from agents import ddpg, dqn, ppo, sac, td3
from agents.base import AlgorithmRegistry


def default_registry() -> AlgorithmRegistry:
    """PPO, SAC, TD3, DDPG and DQN by name."""
    specs = [ppo.SPEC, sac.SPEC, td3.SPEC, ddpg.SPEC, dqn.SPEC]
    return AlgorithmRegistry({spec.name: spec for spec in specs})
