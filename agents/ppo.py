"""Proximal Policy Optimization (clipped surrogate) on batched torch envs.

Reads top to bottom like CleanRL's ``ppo_continuous_action.py``: config, networks, then
one training iteration in order: ``explore`` collects ``rollout_steps`` per env copy,
``update`` computes GAE advantages and returns, then runs the clipped-surrogate epochs.
Continuous actions use a Gaussian with a state-independent log std, acting in a
normalised ``[-1, 1]`` box rescaled to the env's bounds; discrete actions use a
Categorical. Terminations and truncations are kept apart: an episode cut by a time limit
is bootstrapped by adding ``gamma * V(final_obs)`` to the reward of its last step. All
randomness (action noise, minibatch order, env reset seeds) comes from the agent's own
``torch.Generator``, whose state is part of ``state_dict``, so a restored agent continues
bit for bit.

The defaults are tuned for massively parallel CPU/GPU envs (many copies, short
rollouts, large minibatches) and reach -200 on the torch Pendulum-v1 in a few seconds.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar

import gymnasium
import torch
from torch import nn

from agents.base import AlgorithmSpec, SearchDim
from agents.checks import check_nonnegative, check_positive, check_sizes, check_unit
from agents.hterm import DEFAULT_WEIGHT, HTermMemory, action_dims, hterm_loss
from agents.networks import RunningMeanStd, flat_dim, mlp, seeded
from agents.rollout import Rollout, finished_returns, gae
from agents.state import Parts, adam, live_tensors, load_state, save_state
from broker.core.errors import ConfigError
from envs.base import VecEnv

log = logging.getLogger(__name__)

LOG_2PI = math.log(2.0 * math.pi)


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    """Hyperparameters of PPO (all scalars, so they travel in ``Initialization.hparams``)."""

    num_envs: int = 1024
    """Env copies stepped together; the pod builds its env with this many."""
    rollout_steps: int = 16
    """Steps per copy per iteration; one iteration trains on ``num_envs * rollout_steps``."""
    lr: float = 6e-3
    """Adam learning rate (actor and critic share one optimizer)."""
    gamma: float = 0.95
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda: 0 is one-step TD, 1 is Monte Carlo."""
    clip_coef: float = 0.2
    """Clip range of the probability ratio in the surrogate objective."""
    update_epochs: int = 4
    """Passes over each rollout."""
    num_minibatches: int = 4
    """Minibatches per epoch (minibatch size = rollout size / this)."""
    ent_coef: float = 0.0
    """Entropy bonus weight."""
    vf_coef: float = 0.5
    """Value loss weight."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""
    norm_adv: bool = True
    """Normalise advantages per minibatch."""
    norm_obs: bool = True
    """Normalise observations by running mean/std (statistics are part of the state)."""
    reward_scale: float = 0.1
    """Rewards are multiplied by this before learning (keeps value targets near unit scale)."""
    hidden_size: int = 32
    """Width of each hidden layer of the actor and the critic."""
    hidden_layers: int = 2
    """Number of hidden layers of the actor and the critic."""
    init_log_std: float = 0.0
    """Initial log std of the Gaussian policy (continuous actions only)."""
    hterm: bool = False
    """Add the H-term (``agents/hterm.py``): keep the above-average-return transitions of
    past rollouts and raise their actions' probability. Off by default."""
    hterm_weight: float = DEFAULT_WEIGHT
    """Weight of the H-term in the loss (read only with ``hterm``)."""

    WORK: ClassVar[tuple[str, ...]] = ("update_epochs",)
    """The field that sets the gradient work per rollout (``mutation.max_work``)."""

    # only fields a mutated child can change while loading its parent's state: the
    # network sizes would change tensor shapes, num_envs the pod's env
    SEARCH_SPACE: ClassVar[Mapping[str, SearchDim]] = MappingProxyType({
        "lr": SearchDim(1e-4, 1e-2, log=True),
        "gamma": SearchDim(0.9, 0.999),
        "gae_lambda": SearchDim(0.8, 1.0),
        "clip_coef": SearchDim(0.1, 0.3),
        "update_epochs": SearchDim(1, 10, integer=True),
        "ent_coef": SearchDim(0.0, 0.01),
        "vf_coef": SearchDim(0.25, 1.0),
        "max_grad_norm": SearchDim(0.3, 2.0),
        "reward_scale": SearchDim(0.01, 1.0, log=True),
        "hterm_weight": SearchDim(0.01, 1.0, log=True),
    })

    def __post_init__(self) -> None:
        check_sizes(self)
        check_positive(self, "lr", "clip_coef", "max_grad_norm", "reward_scale")
        check_nonnegative(self, "hterm_weight")
        check_unit(self, "gamma", "gae_lambda")
        if self.num_envs * self.rollout_steps < self.num_minibatches:
            raise ConfigError("hparams.num_minibatches", "more minibatches than samples",
                              "lower num_minibatches or raise num_envs * rollout_steps")


class PPOAgent:
    """A PPO learner satisfying ``agents.base.Agent``."""

    def __init__(self, obs_space: gymnasium.spaces.Space[Any],
                 action_space: gymnasium.spaces.Space[Any], config: PPOConfig,
                 device: torch.device, seed: int) -> None:
        self.config = config
        self.device = device
        self.env_steps = 0
        self.iterations = 0
        self._obs_shape = obs_shape = tuple(obs_space.shape or ())
        self._action_shape: tuple[int, ...] = ()
        self._discrete = isinstance(action_space, gymnasium.spaces.Discrete)
        if isinstance(action_space, gymnasium.spaces.Discrete):
            n_out = int(action_space.n)
        elif isinstance(action_space, gymnasium.spaces.Box):
            n_out, self._action_shape = flat_dim(action_space.shape), tuple(action_space.shape)
            if not (action_space.is_bounded("both")):
                raise ConfigError("env", "PPO needs a bounded Box action space",
                                  "bound the env's actions (e.g. a clip wrapper)")
            low = torch.as_tensor(action_space.low, dtype=torch.float32, device=device)
            high = torch.as_tensor(action_space.high, dtype=torch.float32, device=device)
            self._act_center = ((high + low) / 2).reshape(-1)
            self._act_half = ((high - low) / 2).reshape(-1)
        else:
            raise ConfigError("env", f"PPO cannot act in {action_space}",
                              "use an env with a Discrete or Box action space")

        # raw actions are stored flat: a class index, or the n_out Gaussian coordinates
        self._raw_shape: tuple[int, ...] = () if self._discrete else (n_out,)
        hidden = [config.hidden_size] * config.hidden_layers
        n_in = flat_dim(obs_shape)
        with seeded(seed):
            self.actor = mlp([n_in, *hidden, n_out], out_gain=0.01).to(device)
            self.critic = mlp([n_in, *hidden, 1], out_gain=1.0).to(device)
        # unused (and frozen) for discrete actions; kept so every PPO state has one layout
        self.log_std = nn.Parameter(torch.full((n_out,), config.init_log_std, device=device),
                                    requires_grad=not self._discrete)
        self.obs_rms = RunningMeanStd(obs_shape).to(device)
        trainable = [*self.actor.parameters(), *([] if self._discrete else [self.log_std]),
                     *self.critic.parameters()]
        self.optimizer = adam(trainable, lr=config.lr, eps=1e-5)
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        # the H-term's memory of good transitions (raw observations: the normaliser moves)
        self._hterm = HTermMemory(
            obs_shape, self._raw_shape, torch.long if self._discrete else torch.float32,
            device) if config.hterm else None

        # per-env episode bookkeeping; not training state (a new env starts afresh)
        self._env: VecEnv | None = None
        self._obs = self._ep_return = torch.zeros(0, device=device)
        self._rollout: Rollout | None = None
        self._norm_cache: tuple[torch.Tensor, torch.Tensor] | None = None
        self._episodes: dict[str, float] = {}  # metrics of the episodes the last rollout ended

    # ----------------------------------------------------------------- policy

    def _norm(self, obs: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Observations as the networks see them: float32, normalised when configured
        (written into ``out`` when given)."""
        obs = obs.to(self.device, torch.float32)
        if not self.config.norm_obs:
            return obs if out is None else out.copy_(obs)
        if self._norm_cache is None:
            # float32 (shift, scale) computed once per rollout, not once per step
            inv_std = (self.obs_rms.var + 1e-8).rsqrt()
            self._norm_cache = ((-self.obs_rms.mean * inv_std).float(), inv_std.float())
        shift, scale = self._norm_cache
        normed = torch.addcmul(shift, obs, scale, out=out)
        return normed.clamp_(-self.obs_rms.clip, self.obs_rms.clip)

    def _flat(self, obs: torch.Tensor) -> torch.Tensor:
        return obs.reshape(obs.shape[0], -1)

    def value(self, obs_norm: torch.Tensor) -> torch.Tensor:
        """V of normalised observations, ``[B]``."""
        return self.critic(self._flat(obs_norm)).squeeze(-1)

    def _sample(self, obs_norm: torch.Tensor, std: torch.Tensor,
                into: torch.Tensor | None = None) -> torch.Tensor:
        """A raw action: a Gaussian sample in the normalised box, or a class index
        (written into ``into`` when given)."""
        out = self.actor(self._flat(obs_norm))
        if self._discrete:
            probs = torch.softmax(out, -1)
            action = torch.multinomial(probs, 1, generator=self.generator).squeeze(-1)
            return action if into is None else into.copy_(action)
        noise = torch.randn(out.shape, generator=self.generator, device=out.device)
        return torch.addcmul(out, noise, std, out=into)

    def _logp_entropy(
        self, obs_norm: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probability and entropy of stored actions under the current policy."""
        out = self.actor(self._flat(obs_norm))
        if self._discrete:
            logp_all = torch.log_softmax(out, -1)
            entropy = -(logp_all.exp() * logp_all).sum(-1)
            return logp_all.gather(-1, action.long()[:, None]).squeeze(-1), entropy
        z = (action - out) / self.log_std.exp()
        logp = (-0.5 * z.square() - self.log_std - 0.5 * LOG_2PI).sum(-1)
        entropy = (0.5 + 0.5 * LOG_2PI + self.log_std).sum().expand(out.shape[0])
        return logp, entropy

    def _to_env(self, action: torch.Tensor) -> torch.Tensor:
        """Map a raw action to the env's action space (clip and rescale a Gaussian sample)."""
        if self._discrete:
            return action
        flat = torch.addcmul(self._act_center, action.clamp(-1.0, 1.0), self._act_half)
        return flat.reshape(-1, *self._action_shape)

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        """Env actions for ``obs`` (the mean / most likely action when ``deterministic``)."""
        obs_norm = self._norm(obs)
        if not deterministic:
            return self._to_env(self._sample(obs_norm, self.log_std.exp()))
        out = self.actor(self._flat(obs_norm))
        return out.argmax(-1) if self._discrete else self._to_env(out)

    # --------------------------------- one iteration: collect, advantages, update

    @torch.no_grad()
    def explore(self, env: VecEnv, steps: int) -> Rollout:
        """1. Collect ``steps`` transitions per copy into preallocated device storage; episode
        returns and the normaliser update are done once after the loop (observations are
        normalised with the statistics frozen at the rollout's start)."""
        if self._env is not env:  # a new env starts afresh, reset with a seed from our RNG
            seed = int(torch.randint(2**31 - 1, (1,), generator=self.generator,
                                     device=self.device).item())
            self._obs, _ = env.reset(seed=seed)
            self._env, self._ep_return = env, torch.zeros(env.num_envs, device=self.device)
        keep_raw = self.config.norm_obs
        buf = self._rollout
        if buf is None or not buf.fits(steps, env.num_envs, self._obs_shape, keep_raw):
            buf = self._rollout = Rollout(
                steps, env.num_envs, self._obs_shape, self._raw_shape,
                torch.long if self._discrete else torch.float32, self.device, keep_raw)
        buf.bootstrap.zero_()
        obs, std = self._obs, self.log_std.exp()
        for t, (obs_row, raw_row, action_row, reward_row, done_row) in enumerate(buf.rows):
            if raw_row is not None:
                raw_row.copy_(obs)
            action = self._sample(self._norm(obs, out=obs_row), std, into=action_row)
            obs, reward, terminated, truncated, info = env.step(self._to_env(action))
            reward_row.copy_(reward)
            torch.logical_or(terminated, truncated, out=done_row)
            if bool(truncated.any()):
                # a time limit is no termination: the cut-off tail is worth gamma * V(final)
                final_value = self.value(self._norm(info["final_obs"]))
                buf.bootstrap[t] = self.config.gamma * final_value * (truncated & ~terminated)
        self._obs = obs
        buf.next_obs.copy_(self._norm(obs))
        total, count, self._ep_return = finished_returns(buf.rewards, buf.dones, self._ep_return)
        episodes = float(count)
        self._episodes = {"rollout/episode_return": float(total) / episodes} if count > 0 else {}
        self._episodes["rollout/episodes"] = episodes
        if buf.raw_obs is not None:
            self.obs_rms.update(buf.raw_obs)
            self._norm_cache = None
        self.env_steps += steps * env.num_envs
        return buf

    def update(self, batch: Rollout) -> dict[str, float]:
        """2. GAE advantages of one rollout, then 3. the PPO epochs over it; returns
        namespaced means of the losses."""
        cfg = self.config
        b_obs = batch.obs.reshape(-1, *self._obs_shape)
        b_actions = batch.actions.reshape(-1, *self._raw_shape)
        with torch.no_grad():
            # 2. advantages (values in one batch: the networks have not changed since the rollout)
            b_val = batch.values.view(-1).copy_(self.value(b_obs))
            b_logp = batch.logprobs.view(-1).copy_(self._logp_entropy(b_obs, b_actions)[0])
            advantages = gae(batch.learning_rewards(cfg.reward_scale), batch.values,
                             batch.dones, self.value(batch.next_obs), cfg.gamma, cfg.gae_lambda)
            b_adv, b_ret = advantages.reshape(-1), (advantages + batch.values).reshape(-1)
            if self._hterm is not None:
                raw = batch.raw_obs if batch.raw_obs is not None else batch.obs
                self._hterm.add(raw.reshape(-1, *self._obs_shape), b_actions, b_ret)
        # 3. update epochs: clipped surrogate, value loss and entropy bonus per minibatch
        size = b_obs.shape[0]
        mb_size = size // cfg.num_minibatches
        sums = torch.zeros(5, device=self.device)
        hterm_sum = torch.zeros((), device=self.device)
        for _ in range(cfg.update_epochs):
            order = torch.randperm(size, generator=self.generator, device=self.device)
            for start in range(0, mb_size * cfg.num_minibatches, mb_size):
                idx = order[start:start + mb_size]
                logp, entropy = self._logp_entropy(b_obs[idx], b_actions[idx])
                log_ratio = logp - b_logp[idx]
                ratio = log_ratio.exp()
                adv = b_adv[idx]
                if cfg.norm_adv:
                    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                pg_loss = torch.max(-adv * ratio,
                                    -adv * ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef)).mean()
                v_loss = 0.5 * (self.value(b_obs[idx]) - b_ret[idx]).square().mean()
                ent = entropy.mean()
                loss = pg_loss - cfg.ent_coef * ent + cfg.vf_coef * v_loss
                if self._hterm is not None and len(self._hterm) > 0:
                    h_loss = self._hterm_loss(mb_size)
                    loss = loss + cfg.hterm_weight * h_loss
                    hterm_sum += h_loss.detach()
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(self.optimizer.param_groups[0]["params"],
                                         cfg.max_grad_norm)
                self.optimizer.step()
                with torch.no_grad():
                    approx_kl = ((ratio - 1) - log_ratio).mean()
                    clipfrac = ((ratio - 1).abs() > cfg.clip_coef).float().mean()
                    sums += torch.stack([pg_loss, v_loss, ent, approx_kl, clipfrac]).detach()
        self.iterations += 1
        means = (sums / (cfg.update_epochs * cfg.num_minibatches)).tolist()
        explained = 1.0 - float((b_ret - b_val).var() / (b_ret.var() + 1e-8))
        metrics = {"losses/policy": means[0], "losses/value": means[1],
                   "losses/entropy": means[2], "losses/approx_kl": means[3],
                   "losses/clipfrac": means[4], "losses/explained_variance": explained}
        if self._hterm is not None:
            metrics["losses/hterm"] = float(hterm_sum) / (cfg.update_epochs
                                                          * cfg.num_minibatches)
        return metrics

    def _hterm_loss(self, n: int) -> torch.Tensor:
        """The H-term (unweighted) on ``n`` transitions drawn from the memory."""
        assert self._hterm is not None
        obs, actions, r_norm = self._hterm.sample(n, self.generator)
        logp, _ = self._logp_entropy(self._norm(obs), actions)
        return hterm_loss(logp, r_norm, action_dims(self._raw_shape))

    def train_iteration(self, env: VecEnv) -> dict[str, float]:
        """One rollout of ``config.rollout_steps`` per copy, then its advantages and epochs."""
        batch = self.explore(env, self.config.rollout_steps)
        return {**self.update(batch), **self._episodes}

    # ------------------------------------------------------------------ state

    def _live_tensors(self) -> dict[str, torch.Tensor]:
        parts: Parts = {"actor": self.actor, "actor.log_std": self.log_std,
                        "critic": self.critic, "obs_rms": self.obs_rms}
        return live_tensors(parts, [self.optimizer])

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Networks, Adam state, obs statistics, counters, the RNG state and the H-term's
        memory once it holds rows (the layout of ``agents/state.py``)."""
        state = save_state(self._live_tensors(), {"rng": self.generator},
                           {"counters.env_steps": self.env_steps,
                            "counters.iterations": self.iterations})
        if self._hterm is not None and len(self._hterm) > 0:
            state.update(self._hterm.state_dict())
        return state

    def data_layout(self) -> dict[str, torch.Tensor]:
        """The H-term's memory rows a state adds (zero rows here), if the H-term is on."""
        if self._hterm is None:
            return {}
        return {k: v[:0] for k, v in self._hterm.state_dict().items()}

    def load_state_dict(self, state: Mapping[str, torch.Tensor], keep_data: bool = False
                        ) -> None:
        """Restore ``state_dict`` output exactly; ``ConfigError`` names a bad tensor.

        Without ``rng`` the generator keeps the stream seeded at build (a child of a
        checkpoint explores on its own seed). The only data PPO keeps across iterations is
        the H-term's memory (``hterm.*``, with ``hterm`` on): restored from ``state``
        unless ``keep_data``; a checkpoint without it leaves the memory empty."""
        counters = load_state(state, self._live_tensors(), {"rng": self.generator},
                              ("counters.env_steps", "counters.iterations"),
                              data=(HTermMemory.PREFIX,))
        if self._hterm is not None and not keep_data:
            self._hterm.load_state_dict(state)
        self.env_steps = counters["counters.env_steps"]
        self.iterations = counters["counters.iterations"]
        self._norm_cache = None


def build(obs_space: gymnasium.spaces.Space[Any], action_space: gymnasium.spaces.Space[Any],
          config: Any, device: torch.device, seed: int) -> PPOAgent:
    """The ``AgentFactory`` of PPO."""
    if not isinstance(config, PPOConfig):
        raise ConfigError("config", f"expected PPOConfig, got {type(config).__name__}")
    return PPOAgent(obs_space, action_space, config, device, seed)


SPEC = AlgorithmSpec("ppo", PPOConfig, build, discrete=True, continuous=True)
