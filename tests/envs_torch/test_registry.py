"""make_env / EnvRegistry: names, prefixes, lazy adapters and the errors users see."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
import torch

from broker.core.errors import ConfigError, EnvUnavailable
from envs.base import VecEnv
from envs.registry import EnvRegistry, available_envs, default_env_registry, lazy_adapter, make_env
from envs.torch_envs import TORCH_ENVS, TorchCartPole


@pytest.mark.parametrize("gym_id", sorted(TORCH_ENVS))
def test_make_env_builds_each_torch_env(gym_id: str) -> None:
    env = make_env(f"torch/{gym_id}", 8, torch.device("cpu"), seed=0)
    assert isinstance(env, TORCH_ENVS[gym_id])
    assert isinstance(env, VecEnv)
    assert env.num_envs == 8
    obs, _ = env.reset(seed=0)
    assert obs.shape[0] == 8


def test_available_envs_lists_names_and_prefixes() -> None:
    names = available_envs()
    for gym_id in TORCH_ENVS:
        assert f"torch/{gym_id}" in names
    assert {"gym/<gymnasium id>", "isaacgym/<Task>", "stock/<csv path>"} <= set(names)


@pytest.mark.parametrize("name", ["torch/Nope-v0", "nope/Pendulum-v1", "Pendulum-v1"])
def test_unknown_name_lists_what_exists(name: str) -> None:
    with pytest.raises(ConfigError, match="torch/Pendulum-v1") as excinfo:
        make_env(name, 4)
    assert excinfo.value.field == "env name"


def test_prefix_without_target_is_rejected() -> None:
    with pytest.raises(ConfigError, match="gym/<gymnasium id>"):
        make_env("gym/", 4)


@pytest.mark.parametrize("num_envs", [0, -3, 2.5, True])
def test_bad_num_envs(num_envs: Any) -> None:
    with pytest.raises(ConfigError) as excinfo:
        make_env("torch/Pendulum-v1", num_envs)
    assert excinfo.value.field == "num_envs"


def test_bad_kwargs_name_the_accepted_ones() -> None:
    with pytest.raises(ConfigError, match="'g'") as excinfo:
        make_env("torch/Pendulum-v1", 4, gravity=9.81)
    assert "gravity" in str(excinfo.value)


def test_kwargs_reach_the_env() -> None:
    env = make_env("torch/CartPole-v1", 2, sutton_barto_reward=True)
    assert isinstance(env, TorchCartPole)
    assert env.sutton_barto_reward is True


def test_gym_prefix_delegates_lazily(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Any, ...]] = []
    fake = types.ModuleType("envs.gym_adapter")

    def make(gym_id: str, num_envs: int, device: torch.device, *, render: bool = False) -> Any:
        calls.append((gym_id, num_envs, device, render))
        return "built"

    fake.make = make  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "envs.gym_adapter", fake)
    assert make_env("gym/HalfCheetah-v5", 3, "cpu", render=True) == "built"
    assert calls == [("HalfCheetah-v5", 3, torch.device("cpu"), True)]
    with pytest.raises(ConfigError, match="render"):
        make_env("gym/HalfCheetah-v5", 3, colour="red")


def test_stock_prefix_keeps_the_whole_path(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("envs.stock")
    fake.make = lambda path, num_envs, device: (path, num_envs)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "envs.stock", fake)
    assert make_env("stock/data/dow/30.csv", 2) == ("data/dow/30.csv", 2)


def test_missing_adapter_module_is_a_fault_of_the_node() -> None:
    registry = EnvRegistry()
    registry.register("sim/", lazy_adapter("envs.no_such_adapter", "pip install nothing"))
    with pytest.raises(EnvUnavailable, match="pip install nothing"):  # not of the name
        registry.make("sim/Thing", 1)


def test_register_exact_name_and_override() -> None:
    registry = default_env_registry()

    def mine(num_envs: int, device: torch.device) -> Any:
        return ("mine", num_envs, device)

    registry.register("torch/Pendulum-v1", mine)
    assert registry.make("torch/Pendulum-v1", 2) == ("mine", 2, torch.device("cpu"))
    assert isinstance(
        make_env("torch/Pendulum-v1", 2), TORCH_ENVS["Pendulum-v1"]
    )  # default untouched
    with pytest.raises(ConfigError, match="prefix_or_name"):
        registry.register("", mine)
