"""The base of the replay-based agents (DQN, DDPG, TD3, SAC): everything but the math.

``OffPolicyAgent`` owns the replay buffer, the two RNG streams, the counters, how
actions reach the env, the exploration loop and the checkpoint. An algorithm
subclasses it once (no deeper chain) and gives, in its own module read top to bottom:

* its networks and Adam optimizers (``agents.state.adam``), built in ``__init__``
  after ``super().__init__``;
* ``_policy(obs, explore)``: the action in the buffer's scale, the policy's best or
  its exploring choice (noise, a sample, epsilon-greedy);
* ``_update``: one gradient step on a minibatch, metrics as tensors;
* ``_parts`` and ``_optimizers``: what its checkpoint holds (``agents/state.py``).

The agent class itself is the algorithm's ``AlgorithmSpec`` factory: its constructor
takes ``(obs_space, act_space, config, device, seed)``.

``OffPolicyConfig`` holds the fields every off-policy config starts with.
``BoxActions`` maps a tanh policy's [-1, 1] actions (the scale stored in the buffer)
onto the env's box and explores uniformly until ``learning_starts``;
``DiscreteActions`` stores 0-based class indices and shifts them by the space's start.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import gymnasium
import torch

from agents.checks import check_nonnegative, check_sizes, check_unit
from agents.networks import flat_dim
from agents.replay import Batch, ReplayBuffer, store_step
from agents.state import Parts, StateDict, live_tensors, load_state, save_state
from broker.core.errors import ConfigError
from envs.base import VecEnv

log = logging.getLogger(__name__)

COUNTERS = ("counters.env_steps", "counters.updates")


@dataclasses.dataclass(frozen=True)
class OffPolicyConfig:
    """Fields shared by the off-policy configs; each algorithm's config extends it one
    level (re-declaring a field only to change its default)."""

    WORK: ClassVar[tuple[str, ...]] = ("updates_per_iter", "batch_size")
    """Fields whose product is the gradient work per iteration, lowered in this order when
    a sampled or mutated configuration does too much of it (``mutation.max_work``)."""

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
    hidden_size: int = 128
    """Width of every hidden layer of every network."""
    hidden_layers: int = 2
    """Number of hidden layers."""
    checkpoint_replay: bool = False
    """Put the replay buffer in state_dict (big checkpoints, but exact resumption);
    without it a restored agent refills its buffer before updating again."""

    def __post_init__(self) -> None:
        check_sizes(self)
        check_unit(self, "gamma")
        check_nonnegative(self, "learning_starts")


class BoxActions:
    """A continuous (Box) action space seen by a tanh policy acting in [-1, 1]."""

    dtype = torch.float32

    def __init__(self, space: gymnasium.spaces.Space[Any], algorithm: str,
                 device: torch.device) -> None:
        if not isinstance(space, gymnasium.spaces.Box):
            raise ConfigError("algorithm", f"{algorithm} needs a continuous (Box) action space, "
                              f"got {space}", "use dqn or ppo for discrete actions")
        self.device = device
        self.dim = flat_dim(space.shape)
        self.stored: tuple[int, ...] = (self.dim,)
        """The shape of one action in the buffer."""
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
        with ``generator``; each with its env-scale version."""
        if warm:
            action = policy(obs)
        else:
            action = torch.rand((obs.shape[0], self.dim), generator=generator,
                                device=self.device) * 2.0 - 1.0
        return action, self.to_env(action)


class DiscreteActions:
    """A Discrete action space: the buffer stores 0-based class indices."""

    dtype = torch.int64
    stored: tuple[int, ...] = ()

    def __init__(self, space: gymnasium.spaces.Space[Any], algorithm: str) -> None:
        if not isinstance(space, gymnasium.spaces.Discrete):
            raise ConfigError("algorithm", f"{algorithm} needs a Discrete action space, got "
                              f"{space}", "use sac, td3, ddpg or ppo for continuous actions")
        self.n = int(space.n)
        self.start = int(space.start)

    def to_env(self, action: torch.Tensor) -> torch.Tensor:
        """The env's actions: indices shifted by the space's ``start``."""
        return action + self.start

    def explore(self, obs: torch.Tensor, policy: Callable[[torch.Tensor], torch.Tensor],
                warm: bool, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``policy(obs)`` from the first step (its own schedule explores, e.g. epsilon)
        and its env version."""
        action = policy(obs)
        return action, self.to_env(action)


def seeded_generator(seed: int, device: torch.device) -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded with ``seed``."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


class OffPolicyAgent(abc.ABC):
    """Replay buffer, exploration loop, counters and checkpoint of an off-policy agent.

    ``explore_gen`` (seeded ``seed + 1``) drives env reset seeds and exploration noise;
    ``sample_gen`` (``seed + 2``) draws minibatches and any noise of the update itself.
    ``env_steps`` counts the env transitions this agent collected, ``updates`` its
    gradient steps (TD3's delay and DQN's target refresh read it).
    """

    config: OffPolicyConfig
    discrete: ClassVar[bool] = False
    """Which action space the algorithm takes: Discrete (True) or Box (False)."""

    def __init__(self, config: OffPolicyConfig, obs_space: gymnasium.spaces.Space[Any],
                 act_space: gymnasium.spaces.Space[Any], device: torch.device, seed: int
                 ) -> None:
        self.config = config
        self.device = torch.device(device)
        name = type(self).__name__.removesuffix("Agent")
        self.actions = (DiscreteActions(act_space, name) if self.discrete
                        else BoxActions(act_space, name, self.device))
        self.env_steps = 0
        self.updates = 0
        self.buffer = ReplayBuffer(config.buffer_size, obs_space.shape or (),
                                   self.actions.stored, self.device,
                                   action_dtype=self.actions.dtype)
        self.explore_gen = seeded_generator(seed + 1, self.device)
        self.sample_gen = seeded_generator(seed + 2, self.device)
        # where exploration stands; not training state (a new env starts from a reset)
        self._env: VecEnv | None = None
        self._obs: torch.Tensor | None = None
        log.debug("%s agent: obs %s, actions %s, %d envs, seed %d", name, obs_space.shape,
                  act_space, config.num_envs, seed)

    # ------------------------------------------------------- what an algorithm gives

    @abc.abstractmethod
    def _policy(self, obs: torch.Tensor, explore: bool) -> torch.Tensor:
        """Actions in the buffer's scale for float32 ``obs`` on the device: the policy's
        best, or with ``explore`` its exploring choice (drawn with ``explore_gen``)."""

    @abc.abstractmethod
    def _update(self, batch: Batch) -> dict[str, torch.Tensor]:
        """One gradient step on ``batch`` (counting ``updates``); metrics as tensors."""

    @abc.abstractmethod
    def _parts(self) -> Parts:
        """The networks and lone tensors of the checkpoint, by state name."""

    @abc.abstractmethod
    def _optimizers(self) -> Sequence[torch.optim.Optimizer]:
        """The optimizers whose state the checkpoint holds (made with ``state.adam``)."""

    # ------------------------------------------------------------------ acting

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        """Env actions for a batch of observations (exploring when not ``deterministic``)."""
        action = self._policy(obs.to(self.device, torch.float32), explore=not deterministic)
        return self.actions.to_env(action)

    def _explore_policy(self, obs: torch.Tensor) -> torch.Tensor:
        return self._policy(obs, explore=True)

    @torch.no_grad()
    def explore(self, env: VecEnv, steps: int) -> dict[str, float]:
        """Step ``env`` ``steps`` times with the exploring policy (for a Box, uniform until
        ``learning_starts``), storing every transition."""
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
            warm = self.env_steps >= self.config.learning_starts
            action, env_action = self.actions.explore(obs, self._explore_policy, warm,
                                                      self.explore_gen)
            next_obs, reward, ended = store_step(env, self.buffer, obs, action, env_action)
            obs = next_obs.to(self.device, torch.float32)
            self.env_steps += obs.shape[0]
            reward_sum += reward.sum()
            ended_sum += ended.sum()
        self._obs = obs
        return {"rollout/reward_mean": float(reward_sum) / max(1, steps * obs.shape[0]),
                "rollout/episodes_ended": float(ended_sum)}

    def add_transitions(self, obs: torch.Tensor, action: torch.Tensor, reward: torch.Tensor,
                        next_obs: torch.Tensor, terminated: torch.Tensor) -> None:
        """Add ``N`` transitions collected elsewhere (another agent, a shared pool).

        Batched tensors with leading dim ``N``: ``obs`` and ``next_obs`` shaped like the
        env's observations (``next_obs`` the true successor, also where an episode
        ended), ``action`` in the scale this agent stores (the policy's [-1, 1] for a Box,
        the 0-based class index for DQN), ``reward`` and ``terminated`` (bool; False for
        a time-limit truncation) of shape ``[N]``. They are copied to the agent's device.
        ``env_steps`` does not change (the agent did not step an env), so a Box agent's
        uniform warm-up still lasts until it has taken ``learning_starts`` steps itself;
        the updates start once the buffer holds enough. ``ConfigError`` names a tensor
        of the wrong shape or dtype.
        """
        n = obs.shape[0] if obs.dim() > 0 else -1
        buf = self.buffer
        want = {"obs": (obs, buf.obs), "action": (action, buf.action),
                "reward": (reward, buf.reward), "next_obs": (next_obs, buf.next_obs),
                "terminated": (terminated, buf.done)}
        for name, (value, store) in want.items():
            shape = (n, *store.shape[1:])
            if tuple(value.shape) != shape:
                raise ConfigError(name, f"shape {tuple(value.shape)}, expected {shape}",
                                  "pass N transitions batched along the first dimension")
            kind = torch.bool if name == "terminated" else store.dtype
            if value.dtype != kind and not (value.is_floating_point() and kind.is_floating_point):
                raise ConfigError(name, f"dtype {value.dtype}, expected {kind}",
                                  f"convert {name} with .to({kind})")
        buf.add(*(value.to(self.device) for value, _ in want.values()))

    # ------------------------------------------------------------------- learning

    def update(self, batch: Batch) -> dict[str, float]:
        """One gradient step of the algorithm on ``batch``."""
        return {k: float(v) for k, v in self._update(batch).items()}

    def train_iteration(self, env: VecEnv) -> dict[str, float]:
        """Explore ``steps_per_iter`` steps per copy, then ``updates_per_iter`` updates on
        fresh minibatches once the buffer holds ``max(batch_size, learning_starts)``;
        each metric is averaged over the updates that reported it (TD3 reports its actor
        loss only every ``policy_delay``)."""
        cfg = self.config
        metrics = self.explore(env, cfg.steps_per_iter)
        if len(self.buffer) < max(cfg.batch_size, cfg.learning_starts):
            return metrics
        sums: dict[str, torch.Tensor] = {}
        counts: dict[str, int] = {}
        for _ in range(cfg.updates_per_iter):
            batch = self.buffer.sample(cfg.batch_size, self.sample_gen)
            for key, value in self._update(batch).items():
                sums[key] = sums.get(key, 0.0) + value
                counts[key] = counts.get(key, 0) + 1
        metrics.update({k: float(v) / counts[k] for k, v in sums.items()})
        return metrics

    # ---------------------------------------------------------------- checkpoints

    def _generators(self) -> dict[str, torch.Generator]:
        return {"rng.explore": self.explore_gen, "rng.sample": self.sample_gen}

    def state_dict(self) -> StateDict:
        """Networks, Adam state by parameter, both RNG states, the counters and (with
        ``checkpoint_replay``, once it holds rows) the replay buffer; all copies."""
        state = save_state(live_tensors(self._parts(), self._optimizers()), self._generators(),
                           dict(zip(COUNTERS, (self.env_steps, self.updates), strict=True)))
        if self.config.checkpoint_replay and len(self.buffer) > 0:
            state.update(self.buffer.state_dict())
        return state

    def data_layout(self) -> StateDict:
        """The replay rows a state adds with ``checkpoint_replay`` (zero rows here)."""
        if not self.config.checkpoint_replay:
            return {}
        return {k: v[:0] if v.dim() else v for k, v in self.buffer.state_dict().items()}

    def load_state_dict(self, state: Mapping[str, torch.Tensor], keep_data: bool = False
                        ) -> None:
        """Restore ``state_dict`` output exactly (copying, never aliasing ``state``);
        ``ConfigError`` names a missing, unexpected or mis-shaped tensor.

        The buffer is restored from ``replay.*`` if ``state`` has rows, else emptied, and
        the next ``explore`` resets its env. ``keep_data`` (learner fusion, after every
        iteration) leaves the buffer and the place in the env as they are.
        """
        counters = load_state(state, live_tensors(self._parts(), self._optimizers()),
                              self._generators(), COUNTERS, data=("replay.",))
        self.env_steps, self.updates = counters[COUNTERS[0]], counters[COUNTERS[1]]
        if keep_data:
            return
        if "replay.obs" in state:
            self.buffer.load_state_dict(state)
        else:
            self.buffer.clear()
        self._env, self._obs = None, None
