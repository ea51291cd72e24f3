"""The seams between algorithms and everything else: search spaces, configs, the agent.

An algorithm module (``agents/ppo.py``, ``agents/sac.py`` ...) defines a frozen
config dataclass (one docstring per field, a ``num_envs`` field, a ``SEARCH_SPACE``
class variable naming the fields the generator may mutate) and an agent class that
satisfies ``Agent`` (config checks live in ``agents/checks.py``; off-policy agents
subclass ``agents.offpolicy.OffPolicyAgent``). ``AlgorithmSpec`` ties the two together; an
``AlgorithmRegistry`` is built by ``agents.registry.default_registry()`` and passed
in to whoever needs it (no global).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Protocol, TypeVar

import gymnasium
import torch

from broker.core.errors import ConfigError
from broker.core.schemas import Scalar
from envs.base import VecEnv


@dataclasses.dataclass(frozen=True)
class SearchDim:
    """The range a hyperparameter may take when the generator samples or mutates it."""

    low: float
    high: float
    log: bool = False
    integer: bool = False

    def sample(self, rng: random.Random) -> float | int:
        """Draw uniformly (in log space when ``log``)."""
        if self.log:
            value = math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
        else:
            value = rng.uniform(self.low, self.high)
        return self.clip(value)

    def clip(self, value: float) -> float | int:
        """Clamp into ``[low, high]`` (and round for integer dims)."""
        value = min(max(value, self.low), self.high)
        return round(value) if self.integer else float(value)


class HParams(Protocol):
    """What every algorithm config offers: frozen dataclass fields plus a search space."""

    SEARCH_SPACE: ClassVar[Mapping[str, SearchDim]]
    num_envs: int


C = TypeVar("C")


def _coerce(name: str, default: Any, value: Any) -> Any:
    """``value`` typed like the field's ``default``; ``ConfigError`` when it can't be."""
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"hparams.{name}", f"expected true/false, got {value!r}")
    elif isinstance(default, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"hparams.{name}", f"expected an integer, got {value!r}")
    elif isinstance(default, float):
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ConfigError(f"hparams.{name}", f"expected a number, got {value!r}")
        value = float(value)
        if not math.isfinite(value):
            raise ConfigError(f"hparams.{name}", "must be finite")
    return value


def config_from_hparams(cls: type[C], hparams: Mapping[str, Scalar]) -> C:
    """Build ``cls`` from a flat map; ``ConfigError`` names an unknown or mistyped field."""
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    for name, value in hparams.items():
        if name not in fields:
            raise ConfigError(f"hparams.{name}", f"unknown hyperparameter for {cls.__name__}",
                              f"known: {', '.join(sorted(fields))}")
        kwargs[name] = _coerce(name, fields[name].default, value)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError("hparams", str(exc)) from None


def config_to_hparams(config: Any) -> dict[str, Scalar]:
    """The flat map that travels in ``Initialization.hparams``."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}


class Agent(Protocol):
    """A training agent: tensors in, tensors and metrics out; no I/O.

    ``train_iteration`` is one explore-then-update cycle (for PPO a rollout and its
    epochs; for off-policy methods a batch of env steps and their gradient steps).
    ``state_dict`` is the *full* training state (networks, targets, optimizer
    moments, normalizers, counters, RNG where it matters) as a flat map of tensors, so
    that ``load_state_dict`` resumes training exactly. Its layout is the one checkpoint
    contract of ``agents/state.py``: a freshly built agent's state has the same names,
    shapes and dtypes as a trained one's (optimizer moments are named by parameter and
    exist from construction); only collected data (``replay.*``, ``hterm.*``) varies,
    present when it holds rows, with its row count as the leading dimension.
    """

    config: Any
    device: torch.device
    env_steps: int

    def explore(self, env: VecEnv, steps: int) -> Any:
        """Collect ``steps`` env transitions per copy with the current policy."""
        ...

    def update(self, batch: Any) -> dict[str, float]:
        """Learn from collected data; return namespaced metrics (``losses/actor``)."""
        ...

    def train_iteration(self, env: VecEnv) -> dict[str, float]:
        """One explore-and-update cycle on ``env`` (which has ``config.num_envs`` copies)."""
        ...

    def act(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        """Actions for a batch of observations."""
        ...

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The full training state as a flat map of tensors."""
        ...

    def data_layout(self) -> dict[str, torch.Tensor]:
        """The collected-data tensors a ``state_dict`` may add once it holds rows (replay
        rows, a memory), each with zero rows: their names, per-row shapes and dtypes.
        Everything else a state holds is present from the start (``{}``: nothing)."""
        ...

    def load_state_dict(self, state: Mapping[str, torch.Tensor], keep_data: bool = False
                        ) -> None:
        """Restore a state produced by ``state_dict`` (shape mismatches raise ConfigError).

        RNG states absent from ``state`` keep the agent's own streams. ``keep_data``
        leaves collected data (replay buffer, place in the env) as it is: learner fusion
        loads averaged weights after every iteration."""
        ...


AgentFactory = Callable[
    [gymnasium.spaces.Space[Any], gymnasium.spaces.Space[Any], Any, torch.device, int], Agent
]


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
    """An algorithm's name, config class and agent factory ``(obs_space, act_space, config,
    device, seed) -> Agent``; ``discrete`` / ``continuous`` say which action spaces it takes."""

    name: str
    config_cls: type
    build: AgentFactory
    discrete: bool
    continuous: bool


class AlgorithmRegistry:
    """Algorithms by name; passed in to the pod, generator and CLI."""

    def __init__(self, specs: Mapping[str, AlgorithmSpec]) -> None:
        self._specs = dict(specs)

    def names(self) -> list[str]:
        """Registered algorithm names, sorted."""
        return sorted(self._specs)

    def get(self, name: str) -> AlgorithmSpec:
        """The spec of ``name``; ``ConfigError`` lists what exists."""
        try:
            return self._specs[name]
        except KeyError:
            raise ConfigError("algorithm", f"unknown algorithm {name!r}",
                              f"choose one of {', '.join(self.names())}") from None
