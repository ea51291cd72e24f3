"""Size hyperparameters from broker messages are bounded before anything is allocated."""

from __future__ import annotations

import dataclasses
from typing import Any, cast

import gymnasium
import numpy as np
import pytest
import torch

from agents import ppo
from agents.base import AlgorithmSpec, HParams, config_from_hparams, config_to_hparams
from agents.build import resolve_config
from agents.checks import MAX_HIDDEN_WEIGHTS, MAX_ROLLOUT_SAMPLES, SIZE_LIMITS
from agents.registry import default_registry
from agents.replay import MAX_REPLAY_BYTES, ReplayBuffer
from broker.core.errors import ConfigError

REGISTRY = default_registry()
SPECS = [REGISTRY.get(name) for name in REGISTRY.names()]
CPU = torch.device("cpu")


def _size_fields(spec: AlgorithmSpec) -> list[str]:
    return [f.name for f in dataclasses.fields(spec.config_cls) if f.name in SIZE_LIMITS]


# (algorithm, field) for every size field every config has
SIZE_CASES = [(spec, name) for spec in SPECS for name in _size_fields(spec)]
CASE_IDS = [f"{spec.name}-{name}" for spec, name in SIZE_CASES]

# the values a hostile Initialization message might carry
HUGE = {"hidden_size": 50_000, "num_envs": 10**9, "buffer_size": 10**12,
        "rollout_steps": 10**9, "batch_size": 10**9, "steps_per_iter": 10**9,
        "hidden_layers": 10**6, "updates_per_iter": 10**9, "update_epochs": 10**9,
        "num_minibatches": 10**9}


def _raises_on(field: str, build: Any) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        build()
    assert caught.value.field == f"hparams.{field}", str(caught.value)
    return caught.value


def test_every_size_field_of_every_config_is_bounded() -> None:
    # a new size-like field must be added to SIZE_LIMITS (and HUGE) to be covered here
    fields = {name for spec in SPECS for name in _size_fields(spec)}
    assert fields == set(SIZE_LIMITS) == set(HUGE)
    for spec in SPECS:
        assert {"num_envs", "hidden_size", "hidden_layers"} <= set(_size_fields(spec))


@pytest.mark.parametrize(("spec", "field"), SIZE_CASES, ids=CASE_IDS)
def test_oversized_field_is_named(spec: AlgorithmSpec, field: str) -> None:
    low, high = SIZE_LIMITS[field]
    for value in (high + 1, HUGE[field], low - 1, -(10**12)):
        err = _raises_on(field, lambda value=value: config_from_hparams(
            spec.config_cls, {field: value}))
        assert str(err).startswith(f"hparams.{field}: must be in [{low}, {high}], got {value}")
        assert err.fix


@pytest.mark.parametrize(("spec", "field"), SIZE_CASES, ids=CASE_IDS)
def test_updater_resolve_config_rejects_oversized_field(spec: AlgorithmSpec, field: str) -> None:
    _raises_on(field, lambda: resolve_config(REGISTRY, spec.name, {field: HUGE[field]}))
    # a float that is an integer is coerced first, then bounded just the same
    _raises_on(field, lambda: resolve_config(REGISTRY, spec.name, {field: 1e15}))


@pytest.mark.parametrize(("spec", "field"), SIZE_CASES, ids=CASE_IDS)
def test_field_at_its_own_limits_is_accepted(spec: AlgorithmSpec, field: str) -> None:
    low, high = SIZE_LIMITS[field]
    defaults = spec.config_cls()
    for value in (low, high):
        hparams: dict[str, Any] = {field: value}
        if field == "num_minibatches":  # needs at least that many samples per rollout
            hparams["num_envs"] = max(defaults.num_envs, value)
        if spec.name == "ppo" and field == "num_envs":  # keep within MAX_ROLLOUT_SAMPLES
            hparams["rollout_steps"] = MAX_ROLLOUT_SAMPLES // high
        if spec.name == "ppo" and field == "rollout_steps":
            hparams["num_envs"] = MAX_ROLLOUT_SAMPLES // high
        if field == "hidden_layers":  # keep the whole network within MAX_HIDDEN_WEIGHTS
            hparams["hidden_size"] = 1024
        config = resolve_config(REGISTRY, spec.name, hparams)
        assert getattr(config, field) == value


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_defaults_lie_inside_the_bounds(spec: AlgorithmSpec) -> None:
    config = spec.config_cls()
    for name in _size_fields(spec):
        low, high = SIZE_LIMITS[name]
        assert low <= getattr(config, name) <= high, name
    # and survive the wire round trip the updater does
    assert resolve_config(REGISTRY, spec.name, config_to_hparams(config)) == config


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_search_space_extremes_build(spec: AlgorithmSpec) -> None:
    space = cast("type[HParams]", spec.config_cls).SEARCH_SPACE
    assert space
    for name, dim in space.items():
        if name in SIZE_LIMITS:
            low, high = SIZE_LIMITS[name]
            assert low <= dim.low and dim.high <= high, name
        for end in (dim.low, dim.high):
            config = resolve_config(REGISTRY, spec.name, {name: dim.clip(end)})
            assert getattr(config, name) == dim.clip(end)
    # every dim at its low end at once, then every dim at its high end
    for pick in (lambda d: d.clip(d.low), lambda d: d.clip(d.high)):
        hparams = {name: pick(dim) for name, dim in space.items()}
        config = resolve_config(REGISTRY, spec.name, hparams)
        assert {name: getattr(config, name) for name in space} == hparams


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_wide_and_deep_network_together_is_rejected(spec: AlgorithmSpec) -> None:
    # each within its own cap, together 4096**2 * 15 weights per network (1 GiB)
    err = _raises_on("hidden_size", lambda: resolve_config(
        REGISTRY, spec.name, {"hidden_size": 4096, "hidden_layers": 16}))
    assert str(MAX_HIDDEN_WEIGHTS) in err.problem
    config = resolve_config(REGISTRY, spec.name, {"hidden_size": 4096, "hidden_layers": 2})
    assert config.hidden_size == 4096


def test_ppo_rollout_size_is_capped_as_a_product() -> None:
    err = _raises_on("rollout_steps", lambda: ppo.PPOConfig(num_envs=2**20, rollout_steps=2**16))
    assert str(MAX_ROLLOUT_SAMPLES) in err.problem
    assert ppo.PPOConfig(num_envs=2**20, rollout_steps=4).rollout_steps == 4


@pytest.mark.parametrize("spec", [s for s in SPECS if s.name != "ppo"], ids=lambda s: s.name)
def test_off_policy_errors_name_hparams_fields(spec: AlgorithmSpec) -> None:
    _raises_on("batch_size", lambda: spec.config_cls(batch_size=0))
    _raises_on("gamma", lambda: spec.config_cls(gamma=1.5))
    _raises_on("learning_starts", lambda: spec.config_cls(learning_starts=-1))


def test_replay_buffer_memory_cap_names_buffer_size() -> None:
    # 50M transitions of 1000-dim observations: 373 GiB, refused before any allocation
    err = _raises_on("buffer_size", lambda: ReplayBuffer(50_000_000, (1000,), (6,), CPU))
    assert "GiB" in err.problem and "8.0 GiB" in err.problem
    row = 2 * 1000 * 4 + 6 * 4 + 2 * 4
    assert str(MAX_REPLAY_BYTES // row) in err.fix


def test_replay_buffer_cap_is_exact_and_counts_the_action_dtype() -> None:
    row = 2 * 3 * 4 + 1 * 8 + 2 * 4  # int64 action, as DQN stores it
    buffer = ReplayBuffer(10, (3,), (), CPU, action_dtype=torch.int64, max_bytes=10 * row)
    assert buffer.capacity == 10
    _raises_on("buffer_size", lambda: ReplayBuffer(11, (3,), (), CPU, action_dtype=torch.int64,
                                                   max_bytes=10 * row))
    _raises_on("buffer_size", lambda: ReplayBuffer(0, (3,), (1,), CPU))


def _spaces(spec: AlgorithmSpec) -> tuple[gymnasium.spaces.Space[Any], gymnasium.spaces.Space[Any]]:
    obs = gymnasium.spaces.Box(-1.0, 1.0, (1000,), dtype=np.float32)
    if spec.continuous:
        return obs, gymnasium.spaces.Box(-1.0, 1.0, (6,), dtype=np.float32)
    return obs, gymnasium.spaces.Discrete(4)


@pytest.mark.parametrize("spec", [s for s in SPECS if s.name != "ppo"], ids=lambda s: s.name)
def test_agent_with_replay_over_the_memory_cap_is_refused(spec: AlgorithmSpec) -> None:
    # in bounds as a number (<= 50M), but 50M rows of 1000-dim observations is ~373 GiB:
    # the agent build (which the updater's validator does) must refuse, not allocate
    config = resolve_config(REGISTRY, spec.name, {"buffer_size": 50_000_000,
                                                  "hidden_size": 8, "hidden_layers": 1})
    obs_space, act_space = _spaces(spec)
    _raises_on("buffer_size", lambda: spec.build(obs_space, act_space, config, CPU, 0))
