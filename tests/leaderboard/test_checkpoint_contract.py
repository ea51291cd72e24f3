"""The updater checks tensor names, shapes and dtypes from the experiment's recorded
spaces: no env is built (the simulator need not be installed) and no agent per message."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from agents.build import resolve
from agents.registry import default_registry
from broker.core.errors import ConfigError
from broker.core.schemas import Checkpoint
from broker.core.spaces import Spaces, SpaceSpec
from envs.spaces import gym_space
from leaderboard import updater
from leaderboard.updater import CheckpointValidator

pytestmark = pytest.mark.timeout(60)
ENV = "gym/NotInstalledSim-v9"  # no such env here: building it would fail
SPACES = Spaces(SpaceSpec("box", (5,), "float64"), SpaceSpec("box", (2,), "float32"))
SAC = {"num_envs": 4, "hidden_size": 8, "buffer_size": 64, "checkpoint_replay": True}


@pytest.fixture(autouse=True)
def no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the updater built an env")

    monkeypatch.setattr("envs.spaces.make_env", refuse)
    monkeypatch.setattr(updater, "make_env", refuse)


def _fresh_state(hparams: dict[str, Any]) -> dict[str, torch.Tensor]:
    resolved = resolve(default_registry(), "sac", hparams)
    agent = resolved.build(gym_space(SPACES.observation), gym_space(SPACES.action),
                           torch.device("cpu"), 7)
    return agent.state_dict()


def _checkpoint(state: dict[str, torch.Tensor]) -> Checkpoint:
    return Checkpoint(experiment="x", init_id="i1", pod="p", algorithm="sac", env=ENV,
                      hparams=dict(SAC), state=state, score_mean=0.0, score_std=0.0,
                      env_steps=0, wall_time=1.0)


def test_a_sound_state_passes_with_one_agent_built_per_config() -> None:
    validator = CheckpointValidator(default_registry(), ENV, SPACES)
    state = _fresh_state(SAC)
    rows = {"replay.obs": torch.zeros(10, 5), "replay.next_obs": torch.zeros(10, 5),
            "replay.action": torch.zeros(10, 2), "replay.reward": torch.zeros(10),
            "replay.done": torch.zeros(10), "replay.pos": torch.tensor(0)}
    for held in ({}, rows):
        validator.check(_checkpoint({**state, **held}))
    # a group of collected data comes whole or not at all
    partial = {k: v for k, v in rows.items() if k != "replay.done"}
    with pytest.raises(ConfigError, match=r"state\.replay\.done"):
        validator.check(_checkpoint({**state, **partial}))
    # a mutated child (search-space fields only) shares the spec
    child = dataclasses.replace(_checkpoint(state), hparams={**SAC, "actor_lr": 1e-4})
    validator.check(child)
    assert validator.ready().agents_built == 1


@pytest.mark.parametrize("damage", ["shape", "dtype", "missing", "extra", "rows", "nan"])
def test_wrong_names_shapes_and_dtypes_are_refused_without_an_env(damage: str) -> None:
    validator = CheckpointValidator(default_registry(), ENV, SPACES)
    state = _fresh_state(SAC)
    weight = next(k for k, v in state.items() if k.startswith("actor.") and v.dim() == 2)
    if damage == "shape":
        state[weight] = torch.zeros(3, 3)
    elif damage == "dtype":
        state[weight] = state[weight].double()
    elif damage == "missing":
        del state[weight]
    elif damage == "extra":
        state["garbage.0.x"] = torch.zeros(1)
    elif damage == "rows":  # more replay rows than buffer_size holds
        state["replay.obs"] = torch.zeros(65, 5)
    else:
        state[weight] = torch.full_like(state[weight], float("nan"))
    with pytest.raises(ConfigError) as info:
        validator.check(_checkpoint(state))
    assert info.value.field.startswith("state"), info.value
