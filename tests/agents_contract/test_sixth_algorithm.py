"""A sixth algorithm takes one new file and one registry line.

The first half of this module is that file: REINFORCE (Williams 1992) written the way
``agents/ppo.py`` reads (config, network, explore, update, checkpoint) from the shared
pieces only: ``agents.base`` (the spec), ``agents.checks`` (config checks),
``agents.networks`` (the MLP, seeded init) and ``agents.state`` (the checkpoint
contract). Shipping it means moving it to ``agents/reinforce.py`` and adding
``reinforce.SPEC`` to the list in ``agents/registry.py``; the test builds its own
registry with that one line instead. ``build_agent``, the pod's ``train_round`` and the
checkpoint then work with no other change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar

import gymnasium
import pytest
import torch

from agents.base import AlgorithmRegistry, AlgorithmSpec, SearchDim
from agents.build import build_agent, resolve_config
from agents.checks import check_positive, check_sizes, check_unit
from agents.networks import flat_dim, gradient_step, mlp, seeded
from agents.pod.round import train_round
from agents.registry import default_registry
from agents.state import adam, live_tensors, load_state, save_state
from broker.core.codec import pack, unpack
from broker.core.errors import ConfigError
from broker.core.schemas import Budget
from envs.base import VecEnv
from envs.registry import make_env

# ------------------------------------------------- the new file: agents/reinforce.py

Rollout = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
COUNTERS = ("counters.env_steps", "counters.iterations")


@dataclasses.dataclass(frozen=True)
class ReinforceConfig:
    """REINFORCE hyperparameters; defaults suit batched torch CartPole."""

    SEARCH_SPACE: ClassVar[Mapping[str, SearchDim]] = MappingProxyType({
        "lr": SearchDim(1e-4, 1e-2, log=True),
    })

    num_envs: int = 8
    """Env copies stepped together."""
    rollout_steps: int = 32
    """Steps per copy per iteration (returns are cut at the rollout's end)."""
    lr: float = 3e-3
    """Adam learning rate."""
    gamma: float = 0.99
    """Discount factor."""
    hidden_size: int = 32
    """Width of every hidden layer."""
    hidden_layers: int = 1
    """Number of hidden layers."""

    def __post_init__(self) -> None:
        check_sizes(self)
        check_positive(self, "lr")
        check_unit(self, "gamma")


class ReinforceAgent:
    """A softmax policy trained on normalised discounted returns; ``agents.base.Agent``."""

    def __init__(self, obs_space: gymnasium.spaces.Space[Any],
                 act_space: gymnasium.spaces.Space[Any], config: ReinforceConfig,
                 device: torch.device, seed: int) -> None:
        if not isinstance(act_space, gymnasium.spaces.Discrete):
            raise ConfigError("algorithm", f"reinforce needs Discrete actions, got {act_space}")
        self.config = config
        self.device = torch.device(device)
        self.env_steps = self.iterations = 0
        sizes = [flat_dim(obs_space.shape), *[config.hidden_size] * config.hidden_layers,
                 int(act_space.n)]
        with seeded(seed):
            self.policy = mlp(sizes, out_gain=0.01).to(self.device)
        self.optimizer = adam(self.policy.parameters(), lr=config.lr)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        self._env: VecEnv | None = None
        self._obs = torch.zeros(0)

    def _logits(self, obs: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.policy(obs.to(self.device, torch.float32).flatten(1))
        return out

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        """The most likely action, or a sample from the policy."""
        logits = self._logits(obs)
        if deterministic:
            return logits.argmax(-1)
        return torch.multinomial(logits.softmax(-1), 1, generator=self.generator).squeeze(-1)

    @torch.no_grad()
    def explore(self, env: VecEnv, steps: int) -> Rollout:
        """``(obs, actions, rewards, episode ended)``, each ``[steps, num_envs, ...]``."""
        if env is not self._env:
            seed = int(torch.randint(2**31 - 1, (1,), generator=self.generator))
            self._obs, _ = env.reset(seed=seed)
            self._env = env
        rows: list[tuple[torch.Tensor, ...]] = []
        obs = self._obs
        for _ in range(steps):
            action = self.act(obs, deterministic=False)
            next_obs, reward, terminated, truncated, _ = env.step(action)
            rows.append((obs, action, reward, terminated | truncated))
            obs = next_obs
        self._obs = obs
        self.env_steps += steps * env.num_envs
        obs_t, actions, rewards, ended = (torch.stack(column) for column in zip(*rows, strict=True))
        return obs_t, actions, rewards, ended

    def update(self, batch: Rollout) -> dict[str, float]:
        """One policy-gradient step on a rollout."""
        obs, actions, rewards, ended = batch
        returns = torch.zeros_like(rewards)
        running = torch.zeros_like(rewards[0])
        for t in reversed(range(rewards.shape[0])):
            running = rewards[t] + self.config.gamma * running * (~ended[t])
            returns[t] = running
        advantage = (returns - returns.mean()) / (returns.std() + 1e-8)
        logp = self._logits(obs.flatten(0, 1)).log_softmax(-1)
        chosen = logp.gather(-1, actions.reshape(-1, 1)).squeeze(-1)
        loss = -(chosen * advantage.reshape(-1)).mean()
        gradient_step(self.optimizer, loss)
        self.iterations += 1
        return {"losses/policy": float(loss.detach()), "rollout/reward_mean": float(rewards.mean())}

    def train_iteration(self, env: VecEnv) -> dict[str, float]:
        """One rollout, one update."""
        return self.update(self.explore(env, self.config.rollout_steps))

    def _live(self) -> dict[str, torch.Tensor]:
        return live_tensors({"policy": self.policy}, [self.optimizer])

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Policy, Adam state, counters and RNG (the layout of ``agents/state.py``)."""
        return save_state(self._live(), {"rng": self.generator},
                          dict(zip(COUNTERS, (self.env_steps, self.iterations), strict=True)))

    def data_layout(self) -> dict[str, torch.Tensor]:
        """REINFORCE keeps no data between iterations."""
        return {}

    def load_state_dict(self, state: Mapping[str, torch.Tensor], keep_data: bool = False
                        ) -> None:
        """Restore ``state_dict`` output; the next rollout starts from a reset."""
        counters = load_state(state, self._live(), {"rng": self.generator}, COUNTERS)
        self.env_steps, self.iterations = counters[COUNTERS[0]], counters[COUNTERS[1]]
        if not keep_data:
            self._env = None


SPEC = AlgorithmSpec("reinforce", ReinforceConfig, ReinforceAgent, discrete=True,
                     continuous=False)

# ------------------------------------------------------------------------ the test

pytestmark = pytest.mark.timeout(60)
ENV = "torch/CartPole-v1"
HPARAMS = {"num_envs": 8, "rollout_steps": 16}


def _registry() -> AlgorithmRegistry:
    default = default_registry()
    specs = {name: default.get(name) for name in default.names()}
    return AlgorithmRegistry({**specs, SPEC.name: SPEC})  # the one registry line


def test_a_sixth_algorithm_trains_checkpoints_and_reloads_through_the_round() -> None:
    torch.set_num_threads(1)
    registry = _registry()
    config = resolve_config(registry, "reinforce", HPARAMS)
    env, eval_env = make_env(ENV, config.num_envs), make_env(ENV, 4)
    agent = build_agent(registry, "reinforce", HPARAMS, env, torch.device("cpu"), seed=0)
    fresh = agent.state_dict()

    result = train_round(agent, env, eval_env, Budget(steps=5 * 8 * 16), eval_episodes=4)
    assert result.state is not None and result.env_steps == 5 * 8 * 16
    assert "losses/policy" in result.metrics
    assert {k: (v.shape, v.dtype) for k, v in result.state.items()} == {
        k: (v.shape, v.dtype) for k, v in fresh.items()}
    assert not torch.equal(result.state["policy.0.weight"], fresh["policy.0.weight"])
    assert float(result.state["optim.policy.0.weight.step"]) == 5

    # the checkpoint crosses the wire and a pod elsewhere builds and continues it
    state = unpack(pack(result.state))
    other_env = make_env(ENV, config.num_envs)
    reloaded = build_agent(registry, "reinforce", HPARAMS, other_env, torch.device("cpu"),
                           seed=1, state=state)
    assert all(torch.equal(v, result.state[k]) for k, v in reloaded.state_dict().items())
    obs, _ = eval_env.reset(seed=3)
    assert torch.equal(reloaded.act(obs), agent.act(obs))
    more = train_round(reloaded, other_env, eval_env, Budget(steps=8 * 16), eval_episodes=4)
    assert more.total_env_steps == 6 * 8 * 16


def test_the_registry_line_brings_the_action_space_check_and_hparams_validation() -> None:
    registry = _registry()
    assert "reinforce" in registry.names() and "reinforce" not in default_registry().names()
    pendulum = make_env("torch/Pendulum-v1", 8)
    with pytest.raises(ConfigError, match="reinforce does not support continuous"):
        build_agent(registry, "reinforce", HPARAMS, pendulum, torch.device("cpu"), seed=0)
    with pytest.raises(ConfigError, match=r"hparams\.lr"):
        resolve_config(registry, "reinforce", {"lr": -1.0})
