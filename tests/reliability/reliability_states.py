"""Real agent states and checkpoints for reliability tests (no training)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from agents.build import build_agent
from agents.registry import default_registry
from broker.core.schemas import Checkpoint, new_id
from envs.registry import make_env


def ppo_state(env: str, hparams: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """A fresh PPO agent's state for ``env`` with ``hparams``."""
    vec = make_env(env, int(hparams["num_envs"]), "cpu")
    try:
        agent = build_agent(default_registry(), "ppo", dict(hparams), vec,
                            torch.device("cpu"), 0)
    finally:
        vec.close()
    return agent.state_dict()


def ppo_checkpoint(experiment: str, env: str, hparams: Mapping[str, Any], *,
                   score: float, state: dict[str, torch.Tensor] | None = None,
                   **changes: Any) -> Checkpoint:
    """A valid PPO checkpoint of ``experiment`` (a fresh state unless given), the result
    of a round of its own (``issue_for`` records it as issued, for the updater)."""
    round_id = new_id()
    fields: dict[str, Any] = {
        "experiment": experiment, "id": round_id, "init_id": round_id, "pod": "pod-t",
        "algorithm": "ppo",
        "env": env, "hparams": dict(hparams), "score_mean": score, "score_std": 1.0,
        "env_steps": 64, "wall_time": 1.0,
        "state": state if state is not None else ppo_state(env, hparams)}
    return Checkpoint(**{**fields, **changes})
