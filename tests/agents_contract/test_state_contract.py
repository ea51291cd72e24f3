"""The one checkpoint contract (agents/state.py) holds for all five algorithms: a freshly
built agent's state has exactly the names, shapes and dtypes of a trained one's, with
the optimizer state named by parameter. Whoever checks a checkpoint (the updater) can
then compare it with any agent built from the same hparams, without training or
re-exporting it."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from agents.base import Agent
from agents.build import build_agent
from agents.offpolicy import OffPolicyAgent
from agents.registry import default_registry
from broker.core.errors import ConfigError
from envs.registry import make_env

pytestmark = pytest.mark.timeout(60)

REGISTRY = default_registry()
ENV_OF = {"ppo": "torch/Pendulum-v1", "sac": "torch/Pendulum-v1", "td3": "torch/Pendulum-v1",
          "ddpg": "torch/Pendulum-v1", "dqn": "torch/CartPole-v1"}
OFF_POLICY = dict(num_envs=4, batch_size=8, learning_starts=8, hidden_size=16,
                  updates_per_iter=2, steps_per_iter=2, buffer_size=64)
SMALL: dict[str, dict[str, Any]] = {
    "ppo": dict(num_envs=4, rollout_steps=8, hidden_size=16),
    **{name: OFF_POLICY for name in ("sac", "td3", "ddpg", "dqn")},
}
Layout = dict[str, tuple[tuple[int, ...], torch.dtype]]


def _agent(algorithm: str, seed: int = 0, **changes: Any) -> tuple[Agent, Any]:
    env = make_env(ENV_OF[algorithm], SMALL[algorithm]["num_envs"])
    agent = build_agent(REGISTRY, algorithm, {**SMALL[algorithm], **changes}, env,
                        torch.device("cpu"), seed)
    return agent, env


def _layout(state: dict[str, torch.Tensor]) -> Layout:
    return {k: (tuple(v.shape), v.dtype) for k, v in state.items()}


@pytest.mark.parametrize("algorithm", sorted(ENV_OF))
def test_fresh_and_trained_states_have_one_layout(algorithm: str) -> None:
    torch.set_num_threads(1)
    agent, env = _agent(algorithm)
    fresh = agent.state_dict()
    for _ in range(3):
        agent.train_iteration(env)
    trained = agent.state_dict()
    steps = [v for k, v in trained.items() if k.startswith("optim.") and k.endswith(".step")]
    assert steps and all(float(s) > 0 for s in steps), "the optimizer took no step"
    assert _layout(fresh) == _layout(trained)


@pytest.mark.parametrize("algorithm", sorted(ENV_OF))
def test_optimizer_state_is_named_by_parameter(algorithm: str) -> None:
    agent, _ = _agent(algorithm)
    state = agent.state_dict()
    slots = [k for k in state if k.startswith("optim.")]
    assert slots
    for key in slots:
        param, _, slot = key.removeprefix("optim.").rpartition(".")
        assert slot in ("step", "exp_avg", "exp_avg_sq"), key
        assert param in state, f"{key} names no parameter of the state"
        if slot != "step":
            assert state[key].shape == state[param].shape, key


@pytest.mark.parametrize("algorithm", sorted(ENV_OF))
def test_a_tensor_the_algorithm_does_not_know_is_refused(algorithm: str) -> None:
    agent, env = _agent(algorithm)
    agent.train_iteration(env)
    other, _ = _agent(algorithm, seed=1)
    state = {**agent.state_dict(), "optim.nothing.exp_avg": torch.zeros(3)}
    with pytest.raises(ConfigError, match="unexpected"):
        other.load_state_dict(state)


@pytest.mark.parametrize("algorithm", ["sac", "dqn"])
def test_replay_rows_appear_once_there_are_rows(algorithm: str) -> None:
    """Collected data is the contract's one variable part: absent while empty, so an
    empty agent's layout is still the layout of a checkpoint without rows."""
    agent, env = _agent(algorithm, checkpoint_replay=True)
    assert not any(k.startswith("replay.") for k in agent.state_dict())
    agent.train_iteration(env)
    state = agent.state_dict()
    assert state["replay.obs"].shape[0] == len(agent.buffer)  # type: ignore[attr-defined]
    empty, _ = _agent(algorithm, seed=1, checkpoint_replay=True)
    empty.load_state_dict(state)
    assert len(empty.buffer) == len(agent.buffer)  # type: ignore[attr-defined]


# ------------------------------------------------------------- add_transitions


def _rows(agent: OffPolicyAgent, n: int) -> tuple[torch.Tensor, ...]:
    buf = agent.buffer
    return (buf.obs[:n].clone(), buf.action[:n].clone(), buf.reward[:n].clone(),
            buf.next_obs[:n].clone(), buf.done[:n].bool())


@pytest.mark.parametrize("algorithm", ["sac", "dqn"])
def test_added_transitions_feed_the_updates(algorithm: str) -> None:
    torch.set_num_threads(1)
    source, env = _agent(algorithm)
    for _ in range(6):
        source.train_iteration(env)
    assert isinstance(source, OffPolicyAgent)
    rows = _rows(source, 40)

    learner, env = _agent(algorithm, seed=1, learning_starts=40)
    alone, _ = _agent(algorithm, seed=1, learning_starts=40)
    assert isinstance(learner, OffPolicyAgent)
    learner.add_transitions(*rows)
    assert len(learner.buffer) == 40 and learner.env_steps == 0
    assert torch.equal(learner.buffer.obs[:40], rows[0])
    assert torch.equal(learner.buffer.done[:40], rows[4].float())
    # 40 added + 8 explored reach learning_starts: updates begin now, not 5 iterations on
    assert any(k.startswith("losses/") for k in learner.train_iteration(env))
    assert not any(k.startswith("losses/") for k in alone.train_iteration(env))
    assert learner.env_steps == alone.env_steps == 8


def test_added_transitions_are_checked() -> None:
    agent, env = _agent("sac")
    agent.train_iteration(env)
    assert isinstance(agent, OffPolicyAgent)
    obs, action, reward, next_obs, terminated = _rows(agent, 4)
    with pytest.raises(ConfigError, match="action"):
        agent.add_transitions(obs, action[:, :0], reward, next_obs, terminated)
    with pytest.raises(ConfigError, match="next_obs"):
        agent.add_transitions(obs, action, reward, next_obs[:3], terminated)
    with pytest.raises(ConfigError, match="terminated"):
        agent.add_transitions(obs, action, reward, next_obs, terminated.float())
    before = len(agent.buffer)
    agent.add_transitions(obs.double(), action, reward, next_obs, terminated)  # cast
    assert len(agent.buffer) == before + 4
