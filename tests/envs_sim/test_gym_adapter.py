"""The Gymnasium adapter on classic-control envs (no MuJoCo needed): contract and errors."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
import torch

from broker.core.errors import ConfigError
from envs.base import AutoresetMode, VecEnv
from envs.gym_adapter import GymVecEnv, make

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("vectorization", ["sync", "threads"])
def test_cartpole_matches_plain_gymnasium(vectorization: str) -> None:
    env = make("CartPole-v1", 3, vectorization=vectorization, obs_dtype=None, max_episode_steps=15)
    refs = [gymnasium.make("CartPole-v1", max_episode_steps=15) for _ in range(3)]
    obs, _ = env.reset(seed=11)
    expected = np.stack([ref.reset(seed=11 + i)[0] for i, ref in enumerate(refs)])
    assert np.array_equal(obs.numpy(), expected)
    rng = np.random.default_rng(0)
    ends = 0
    for _ in range(40):
        action = rng.integers(0, 2, size=3)
        obs, reward, terminated, truncated, info = env.step(torch.from_numpy(action))
        for i, ref in enumerate(refs):
            ref_obs, ref_rew, ref_term, ref_trunc, _ = ref.step(int(action[i]))
            assert np.array_equal(info["final_obs"][i].numpy(), ref_obs)
            assert (reward[i].item(), bool(terminated[i]), bool(truncated[i])) == (
                ref_rew, ref_term, ref_trunc)
            if ref_term or ref_trunc:
                ends += 1
                ref_obs, _ = ref.reset()
            assert np.array_equal(obs[i].numpy(), ref_obs)
    assert ends > 0
    env.close()


def test_contract_types_and_final_obs_rows() -> None:
    env = make("Pendulum-v1", 4, max_episode_steps=3)
    assert isinstance(env, VecEnv)
    assert env.autoreset_mode is AutoresetMode.SAME_STEP
    assert env.single_observation_space.dtype == np.float32
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4, 3) and obs.dtype == torch.float32
    action = torch.zeros(4, 1)
    for step in range(3):
        obs, reward, terminated, truncated, info = env.step(action)
        assert reward.dtype == torch.float32 and reward.shape == (4,)
        assert terminated.dtype == torch.bool and truncated.dtype == torch.bool
        assert not terminated.any()
        assert bool(truncated.all()) is (step == 2)
    # rows that ended hold the last obs, not the fresh one of the next episode
    assert not torch.equal(info["final_obs"], obs)
    obs2, *_, info2 = env.step(action)
    assert torch.equal(info2["final_obs"], obs2)
    env.close()
    env.close()


def test_obs_tensors_do_not_alias_env_buffers() -> None:
    env = make("CartPole-v1", 2, obs_dtype=None)
    first, _ = env.reset(seed=0)
    kept = first.clone()
    env.step(torch.ones(2, dtype=torch.int64))
    assert torch.equal(first, kept)
    env.close()


def test_unknown_id_lists_close_matches() -> None:
    with pytest.raises(ConfigError, match="CartPole-v1") as err:
        make("CartPol-v1", 2)
    assert err.value.field == "gym_id"


def test_bad_arguments_raise_config_error() -> None:
    with pytest.raises(ConfigError, match="num_envs"):
        make("CartPole-v1", 0)
    with pytest.raises(ConfigError, match="vectorization"):
        make("CartPole-v1", 2, vectorization="gpu")
    with pytest.raises(ConfigError, match="kwargs"):
        make("CartPole-v1", 2, no_such_argument=1)
    env = make("CartPole-v1", 2)
    with pytest.raises(ConfigError, match="action"):
        env.step(torch.zeros(3, dtype=torch.int64))
    env.close()


def test_wrapping_a_next_step_vector_env_is_refused() -> None:
    vector_env = gymnasium.vector.SyncVectorEnv([lambda: gymnasium.make("CartPole-v1")])
    with pytest.raises(ConfigError, match="SAME_STEP"):
        GymVecEnv(vector_env)
    vector_env.close()


def test_registry_builds_gym_names_through_this_adapter() -> None:
    from envs.registry import make_env

    env = make_env("gym/CartPole-v1", 2)
    assert isinstance(env, GymVecEnv) and env.num_envs == 2
    obs, _ = env.reset(seed=0)
    assert obs.shape == (2, 4)
    env.close()
