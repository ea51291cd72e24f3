"""The node's experience pool: ring, readers, writers in two processes, what rows hold."""

from __future__ import annotations

import multiprocessing

import gymnasium
import numpy as np
import pytest
import torch

from agents.pod.pool import SCORE_SLOTS, ExperiencePool, PoolReader, node_pool, row_bytes
from agents.pod.pool_link import PoolLink, RecordingEnv, to_agent_scale, warm_limit
from agents.ppo import PPOAgent, PPOConfig
from agents.sac import SACAgent, SACConfig
from broker.core.errors import ConfigError
from tests.agents_ppo.ppo_stub_envs import ScriptedEnv

OBS = gymnasium.spaces.Box(-np.inf, np.inf, (3,), np.float32)
ACT = gymnasium.spaces.Box(-2.0, 2.0, (1,), np.float32)


def _pool(rows: int) -> ExperiencePool:
    return ExperiencePool("stub", OBS, ACT, rows * row_bytes((3,), 1))


def _write(pool: ExperiencePool, first: int, n: int, writer: int, off_policy: bool = False
           ) -> None:
    """Rows whose reward is their global index ``first..first+n-1``."""
    values = torch.arange(first, first + n, dtype=torch.float32)
    obs = values[:, None].repeat(1, 3)
    pool.write(obs, values[:, None] / 1000, values, obs + 1, values % 2 == 0, writer,
               off_policy)


def test_capacity_follows_the_byte_budget_and_rejects_a_budget_too_small() -> None:
    assert _pool(10).capacity == 10
    with pytest.raises(ConfigError, match="pool_mib"):
        ExperiencePool("stub", OBS, ACT, 3)


def test_a_new_pool_is_zeroed_shared_memory_of_its_shapes() -> None:
    pool = _pool(4)
    columns = {"obs": (pool.obs, (4, 3), torch.float32),
               "next_obs": (pool.next_obs, (4, 3), torch.float32),
               "action": (pool.action, (4, 1), torch.float32),
               "reward": (pool.reward, (4,), torch.float32),
               "terminated": (pool.terminated, (4,), torch.bool),
               "writer": (pool.writer, (4,), torch.int32),
               "off_policy": (pool.off_policy, (4,), torch.bool)}
    for name, (column, shape, dtype) in columns.items():
        assert column.is_shared(), name
        assert (tuple(column.shape), column.dtype) == (shape, dtype), name
        assert column.tolist() == torch.zeros(shape, dtype=dtype).tolist() or name == "writer"
    assert pool.writer.tolist() == [-1] * 4  # no writer yet
    assert pool.scores.is_shared() and bool(pool.scores.isnan().all())  # no score yet
    assert pool.nbytes == 4 * row_bytes((3,), 1) + SCORE_SLOTS * 4


def test_a_node_that_cannot_build_the_env_trains_without_a_pool() -> None:
    def missing(name: str, copies: int) -> ScriptedEnv:
        raise ConfigError("path", "prices.csv is not a file")

    assert node_pool("stock/prices.csv", True, 1, missing) is None
    assert node_pool("stub", False, 1, lambda name, copies: ScriptedEnv(copies)) is None
    built = node_pool("stub", True, 1, lambda name, copies: ScriptedEnv(copies))
    assert built is not None and built.capacity == 2**20 // row_bytes((3,), 1)


def test_a_full_pool_overwrites_its_oldest_rows_across_the_wrap() -> None:
    pool = _pool(5)
    _write(pool, 0, 3, writer=1)
    _write(pool, 3, 4, writer=1)  # wraps: rows 0 and 1 are overwritten
    assert len(pool) == 5 and pool.written == 7
    newest = pool.newest(10)
    assert newest.reward.tolist() == [2, 3, 4, 5, 6]
    assert torch.equal(newest.next_obs[:, 0], newest.reward + 1)
    assert newest.terminated.tolist() == [True, False, True, False, True]
    _write(pool, 7, 12, writer=1)  # a batch over the capacity keeps its newest rows
    assert pool.newest(5).reward.tolist() == [14, 15, 16, 17, 18]


def test_a_warm_start_takes_off_policy_rows_first_then_the_newest_of_the_rest() -> None:
    pool = _pool(10)
    _write(pool, 0, 4, writer=1, off_policy=True)  # a SAC member's rows, older
    _write(pool, 4, 6, writer=2)  # a PPO member's, newer
    assert pool.newest(5).reward.tolist() == [5, 6, 7, 8, 9]
    first = pool.newest(5, off_policy_first=True)
    assert first.reward.tolist() == [0, 1, 2, 3, 9]  # oldest first, as ``newest``
    assert first.off_policy.tolist() == [True] * 4 + [False]
    assert pool.newest(3, off_policy_first=True).reward.tolist() == [1, 2, 3]
    assert len(pool.newest(0, off_policy_first=True)) == 0
    _write(pool, 10, 2, writer=2)  # the ring overwrote two of SAC's rows
    assert pool.newest(3, off_policy_first=True).reward.tolist() == [2, 3, 11]


def test_a_reader_sees_only_others_rows_since_its_cursor_and_counts_what_it_skipped() -> None:
    pool = _pool(8)
    _write(pool, 0, 2, writer=2)  # before the reader existed: not its business
    reader = PoolReader(pool, writer=1)
    _write(pool, 2, 3, writer=2)
    _write(pool, 5, 2, writer=1)  # its own rows are never read back
    assert reader.take(100).reward.tolist() == [2, 3, 4]
    assert reader.take(100).reward.tolist() == []
    _write(pool, 7, 4, writer=3)
    assert reader.take(3).reward.tolist() == [8, 9, 10]  # the newest within the limit
    assert reader.skipped == 1
    _write(pool, 11, 20, writer=2)  # 20 rows into a ring of 8: 12 lost before reading
    assert reader.take(100).reward.tolist() == list(range(23, 31))
    assert reader.skipped == 1 + 12 and reader.read == 3 + 3 + 8


def test_a_reader_of_off_policy_rows_only_passes_over_the_on_policy_ones() -> None:
    pool = _pool(16)
    reader = PoolReader(pool, writer=1, off_policy_only=True)
    _write(pool, 0, 3, writer=2)  # PPO's
    _write(pool, 3, 2, writer=3, off_policy=True)  # TD3's
    _write(pool, 5, 2, writer=2)
    assert reader.take(100).reward.tolist() == [3, 4]
    assert reader.take(100).reward.tolist() == []  # passed over, not kept for later
    _write(pool, 7, 3, writer=3, off_policy=True)
    assert reader.take(2).reward.tolist() == [8, 9] and reader.skipped == 1


def test_a_reader_near_only_takes_rows_of_writers_scoring_near_its_own_or_above() -> None:
    pool = _pool(32)
    reader = PoolReader(pool, writer=1, near_only=True)
    _write(pool, 0, 2, writer=2)
    assert reader.take(100).reward.tolist() == [0, 1]  # no score of its own: takes all
    pool.set_score(1, 1000.0)
    pool.set_score(2, 905.0)  # within 10 % below: near
    pool.set_score(3, 899.0)  # further below
    pool.set_score(4, 2000.0)  # above
    _write(pool, 2, 2, writer=2)
    _write(pool, 4, 2, writer=3)
    _write(pool, 6, 2, writer=4)
    _write(pool, 8, 2, writer=5)  # no score (a fresh lineage's): passed over
    assert reader.take(100).reward.tolist() == [2, 3, 6, 7]
    assert reader.refused == 4 and reader.skipped == 0
    pool.set_score(1, -200.0)  # negative scores: near is 10 % of its size below
    pool.set_score(2, -219.0)
    pool.set_score(3, -221.0)
    _write(pool, 10, 1, writer=2)
    _write(pool, 11, 1, writer=3)
    assert reader.take(100).reward.tolist() == [10] and reader.refused == 5


def test_a_lock_held_by_a_dead_writer_drops_the_step_instead_of_stalling(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("agents.pod.pool.LOCK_TIMEOUT_S", 0.05)
    pool = _pool(8)
    _write(pool, 0, 2, writer=2)
    reader = PoolReader(pool, writer=1)
    _write(pool, 2, 2, writer=2)
    pool._lock.acquire()  # as if a process died in the middle of a write
    _write(pool, 4, 2, writer=2)
    assert len(reader.take(10)) == 0 and len(pool.newest(10)) == 0
    assert pool.lock_timeouts == 3 and pool.written == 4
    pool._lock.release()
    assert reader.take(10).reward.tolist() == [2, 3]  # the cursor did not move meanwhile


def _writer_process(pool: ExperiencePool, writer: int, batches: int) -> None:
    for _ in range(batches):
        values = torch.full((4,), float(writer))
        pool.write(values[:, None].repeat(1, 3), values[:, None], values,
                   values[:, None].repeat(1, 3), values > 0, writer, writer == 2)


def test_two_processes_write_one_pool_without_losing_or_tearing_rows() -> None:
    pool = _pool(1000)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer_process, args=(pool, w, 50)) for w in (1, 2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    assert pool.written == 400
    rows = pool.newest(400)
    # every row is whole: its obs, action and reward all name the same writer
    assert torch.equal(rows.obs[:, 0], rows.reward) and torch.equal(rows.action[:, 0],
                                                                       rows.reward)
    assert torch.equal(rows.writer.float(), rows.reward)
    assert sorted(rows.writer.tolist()) == [1] * 200 + [2] * 200


def test_ppo_rollouts_feed_the_pool_with_final_obs_and_terminations_apart() -> None:
    env = ScriptedEnv(4)
    pool = ExperiencePool("stub", env.single_observation_space, env.single_action_space,
                      10_000 * row_bytes((3,), 1))
    recording = RecordingEnv(env, pool, writer=pool.new_writer())
    agent = PPOAgent(recording.single_observation_space, recording.single_action_space,
                     PPOConfig(num_envs=4, rollout_steps=6), torch.device("cpu"), seed=0)
    agent.train_iteration(recording)  # type: ignore[arg-type]
    rows = pool.newest(1000)
    assert len(rows) == 24
    copy, episode, t = rows.obs.T
    next_copy, next_episode, next_t = rows.next_obs.T
    # the successor is the same episode's next step, also on the step that ended it
    assert torch.equal(next_copy, copy) and torch.equal(next_episode, episode)
    assert torch.equal(next_t, t + 1)
    ended = torch.tensor([int(n) == ScriptedEnv.length(int(i), int(k))
                          for i, k, n in zip(copy, episode, next_t, strict=True)])
    assert bool(ended.any())
    assert torch.equal(rows.terminated, ended & (copy % 2 == 0))  # odd copies truncate
    assert torch.equal(rows.action, torch.cat(env.actions).reshape(-1, 1))  # as applied


def _linked_sac(others: int, own_share: float, off_policy_others: int = 0,
                warm_from: str = "off-policy", learn: bool = True, intake: str = "all",
                score: float | None = None
                ) -> tuple[ExperiencePool, SACAgent, RecordingEnv, PoolLink]:
    """A fresh SAC member (buffer of 500) linked to a pool where other writers already
    wrote ``off_policy_others`` rows of off-policy learners, then ``others`` rows of an
    on-policy one (rewards count them from 0)."""
    pool = _pool(1000)
    _write(pool, 0, off_policy_others, writer=8, off_policy=True)
    _write(pool, off_policy_others, others, writer=9)
    config = SACConfig(num_envs=4, buffer_size=500, learning_starts=8, batch_size=8)
    agent = SACAgent(OBS, ACT, config, torch.device("cpu"), seed=0)
    env = ScriptedEnv(4)
    env.single_action_space = ACT
    recording = RecordingEnv(env, pool, writer=pool.new_writer())
    return pool, agent, recording, PoolLink(pool, agent, [recording], own_share, warm_from,
                                            learn, intake, score)


def test_an_off_policy_member_starts_from_the_pool_and_keeps_its_own_share() -> None:
    pool, agent, recording, link = _linked_sac(300, own_share=0.25)
    assert link.warm_rows == 300 and len(agent.buffer) == 300  # not from nothing
    _write(pool, 300, 100, writer=9)
    agent.train_iteration(recording)  # type: ignore[arg-type]
    metrics = link.sync()
    # 4 own rows, own share 0.25: at most 12 of the others' 100 new rows, the newest
    assert len(agent.buffer) == 300 + 4 + 12
    assert metrics["pool/ingested"] == 312 and metrics["pool/skipped"] == 88
    # actions stored in the agent's scale: env action a in [-2, 2] -> a / 2
    assert torch.allclose(agent.buffer.action[304:316, 0], torch.arange(388, 400) / 2000)


def test_a_round_that_does_not_learn_from_the_pool_still_writes_to_it_tagged() -> None:
    pool, agent, recording, link = _linked_sac(300, own_share=0.25, learn=False)
    assert link.warm_rows == 0 and len(agent.buffer) == 0  # no warm start either
    _write(pool, 300, 100, writer=9)
    agent.train_iteration(recording)  # type: ignore[arg-type]
    metrics = link.sync()
    assert len(agent.buffer) == 4 and link.pool_rows == 0  # its own 4 rows only
    assert metrics["pool/ingested"] == 0 and metrics["pool/share_of_data"] == 0.0
    newest = pool.newest(4)
    assert len(newest) == 4 and bool(newest.off_policy.all())  # written, as off-policy


@pytest.mark.parametrize(("intake", "taken"),
                         [("all", 12), ("off-policy", 5), ("near", 5), ("none", 0)])
def test_a_member_takes_the_others_rows_its_intake_names(intake: str, taken: int) -> None:
    pool, agent, recording, link = _linked_sac(300, own_share=0.25, intake=intake,
                                               score=500.0)
    assert link.warm_rows == 300  # every intake starts an empty buffer from the pool
    assert pool.score(recording.writer) == 500.0  # its rows carry its parent's score
    pool.set_score(9, 100.0)  # the on-policy member scores far below it
    pool.set_score(8, 480.0)  # the off-policy one near it
    _write(pool, 300, 95, writer=9)  # an on-policy member's rows
    _write(pool, 395, 5, writer=8, off_policy=True)  # an off-policy member's
    agent.train_iteration(recording)  # type: ignore[arg-type]
    metrics = link.sync()
    assert len(agent.buffer) == 300 + 4 + taken and metrics["pool/ingested"] == 300 + taken
    assert metrics["pool/refused"] == {"all": 0, "off-policy": 95, "near": 95, "none": 0}[intake]
    if intake in ("off-policy", "near"):
        assert agent.buffer.reward[304:309].tolist() == [395, 396, 397, 398, 399]
    with pytest.raises(ConfigError, match="pool_intake"):
        _linked_sac(10, own_share=0.75, intake="some")


def test_actions_map_to_each_consumer_scale() -> None:
    agent = SACAgent(OBS, ACT, SACConfig(num_envs=1), torch.device("cpu"), seed=0)
    scaled = to_agent_scale(agent, torch.tensor([[-2.0], [0.0], [2.0], [3.0]]))
    assert scaled is not None and scaled[:, 0].tolist() == [-1.0, 0.0, 1.0, 1.0]


def test_a_fresh_member_starts_from_at_most_the_others_share_of_its_buffer() -> None:
    _, agent, _, link = _linked_sac(600, own_share=0.75)
    # a quarter of 500 rows, the newest: room for three times as many of its own
    assert warm_limit(500, 0.75) == 125
    assert link.warm_rows == 125 and len(agent.buffer) == 125
    assert torch.allclose(agent.buffer.action[:125, 0], torch.arange(475, 600) / 2000)


def test_a_fresh_member_starts_from_off_policy_rows_first_and_its_rows_say_off_policy() -> None:
    pool, agent, recording, link = _linked_sac(600, own_share=0.75, off_policy_others=200)
    # 125 rows: the newest of the 200 SAC rows, although PPO's 600 rows are newer
    assert link.warm_rows == 125
    assert torch.allclose(agent.buffer.action[:125, 0], torch.arange(75, 200) / 2000)
    agent.train_iteration(recording)  # type: ignore[arg-type]
    assert bool(pool.newest(4).off_policy.all())  # what a SAC member writes is tagged
    _, agent, _, link = _linked_sac(600, own_share=0.75, off_policy_others=200,
                                    warm_from="newest")
    assert torch.allclose(agent.buffer.action[:125, 0], torch.arange(675, 800) / 2000)
    with pytest.raises(ConfigError, match="pool_warm_from"):
        _linked_sac(10, own_share=0.75, warm_from="oldest")


def test_what_a_ppo_member_writes_is_tagged_on_policy() -> None:
    env = ScriptedEnv(4)
    pool = ExperiencePool("stub", env.single_observation_space, env.single_action_space,
                          1000 * row_bytes((3,), 1))
    recording = RecordingEnv(env, pool, writer=pool.new_writer())
    recording.off_policy = True  # as if a SAC round had used these envs before
    agent = PPOAgent(recording.single_observation_space, recording.single_action_space,
                     PPOConfig(num_envs=4, rollout_steps=6), torch.device("cpu"), seed=0)
    PoolLink(pool, agent, [recording])
    agent.train_iteration(recording)  # type: ignore[arg-type]
    rows = pool.newest(1000)
    assert len(rows) == 24 and not bool(rows.off_policy.any())
