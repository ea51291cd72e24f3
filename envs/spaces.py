"""Gymnasium spaces <-> the plain ``broker.core.spaces`` record kept in the experiment."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np

from broker.core.errors import ConfigError
from broker.core.spaces import Spaces, SpaceSpec
from envs.base import VecEnv
from envs.registry import make_env


def space_spec(space: gymnasium.spaces.Space[Any], field: str) -> SpaceSpec:
    """The record of ``space``; ``ConfigError`` for a kind the agents cannot take."""
    if isinstance(space, gymnasium.spaces.Discrete):
        return SpaceSpec("discrete", n=int(space.n))
    if isinstance(space, gymnasium.spaces.Box):
        return SpaceSpec("box", tuple(int(d) for d in space.shape), str(space.dtype))
    raise ConfigError(field, f"cannot record a {type(space).__name__} space",
                      "the agents take Box observations and Box or Discrete actions")


def gym_space(spec: SpaceSpec) -> gymnasium.spaces.Space[Any]:
    """A space with ``spec``'s layout (bounded by [0, 1]: bounds never shape a tensor,
    so an agent built on it has the real one's tensors, not its behaviour)."""
    if spec.kind == "discrete":
        return gymnasium.spaces.Discrete(spec.n)
    return gymnasium.spaces.Box(0, 1, spec.shape, dtype=np.dtype(spec.dtype))


def spaces_of(vec: VecEnv) -> Spaces:
    """The spaces of one copy of ``vec``."""
    return Spaces(space_spec(vec.single_observation_space, "spaces.observation"),
                  space_spec(vec.single_action_space, "spaces.action"))


def read_spaces(env: str, **env_kwargs: Any) -> Spaces:
    """The spaces of ``env`` (built with ``env_kwargs``), read from one copy built here
    (needs its simulator)."""
    vec = make_env(env, 1, "cpu", **env_kwargs)
    try:
        return spaces_of(vec)
    finally:
        vec.close()
