"""DQN's Double and Dueling variants build, act, and learn from a batch."""

from __future__ import annotations

import pytest
import torch

from agents.dqn import DQNAgent, DQNConfig, QNetwork
from envs.registry import make_env

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("double", [False, True])
@pytest.mark.parametrize("dueling", [False, True])
def test_variant_updates_its_network(double: bool, dueling: bool) -> None:
    config = DQNConfig(num_envs=8, batch_size=16, learning_starts=16, hidden_size=32,
                       double=double, dueling=dueling, target_update_interval=2)
    env = make_env("torch/CartPole-v1", config.num_envs)
    agent = DQNAgent(env.single_observation_space, env.single_action_space, config,
                     torch.device("cpu"), 0)
    assert isinstance(agent.q, QNetwork) and agent.q.dueling == dueling
    agent.explore(env, 4)
    before = {k: v.clone() for k, v in agent.q.state_dict().items()}
    metrics = agent.update(agent.buffer.sample(16, torch.Generator().manual_seed(0)))
    assert set(metrics) >= {"losses/td", "losses/q_mean"}
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
    assert any(not torch.equal(before[k], v) for k, v in agent.q.state_dict().items())
    actions = agent.act(torch.zeros(5, 4))
    assert actions.shape == (5,) and actions.dtype == torch.int64
    assert set(actions.tolist()) <= {0, 1}


def test_double_and_vanilla_targets_differ() -> None:
    """Same weights and batch: Double DQN's target uses the online argmax, so losses differ."""
    env = make_env("torch/CartPole-v1", 8)
    agents = []
    for double in (False, True):
        config = DQNConfig(num_envs=8, learning_starts=0, hidden_size=32, double=double)
        agent = DQNAgent(env.single_observation_space, env.single_action_space, config,
                         torch.device("cpu"), 0)
        agents.append(agent)
    agents[0].explore(env, 8)
    batch = agents[0].buffer.sample(64, torch.Generator().manual_seed(1))
    with torch.no_grad():  # make online and target nets disagree
        for p in agents[0].q_target.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(2)) * 0.5)
    agents[1].q_target.load_state_dict(agents[0].q_target.state_dict())
    losses = [a.update(batch)["losses/td"] for a in agents]
    assert losses[0] != losses[1]


def test_dueling_head_is_mean_centered() -> None:
    net = QNetwork(4, 3, 16, 2, dueling=True)
    obs = torch.randn(10, 4)
    q = net(obs)
    features = net.trunk(obs)
    assert torch.allclose(q.mean(dim=-1, keepdim=True), net.value(features), atol=1e-6)


def test_epsilon_schedule_decays_linearly_to_the_floor() -> None:
    env = make_env("torch/CartPole-v1", 10)
    config = DQNConfig(num_envs=10, epsilon_start=1.0, epsilon_end=0.1, epsilon_decay_steps=100)
    agent = DQNAgent(env.single_observation_space, env.single_action_space, config,
                     torch.device("cpu"), 0)
    assert agent.epsilon() == pytest.approx(1.0)
    agent.explore(env, 5)  # 50 env steps
    assert agent.epsilon() == pytest.approx(0.55)
    agent.explore(env, 10)
    assert agent.epsilon() == pytest.approx(0.1)
