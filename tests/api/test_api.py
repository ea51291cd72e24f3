"""The Python API: ``podracer.train`` (also inside a running event loop), ``dir(podracer)``,
``Policy.predict`` on NumPy and torch, one observation or a batch, and the notebook
example executed as CI executes it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import podracer
from agents.build import build_agent, resolve_config
from agents.registry import default_registry
from broker.core.errors import ConfigError
from envs.registry import make_env
from leaderboard.answer import answer_of
from leaderboard.export import Policy, PolicyMember
from leaderboard.store import LeaderboardStore

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "examples" / "quickstart.ipynb"


def _policy(env_name: str, members: int = 1) -> Policy:
    registry = default_registry()
    hparams = {"num_envs": 2, "rollout_steps": 8, "hidden_size": 8}
    env = make_env(env_name, resolve_config(registry, "ppo", hparams).num_envs)
    try:
        agents = [build_agent(registry, "ppo", hparams, env, torch.device("cpu"), seed)
                  for seed in range(members)]
        return Policy(env_name, [PolicyMember(f"m{i}", "ppo", hparams, 0.0)
                                 for i in range(members)], agents, env.single_action_space,
                      torch.device("cpu"), env.single_observation_space)
    finally:
        env.close()


def test_dir_shows_the_api() -> None:
    names = dir(podracer)
    assert {"train", "load_policy", "export", "Policy", "TrainingResult"} <= set(names)
    assert "TYPE_CHECKING" not in names and "annotations" not in names
    assert callable(podracer.train) and podracer.Policy is Policy


def test_importing_the_cli_keeps_the_api_function() -> None:
    import podracer.train as _submodule  # noqa: F401  (what the CLI imports)

    assert callable(podracer.train) and podracer.train.__module__ == "podracer"


@pytest.mark.parametrize("env_name", ["torch/Pendulum-v1", "torch/CartPole-v1"])
def test_predict_keeps_the_kind_and_shape(env_name: str) -> None:
    policy = _policy(env_name, members=2)
    obs_dim = 3 if "Pendulum" in env_name else 4
    batch = np.random.default_rng(0).normal(size=(5, obs_dim)).astype(np.float32)
    expected = policy(torch.from_numpy(batch)).numpy()
    act_shape = (1,) if "Pendulum" in env_name else ()

    from_numpy = policy.predict(batch)
    assert isinstance(from_numpy, np.ndarray) and from_numpy.shape == (5, *act_shape)
    assert np.array_equal(from_numpy, expected)
    one = policy.predict(batch[2])
    assert isinstance(one, np.ndarray) and one.shape == act_shape
    # one observation runs a batch of one: BLAS may round its last bit differently
    # (measured on an AVX-512 Xeon: 0.01076389 both, array_equal False)
    np.testing.assert_allclose(one, expected[2], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(policy.predict(batch[2].astype(np.float64).tolist()),
                               expected[2], rtol=1e-5, atol=1e-6)

    from_torch = policy.predict(torch.from_numpy(batch))
    assert isinstance(from_torch, torch.Tensor) and from_torch.shape == (5, *act_shape)
    one_torch = policy.predict(torch.from_numpy(batch[2]))
    assert isinstance(one_torch, torch.Tensor) and one_torch.shape == act_shape
    np.testing.assert_allclose(one_torch.numpy(), expected[2], rtol=1e-5, atol=1e-6)


def test_predict_names_a_wrong_shape() -> None:
    with pytest.raises(ConfigError, match=r"obs: shape \(2, 5\) is neither one observation"):
        _policy("torch/Pendulum-v1").predict(np.zeros((2, 5)))


def test_a_broken_setup_raises_before_anything_is_written(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"algos\.sac"):
        podracer.train(env="torch/CartPole-v1", algos="sac", budget="2s")
    with pytest.raises(ConfigError, match="--env"):
        podracer.train(env="torch/Pendulum-v9", budget="2s")
    assert list(tmp_path.iterdir()) == []


def test_the_api_asks_for_reproducible_mode_as_the_cli_does(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    from podracer.api import build_experiment

    exp = build_experiment("torch/Pendulum-v1", "ppo", "4k", None, round_budget="1k",
                           reproducible=True)
    assert exp.reproducible and exp.pods == 1
    assert not build_experiment("torch/Pendulum-v1", "ppo", "4k", None).reproducible
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="round_budget"):  # wall seconds cannot repeat
        podracer.train(env="torch/Pendulum-v1", algos="ppo", budget="4k",
                       round_budget="2s", reproducible=True)
    assert list(tmp_path.iterdir()) == []


def test_train_inside_a_running_event_loop(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    taken = tmp_path / "runs" / "pendulum-v1"  # a run there already: the API picks -2
    taken.mkdir(parents=True)
    (taken / "run.json").write_text(json.dumps({"sessions": []}))

    async def notebook_cell() -> podracer.TrainingResult:
        return podracer.train(env="torch/Pendulum-v1", algos="ppo", budget="3s", pods=1,
                              round_budget="1s")

    result = asyncio.run(notebook_cell())
    assert result.out == Path("runs") / "pendulum-v1-2"
    assert result.leaderboard and result.leaderboard[0].algorithm == "ppo"
    with LeaderboardStore(result.out, create=False) as store:
        chosen = answer_of(store)  # the best checkpoint, or an ensemble measured better
    assert chosen is not None and result.best_score == chosen.score_mean
    assert [m.id for m in result.policy.members] == list(chosen.members)
    assert chosen.members[0] == result.leaderboard[0].id
    scores = [e.score_mean for e in result.leaderboard]
    assert scores == sorted(scores, reverse=True)
    assert result.policy.predict(np.zeros(3, dtype=np.float32)).shape == (1,)


@pytest.mark.timeout(180)
def test_the_notebook_example_runs(tmp_path: Path) -> None:
    import nbclient
    import nbformat

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=150, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outputs = "".join(o.get("text", "") for cell in notebook.cells
                      for o in cell.get("outputs", []))
    assert "best score" in outputs and "action for one observation" in outputs
    assert (tmp_path / "pendulum.onnx").is_file()
