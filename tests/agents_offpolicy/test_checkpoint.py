"""Exact resumption, checkpoint validation and construction checks of the off-policy agents."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import pytest
import torch

from agents import ddpg, dqn, sac, td3
from agents.base import AlgorithmSpec, SearchDim
from broker.core.codec import pack, unpack
from broker.core.errors import ConfigError
from envs.base import VecEnv
from envs.registry import make_env

pytestmark = pytest.mark.timeout(60)

ENV_OF = {"sac": "torch/Pendulum-v1", "td3": "torch/Pendulum-v1",
          "ddpg": "torch/Pendulum-v1", "dqn": "torch/CartPole-v1"}
SPECS = [sac.SPEC, td3.SPEC, ddpg.SPEC, dqn.SPEC]
# tiny and quick: updates start on the first iteration and several updates run per step
SMALL = dict(num_envs=4, batch_size=8, learning_starts=8, hidden_size=16, updates_per_iter=3,
             steps_per_iter=2, buffer_size=64)


def _make(spec: AlgorithmSpec, seed: int = 0, **overrides: Any) -> tuple[Any, Callable[[], VecEnv]]:
    config = spec.config_cls(**{**SMALL, **overrides})

    def env() -> VecEnv:
        return make_env(ENV_OF[spec.name], config.num_envs)

    probe = env()
    agent = spec.build(probe.single_observation_space, probe.single_action_space, config,
                       torch.device("cpu"), seed)
    return agent, env


def _params(agent: Any) -> dict[str, torch.Tensor]:
    state = agent.state_dict()
    return {k: v for k, v in state.items() if not k.startswith("replay.")}


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_resume_is_bit_identical(spec: AlgorithmSpec) -> None:
    torch.manual_seed(0)
    agent, env = _make(spec, checkpoint_replay=True)
    first = env()
    for _ in range(2):
        agent.train_iteration(first)
    saved = agent.state_dict()
    assert agent.updates > 0 and any(".exp_avg" in k for k in saved)  # optimizers stepped

    # the original continues on a fresh env; a restored twin does the same on its own env
    continued = env()
    for _ in range(2):
        agent.train_iteration(continued)
    twin, _ = _make(spec, seed=123, checkpoint_replay=True)  # everything must come from `saved`
    twin.load_state_dict(saved)
    restored_env = env()
    for _ in range(2):
        twin.train_iteration(restored_env)

    want, got = _params(agent), _params(twin)
    assert want.keys() == got.keys()
    for key in want:
        assert torch.equal(want[key], got[key]), key
    assert twin.env_steps == agent.env_steps and twin.updates == agent.updates
    assert torch.equal(agent.buffer.obs, twin.buffer.obs)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_state_dict_is_a_snapshot_and_loading_never_aliases(spec: AlgorithmSpec) -> None:
    agent, env = _make(spec)
    e = env()
    agent.train_iteration(e)
    saved = agent.state_dict()
    frozen = {k: v.clone() for k, v in saved.items()}
    other, _ = _make(spec, seed=5)
    other.load_state_dict(saved)
    agent.train_iteration(e)
    other.train_iteration(env())
    for key, value in saved.items():
        assert torch.equal(value, frozen[key]), key
    assert all(isinstance(v, torch.Tensor) for v in saved.values())


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_checkpoint_without_replay_is_small_and_restores_an_empty_buffer(
        spec: AlgorithmSpec) -> None:
    agent, env = _make(spec)
    agent.train_iteration(env())
    state = agent.state_dict()
    assert not any(k.startswith("replay.") for k in state)
    other, _ = _make(spec, seed=1)
    other.buffer.add(agent.buffer.obs[:4], agent.buffer.action[:4], agent.buffer.reward[:4],
                     agent.buffer.next_obs[:4], agent.buffer.done[:4].bool())
    other.load_state_dict(state)
    assert len(other.buffer) == 0
    assert other.env_steps == agent.env_steps


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_shape_mismatch_names_the_tensor(spec: AlgorithmSpec) -> None:
    small, env = _make(spec)
    small.train_iteration(env())
    wide, _ = _make(spec, hidden_size=32)
    with pytest.raises(ConfigError) as caught:
        wide.load_state_dict(small.state_dict())
    assert "state." in str(caught.value) and "shape" in str(caught.value)
    key = caught.value.field.removeprefix("state.")
    assert key in small.state_dict()


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_missing_tensor_is_a_config_error(spec: AlgorithmSpec) -> None:
    agent, _ = _make(spec)
    state = agent.state_dict()
    dropped = sorted(state)[0]
    del state[dropped]
    with pytest.raises(ConfigError, match="missing"):
        agent.load_state_dict(state)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_build_leaves_the_global_rng_alone_and_is_seeded(spec: AlgorithmSpec) -> None:
    torch.manual_seed(42)
    before = torch.get_rng_state()
    a, _ = _make(spec, seed=3)
    assert torch.equal(torch.get_rng_state(), before)
    b, _ = _make(spec, seed=3)
    c, _ = _make(spec, seed=4)
    sa, sb, sc = _params(a), _params(b), _params(c)
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)


@pytest.mark.parametrize("spec", [sac.SPEC, td3.SPEC, ddpg.SPEC], ids=lambda s: s.name)
def test_continuous_agents_reject_discrete_actions(spec: AlgorithmSpec) -> None:
    cartpole = make_env("torch/CartPole-v1", 2)
    with pytest.raises(ConfigError, match="algorithm"):
        spec.build(cartpole.single_observation_space, cartpole.single_action_space,
                   spec.config_cls(), torch.device("cpu"), 0)


def test_dqn_rejects_continuous_actions() -> None:
    pendulum = make_env("torch/Pendulum-v1", 2)
    with pytest.raises(ConfigError, match="algorithm"):
        dqn.DQNAgent(pendulum.single_observation_space, pendulum.single_action_space,
                     dqn.DQNConfig(), torch.device("cpu"), 0)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_bad_config_names_the_field(spec: AlgorithmSpec) -> None:
    with pytest.raises(ConfigError, match="batch_size"):
        spec.config_cls(batch_size=0)
    with pytest.raises(ConfigError, match="gamma"):
        spec.config_cls(gamma=1.5)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_search_space_names_real_fields_and_defaults_lie_inside(spec: AlgorithmSpec) -> None:
    config = spec.config_cls()
    fields = {f.name for f in dataclasses.fields(config)}
    space: Mapping[str, SearchDim] = spec.config_cls.SEARCH_SPACE  # type: ignore[attr-defined]
    for name, dim in space.items():
        assert name in fields, name
        assert dim.low <= getattr(config, name) <= dim.high, name


def test_mutated_learning_rate_survives_loading_the_moments() -> None:
    """The generator mutates hparams and ships the parent's state: the new lr must win."""
    parent, env = _make(sac.SPEC)
    parent.train_iteration(env())
    child, _ = _make(sac.SPEC, actor_lr=0.0123)
    child.load_state_dict(parent.state_dict())
    assert child.actor_opt.param_groups[0]["lr"] == 0.0123
    moments = [child.actor_opt.state[p]["exp_avg"] for p in child.actor.parameters()]
    want = [parent.actor_opt.state[p]["exp_avg"] for p in parent.actor.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(moments, want, strict=True))


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_state_survives_the_wire_codec(spec: AlgorithmSpec) -> None:
    """Checkpoints cross the broker as msgpack: every tensor (RNG bytes, 0-d counters,
    Adam step counts) must come back exact."""
    agent, env = _make(spec, checkpoint_replay=True)
    agent.train_iteration(env())
    state = agent.state_dict()
    back = unpack(pack(state))
    other, _ = _make(spec, seed=9, checkpoint_replay=True)
    other.load_state_dict(back)
    restored = other.state_dict()
    assert all(torch.equal(restored[k], state[k]) for k in state)
