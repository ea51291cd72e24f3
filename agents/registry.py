"""The default set of algorithms: PPO and the off-policy family.

``default_registry()`` builds a fresh ``AlgorithmRegistry`` each call; whoever needs
algorithms (pod, generator, CLI) receives one as an argument.
"""

from __future__ import annotations

import importlib
import logging

from agents.base import AlgorithmRegistry, AlgorithmSpec
from agents.ppo import SPEC as PPO_SPEC

log = logging.getLogger(__name__)

# TRANSITION: the off-policy modules are being written in parallel; until all of them
# exist they are imported guarded. Replace with plain imports once they have landed.
_OFF_POLICY = ("agents.sac", "agents.td3", "agents.ddpg", "agents.dqn")


def default_registry() -> AlgorithmRegistry:
    """PPO, SAC, TD3, DDPG and DQN by name."""
    specs: dict[str, AlgorithmSpec] = {PPO_SPEC.name: PPO_SPEC}
    for module_name in _OFF_POLICY:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            log.debug("%s not available yet", module_name)
            continue
        spec: AlgorithmSpec = module.SPEC
        specs[spec.name] = spec
    return AlgorithmRegistry(specs)
