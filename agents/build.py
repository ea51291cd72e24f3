"""Building an agent from ``(algorithm, hparams)``: the config, the action-space check,
the agent with its state loaded. Used by the pod, the updater, export and benchmarks.

A service resolves a round once (``resolve``) where its message arrives and passes the
``Resolved`` value down; ``build_agent`` is the one-call form for scripts and tests."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import gymnasium
import torch

from agents.base import Agent, AlgorithmRegistry, AlgorithmSpec, Scalar, config_from_hparams
from broker.core.errors import ConfigError
from envs.base import VecEnv

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Resolved:
    """A round's ``(algorithm, hparams)`` validated once: the algorithm and its config.

    Built where the message arrives (the pod, the updater) and passed down; nothing
    below validates the hyperparameters again."""

    spec: AlgorithmSpec
    config: Any
    """The algorithm's frozen config (its ``num_envs`` sizes the round's env)."""

    @property
    def algorithm(self) -> str:
        """The algorithm's registry name."""
        return self.spec.name

    def build(self, obs_space: gymnasium.spaces.Space[Any],
              action_space: gymnasium.spaces.Space[Any], device: torch.device, seed: int,
              state: Mapping[str, torch.Tensor] | None = None, *, own_rng: bool = False,
              config: Any = None) -> Agent:
        """The agent on these spaces with ``state`` loaded (``ConfigError`` names a bad
        tensor); ``own_rng`` leaves the RNG states of ``state`` out, so the agent explores
        on ``seed`` (a child must not replay its parent's or siblings' random draws).
        ``config`` overrides the resolved one (the updater builds on one env copy)."""
        agent = self.spec.build(obs_space, action_space,
                                self.config if config is None else config, device, seed)
        if state is not None:
            agent.load_state_dict(without_rng(state) if own_rng else state)
        log.debug("built %s agent (seed %d, state %s)", self.algorithm, seed,
                  "loaded" if state is not None else "fresh")
        return agent


def resolve(registry: AlgorithmRegistry, algorithm: str, hparams: Mapping[str, Scalar]
            ) -> Resolved:
    """``algorithm`` and its validated config; ``ConfigError`` names a bad field."""
    spec = registry.get(algorithm)
    return Resolved(spec, config_from_hparams(spec.config_cls, hparams))


def resolve_config(registry: AlgorithmRegistry, algorithm: str, hparams: Mapping[str, Scalar]
                   ) -> Any:
    """The validated config of ``algorithm`` (read ``num_envs`` from it to build the env)."""
    return resolve(registry, algorithm, hparams).config


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


def check_env(registry: AlgorithmRegistry, resolved: Resolved, env: VecEnv) -> None:
    """``ConfigError`` unless ``resolved`` can act in ``env`` and ``env`` has its
    ``num_envs`` copies (build the env from ``resolved.config.num_envs``)."""
    check_action_space(registry, resolved.algorithm, env.single_action_space)
    if env.num_envs != resolved.config.num_envs:
        raise ConfigError("env.num_envs", f"env has {env.num_envs} copies, "
                          f"hparams.num_envs is {resolved.config.num_envs}",
                          "build the env with resolve_config(...).num_envs copies")


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
    """Resolve ``hparams``, check ``env`` and build the agent with ``state`` loaded: the
    one-call form for scripts and tests (services resolve once and call ``Resolved.build``).

    ``env`` supplies the spaces; its ``num_envs`` must equal the config's. Every problem
    is a ``ConfigError`` naming the field (a tensor of the wrong shape is named
    ``state.<tensor>``); ``own_rng`` as in ``Resolved.build``.
    """
    resolved = resolve(registry, algorithm, hparams)
    check_env(registry, resolved, env)
    return resolved.build(env.single_observation_space, env.single_action_space, device,
                          seed, state, own_rng=own_rng)
