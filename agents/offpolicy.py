"""What the replay-based agents (DQN, DDPG, TD3, SAC) share besides the buffer itself.

* ``OffPolicyConfig``: the explore-then-replay fields every off-policy config starts
  with; each algorithm's config extends it one level (re-declaring a field only to
  change its default, which keeps the field order and so the hparams order).
* ``BoxActions``: a continuous action space seen by a tanh policy, whose actions live
  in [-1, 1] (the scale stored in the buffer) and reach the env's box only when
  stepping it.
* ``ReplayLoop``: an agent's buffer, its two RNG streams and where its exploration
  stands in the env; collects transitions, runs the replay updates of one training
  iteration, and saves or restores them with the agent's networks. Agents hold one
  (composition): the algorithm's math stays in its own module.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium
import torch

from agents.networks import flat_dim
from agents.replay import (
    Batch,
    Parts,
    ReplayBuffer,
    StateDict,
    load_training_state,
    save_training_state,
    seeded_generator,
    store_step,
)
from broker.core.errors import ConfigError
from envs.base import VecEnv

ExplorePolicy = Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]
"""``(obs, env_steps) -> (action to store, action to step the env with)``."""


@dataclasses.dataclass(frozen=True)
class OffPolicyConfig:
    """Fields shared by the off-policy configs; not used on its own (no validation)."""

    num_envs: int = 64
    """Parallel env copies explored in one batch."""
    steps_per_iter: int = 1
    """Env steps per copy collected in one training iteration."""
    updates_per_iter: int = 4
    """Gradient steps per training iteration (sets the replay ratio
    ``updates_per_iter * batch_size / (steps_per_iter * num_envs)``)."""
    batch_size: int = 256
    """Transitions per gradient step."""
    buffer_size: int = 300_000
    """Replay capacity in transitions, preallocated on the device:
    ``buffer_size * (2 * obs_dim + act_dim + 2) * 4`` bytes."""
    learning_starts: int = 1_024
    """Transitions collected before updates begin (the continuous-action agents act
    uniformly at random until then)."""
    gamma: float = 0.99
    """Discount factor."""


class BoxActions:
    """Maps a tanh policy's [-1, 1] actions onto a continuous (Box) action space."""

    def __init__(self, space: gymnasium.spaces.Space[Any], algorithm: str,
                 device: torch.device) -> None:
        if not isinstance(space, gymnasium.spaces.Box):
            raise ConfigError("algorithm", f"{algorithm} needs a continuous (Box) action space, "
                              f"got {space}", "use dqn or ppo for discrete actions")
        self.device = device
        self.dim = flat_dim(space.shape)
        self.shape = tuple(space.shape)
        self.low = torch.as_tensor(space.low, dtype=torch.float32, device=device)
        self.high = torch.as_tensor(space.high, dtype=torch.float32, device=device)

    def to_env(self, action: torch.Tensor) -> torch.Tensor:
        """Env-scale actions ``[B, *shape]`` from policy-scale ones ``[B, dim]``."""
        scaled = self.low + 0.5 * (action + 1.0) * (self.high - self.low)
        return scaled.reshape(action.shape[0], *self.shape)

    def explore(self, obs: torch.Tensor, policy: Callable[[torch.Tensor], torch.Tensor],
                warm: bool, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``policy(obs)`` once ``warm``, before that actions drawn uniformly from [-1, 1]
        with ``generator``; each with its env-scale version (an ``ExplorePolicy`` result)."""
        if warm:
            action = policy(obs)
        else:
            action = torch.rand((obs.shape[0], self.low.numel()), generator=generator,
                                device=self.device) * 2.0 - 1.0
        return action, self.to_env(action)


class ReplayLoop:
    """An off-policy agent's replay buffer, RNG streams and place in its env.

    ``explore_gen`` (seeded ``seed + 1``) drives env reset seeds and exploration noise;
    ``sample_gen`` (``seed + 2``) draws minibatches and any noise of the update itself.
    """

    def __init__(self, buffer: ReplayBuffer, seed: int, device: torch.device) -> None:
        self.buffer = buffer
        self.device = device
        self.explore_gen = seeded_generator(seed + 1, device)
        self.sample_gen = seeded_generator(seed + 2, device)
        self._env: VecEnv | None = None
        self._obs: torch.Tensor | None = None

    @torch.no_grad()
    def collect(self, env: VecEnv, steps: int, env_steps: int, policy: ExplorePolicy
                ) -> tuple[dict[str, float], int]:
        """Step ``env`` ``steps`` times with ``policy``, storing every transition; return
        the rollout metrics and the advanced ``env_steps``."""
        if env is not self._env or self._obs is None:
            # a new env (or a restored agent) starts from a reset seeded by the agent's RNG
            seed = int(torch.randint(0, 2**31 - 1, (1,), generator=self.explore_gen,
                                     device=self.device))
            self._obs, _ = env.reset(seed=seed)
            self._env = env
        obs = self._obs.to(self.device, torch.float32)
        # sums stay tensors: a .item() per step would stall the loop (a GPU sync)
        reward_sum = torch.zeros((), device=self.device)
        ended_sum = torch.zeros((), dtype=torch.int64, device=self.device)
        for _ in range(steps):
            action, env_action = policy(obs, env_steps)
            next_obs, reward, ended = store_step(env, self.buffer, obs, action, env_action)
            obs = next_obs.to(self.device, torch.float32)
            env_steps += obs.shape[0]
            reward_sum += reward.sum()
            ended_sum += ended.sum()
        self._obs = obs
        return ({"rollout/reward_mean": float(reward_sum) / max(1, steps * obs.shape[0]),
                 "rollout/episodes_ended": float(ended_sum)}, env_steps)

    def run_updates(self, config: OffPolicyConfig,
                    update: Callable[[Batch], dict[str, torch.Tensor]]) -> dict[str, float]:
        """``updates_per_iter`` calls of ``update`` on fresh minibatches, once the buffer
        holds ``max(batch_size, learning_starts)``; each metric is averaged over the calls
        that reported it (TD3 reports its actor loss only every ``policy_delay``)."""
        if len(self.buffer) < max(config.batch_size, config.learning_starts):
            return {}
        sums: dict[str, torch.Tensor] = {}
        counts: dict[str, int] = {}
        for _ in range(config.updates_per_iter):
            for key, value in update(self.buffer.sample(config.batch_size,
                                                        self.sample_gen)).items():
                sums[key] = sums.get(key, 0.0) + value
                counts[key] = counts.get(key, 0) + 1
        return {k: float(v) / counts[k] for k, v in sums.items()}

    # ---------------------------------------------------------------- checkpoints

    def _generators(self) -> dict[str, torch.Generator]:
        return {"explore": self.explore_gen, "sample": self.sample_gen}

    def save(self, parts: Parts, optimizers: Mapping[str, torch.optim.Optimizer],
             env_steps: int, updates: int, with_buffer: bool) -> StateDict:
        """The agent's full training state: ``parts``, ``optimizers``, both RNG states,
        the counters and, ``with_buffer``, the replay buffer."""
        return save_training_state(parts, optimizers, self._generators(),
                                   {"env_steps": env_steps, "updates": updates},
                                   self.buffer if with_buffer else None)

    def load(self, state: Mapping[str, torch.Tensor], parts: Parts,
             optimizers: Mapping[str, torch.optim.Optimizer], keep_data: bool = False
             ) -> tuple[int, int]:
        """Restore what ``save`` wrote; return ``(env_steps, updates)``. Unless
        ``keep_data``, the buffer is emptied if ``state`` carries none and the next
        ``collect`` resets its env; with it (learner fusion, every iteration) both stay."""
        counters = load_training_state(state, parts, optimizers, self._generators(),
                                       ("env_steps", "updates"), self.buffer, keep_data)
        if not keep_data:
            self._env, self._obs = None, None
        return counters["env_steps"], counters["updates"]
