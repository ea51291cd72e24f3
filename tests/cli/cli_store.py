"""A small leaderboard store of real PPO checkpoints on torch Pendulum, for the CLI tests."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from agents.base import Agent
from agents.build import build_agent, resolve_config
from agents.registry import default_registry
from broker.core.schemas import Checkpoint
from envs.registry import make_env
from leaderboard.store import LeaderboardStore

ENV = "torch/Pendulum-v1"
HPARAMS: dict[str, Any] = {"num_envs": 8, "rollout_steps": 16, "hidden_size": 16,
                           "num_minibatches": 2, "update_epochs": 1}


@dataclasses.dataclass(frozen=True)
class Row:
    """One checkpoint to store: id, score, parent, generation, seed, lr."""

    id: str
    score: float
    parent: str | None
    generation: int
    seed: int
    lr: float = 3e-3
    pool: int = 0
    """Rows taken from the experience pool, per env step (3: a 75% share)."""


# ranking by score: d1, b1, a1, c1 (ids of a1 and c1 share the prefix "a1f")
ROWS = (
    Row("a1f0000000000000", -200.0, None, 0, 1),
    Row("b1f0000000000000", -150.0, "a1f0000000000000", 1, 2, lr=1e-3),
    Row("a1f1000000000000", -300.0, None, 0, 3),
    Row("d1f0000000000000", -100.0, "b1f0000000000000", 2, 4, lr=1e-3, pool=3),
)


def make_agent(seed: int, lr: float = 3e-3, state: dict[str, torch.Tensor] | None = None
               ) -> Agent:
    """A PPO agent on torch Pendulum (trained one iteration when ``state`` is None)."""
    registry = default_registry()
    hparams = {**HPARAMS, "lr": lr}
    env = make_env(ENV, resolve_config(registry, "ppo", hparams).num_envs, "cpu")
    try:
        agent = build_agent(registry, "ppo", hparams, env, torch.device("cpu"), seed, state)
        if state is None:
            agent.train_iteration(env)  # real weights, moments and normaliser statistics
    finally:
        env.close()
    return agent


def build_store(root: Path) -> dict[str, dict[str, torch.Tensor]]:
    """Fill a store at ``root`` with ``ROWS``; return each id's state."""
    states: dict[str, dict[str, torch.Tensor]] = {}
    with LeaderboardStore(root) as store:
        for i, row in enumerate(ROWS):
            agent = make_agent(row.seed, row.lr)
            states[row.id] = agent.state_dict()
            store.insert(Checkpoint(
                id=row.id, experiment="clitest", init_id=f"init-{row.id}", pod=f"pod-{i % 2}",
                algorithm="ppo", env=ENV, hparams={**HPARAMS, "lr": row.lr},
                state=states[row.id], score_mean=row.score, score_std=10.0 + i,
                env_steps=agent.env_steps, wall_time=1.0, parent_id=row.parent,
                generation=row.generation, created=1000.0 + i,
                pool_rows=row.pool * agent.env_steps))
    return states


def module_store(factory: pytest.TempPathFactory, name: str = "store") -> Path:
    """A module's store of ``ROWS`` (``build_store``), in a fresh directory of
    ``factory``, built with one torch thread."""
    torch.set_num_threads(1)
    root = factory.mktemp(name)
    build_store(root)
    return root
