"""Building an agent from ``(algorithm, hparams)``: the config, the action-space check,
the agent with its state loaded. Used by the pod, the updater, export and benchmarks."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import gymnasium
import torch

from agents.base import Agent, AlgorithmRegistry, Scalar, config_from_hparams
from broker.core.errors import ConfigError
from envs.base import VecEnv

log = logging.getLogger(__name__)


def resolve_config(registry: AlgorithmRegistry, algorithm: str, hparams: Mapping[str, Scalar]
                   ) -> Any:
    """The validated config of ``algorithm`` (read ``num_envs`` from it to build the env)."""
    return config_from_hparams(registry.get(algorithm).config_cls, hparams)


def check_action_space(registry: AlgorithmRegistry, algorithm: str,
                       action_space: gymnasium.spaces.Space[Any]) -> None:
    """``ConfigError`` if ``algorithm`` cannot act in ``action_space``."""
    spec = registry.get(algorithm)
    if isinstance(action_space, gymnasium.spaces.Discrete):
        ok, kind = spec.discrete, "discrete"
    elif isinstance(action_space, gymnasium.spaces.Box):
        ok, kind = spec.continuous, "continuous"
    else:
        ok, kind = False, type(action_space).__name__
    if not ok:
        able = [n for n in registry.names()
                if (registry.get(n).discrete if kind == "discrete" else registry.get(n).continuous)]
        raise ConfigError("algorithm", f"{algorithm} does not support {kind} actions",
                          f"use one of {', '.join(able) or 'none registered'} for this env")


def without_rng(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` without its RNG states (``rng`` and ``rng.*``)."""
    return {k: v for k, v in state.items() if k != "rng" and not k.startswith("rng.")}


def build_agent(
    registry: AlgorithmRegistry,
    algorithm: str,
    hparams: Mapping[str, Scalar],
    env: VecEnv,
    device: torch.device,
    seed: int,
    state: Mapping[str, torch.Tensor] | None = None,
    *,
    own_rng: bool = False,
) -> Agent:
    """Validate ``hparams``, check the action space, build the agent and load ``state``.

    ``env`` supplies the spaces; its ``num_envs`` must equal the config's (build the env
    from ``resolve_config(...).num_envs``). Every problem is a ``ConfigError`` naming the
    field (a tensor of the wrong shape is named ``state.<tensor>``). With ``own_rng``
    the RNG states in ``state`` are left out, so the agent explores on ``seed``: a
    child of a checkpoint must not replay its parent's (or its siblings') random draws.
    """
    config = resolve_config(registry, algorithm, hparams)
    check_action_space(registry, algorithm, env.single_action_space)
    if env.num_envs != config.num_envs:
        raise ConfigError("env.num_envs", f"env has {env.num_envs} copies, "
                          f"hparams.num_envs is {config.num_envs}",
                          "build the env with resolve_config(...).num_envs copies")
    spec = registry.get(algorithm)
    agent = spec.build(env.single_observation_space, env.single_action_space, config,
                       device, seed)
    if state is not None:
        agent.load_state_dict(without_rng(state) if own_rng else state)
    log.debug("built %s agent (seed %d, state %s)", algorithm, seed,
              "loaded" if state is not None else "fresh")
    return agent
