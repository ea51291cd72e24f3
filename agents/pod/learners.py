"""Learner parallelism (Podracer paper, sec. 4.3): k learners fused by averaging.

Each of ``k`` learners is a full copy of the agent training on its own env copies
(its own ``VecEnv`` and seed). After every iteration their states are fused:

* every floating-point tensor but replay rows (network parameters, Adam
  ``exp_avg``/``exp_avg_sq`` and
  ``step``, normaliser statistics) is replaced by the mean over the learners;
* every other tensor (integer counters, RNG states) is *not* averaged. The fused state
  that leaves the group (``state_dict``) carries learner 0's; inside the group each
  learner keeps its own, so the learners' random streams stay distinct (copying one
  RNG state to all would make them sample identical actions from then on).

Averaging the optimizer moments alongside the weights is what keeps the fused Adam
consistent with the fused weights, as in the paper. Learners run one after another in
this process; with several devices, each learner's ``device`` is what parallelises.
``LearnerGroup`` satisfies ``agents.base.Agent``, so ``train_round`` runs it unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from agents.base import Agent, AlgorithmRegistry
from agents.build import Resolved, check_env
from broker.core.errors import ConfigError
from envs.base import VecEnv

log = logging.getLogger(__name__)


def _fused(name: str, tensor: torch.Tensor) -> bool:
    # replay rows (checkpoint_replay) and the H-term's memory are data, not parameters:
    # each learner keeps its own
    return tensor.is_floating_point() and not name.startswith(("replay.", "hterm."))


def fuse_states(states: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Average floating-point tensors over ``states``; take other tensors from ``states[0]``."""
    if not states:
        raise ConfigError("states", "nothing to fuse", "pass at least one state")
    fused: dict[str, torch.Tensor] = {}
    for name, first in states[0].items():
        if _fused(name, first):
            fused[name] = torch.stack([s[name].to(first.device) for s in states]).mean(0)
        else:
            fused[name] = first.clone()
    return fused


class LearnerGroup:
    """``k`` copies of one agent trained on ``k`` envs and fused after each iteration.

    Learner 0 trains on the ``env`` passed to ``train_iteration`` (the round's env);
    learner ``j >= 1`` on ``extra_envs[j - 1]``.
    """

    def __init__(self, learners: Sequence[Agent], extra_envs: Sequence[VecEnv]) -> None:
        if len(learners) != len(extra_envs) + 1:
            raise ConfigError("extra_envs", f"{len(learners)} learners need "
                              f"{len(learners) - 1} extra envs, got {len(extra_envs)}")
        self.learners = list(learners)
        self.extra_envs = list(extra_envs)
        self.config: Any = self.learners[0].config
        self.device: torch.device = self.learners[0].device

    @property
    def env_steps(self) -> int:
        """Env steps of all learners together."""
        return sum(learner.env_steps for learner in self.learners)

    @env_steps.setter
    def env_steps(self, value: int) -> None:
        # the Agent protocol declares a settable counter; keep the sum equal to ``value``
        self.learners[0].env_steps = value - sum(a.env_steps for a in self.learners[1:])

    def explore(self, env: VecEnv, steps: int) -> Any:
        """Collect with learner 0 (the group's policy after fusion is the same everywhere)."""
        return self.learners[0].explore(env, steps)

    def update(self, batch: Any) -> dict[str, float]:
        """Update learner 0 only; use ``train_iteration`` for the fused cycle."""
        return self.learners[0].update(batch)

    def train_iteration(self, env: VecEnv) -> dict[str, float]:
        """Every learner does one iteration on its env, then all are fused."""
        envs = [env, *self.extra_envs]
        per_learner = [learner.train_iteration(e) for learner, e in zip(self.learners, envs,
                                                                        strict=True)]
        self.fuse()
        keys = set.intersection(*(set(m) for m in per_learner))
        return {k: sum(m[k] for m in per_learner) / len(per_learner) for k in sorted(keys)}

    def fuse(self) -> None:
        """Replace every learner's floating-point state by the average (see module doc)."""
        states = [learner.state_dict() for learner in self.learners]
        fused = fuse_states(states)
        for learner, own in zip(self.learners, states, strict=True):
            # a data tensor only learner 0 has (its H-term memory holds rows, this
            # learner's none yet) is passed on as it is: keep_data leaves it unread
            learner.load_state_dict({k: (v if _fused(k, v) else own.get(k, v))
                                     for k, v in fused.items()}, keep_data=True)

    def act(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        """Learner 0's actions (all learners hold the fused weights)."""
        return self.learners[0].act(obs, deterministic)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The fused state: averaged floats, learner 0's counters and RNG."""
        return fuse_states([learner.state_dict() for learner in self.learners])

    def data_layout(self) -> dict[str, torch.Tensor]:
        """Learner 0's (all learners share one algorithm and config)."""
        return self.learners[0].data_layout()

    def load_state_dict(self, state: Mapping[str, torch.Tensor], keep_data: bool = False
                        ) -> None:
        """Load ``state`` into every learner."""
        for learner in self.learners:
            learner.load_state_dict(state, keep_data)


def build_learners(
    registry: AlgorithmRegistry,
    resolved: Resolved,
    envs: Sequence[VecEnv],
    device: torch.device,
    seed: int,
    state: Mapping[str, torch.Tensor] | None = None,
    *,
    own_rng: bool = False,
) -> Agent:
    """One agent of the ``resolved`` round per env in ``envs`` (learner ``j`` seeded
    ``seed + j``), all loaded with ``state`` (without its RNG states with ``own_rng``, see
    ``Resolved.build``); a plain agent when ``len(envs) == 1``, else a ``LearnerGroup``.
    ``registry`` only names the algorithms that fit when the env's actions do not.

    Pass ``envs[0]`` as the round's env to ``train_round``.
    """
    if not envs:
        raise ConfigError("learners", "need at least one env", "pass one VecEnv per learner")
    for env in envs:
        check_env(registry, resolved, env)
    learners = [resolved.build(env.single_observation_space, env.single_action_space, device,
                               seed + j, state, own_rng=own_rng) for j, env in enumerate(envs)]
    if len(learners) == 1:
        return learners[0]
    if state is None:
        # fresh learners start from learner 0's weights: averaging unrelated random
        # initialisations would wash out the init scale
        start = learners[0].state_dict()
        for j, learner in enumerate(learners[1:], 1):
            own = learner.state_dict()
            learner.load_state_dict({k: (v if v.is_floating_point() else own[k])
                                     for k, v in start.items()})
            log.debug("learner %d starts from learner 0's weights", j)
    return LearnerGroup(learners, envs[1:])
