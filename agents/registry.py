"""The default set of algorithms: PPO and the off-policy family.

``default_registry()`` builds a fresh ``AlgorithmRegistry`` each call; whoever needs
algorithms (pod, generator, CLI) receives one as an argument.

Adding an algorithm is one new module and one line here: the module defines a frozen
config (checked with ``agents.checks``), an agent satisfying ``agents.base.Agent`` whose
``state_dict`` follows ``agents.state`` (an off-policy one subclasses
``agents.offpolicy.OffPolicyAgent``, which gives it all but its networks, policy and
update) and ``SPEC``; append ``<module>.SPEC`` below. ``tests/agents_contract/
test_sixth_algorithm.py`` does exactly that with REINFORCE.
"""

from __future__ import annotations

from agents import ddpg, dqn, ppo, sac, td3
from agents.base import AlgorithmRegistry


def default_registry() -> AlgorithmRegistry:
    """PPO, SAC, TD3, DDPG and DQN by name."""
    specs = [ppo.SPEC, sac.SPEC, td3.SPEC, ddpg.SPEC, dqn.SPEC]
    return AlgorithmRegistry({spec.name: spec for spec in specs})
