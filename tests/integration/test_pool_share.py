"""Each checkpoint records how much of its training data came from the experience pool.

An embedded tournament (PPO and SAC pods in one process, sharing the node's pool) is run
through the Python API twice: with the pool, a SAC checkpoint records a share in (0, 1]
(it learned from PPO's rollouts) and PPO's record 0 (on-policy: it learns from its own
rollouts only); with ``experience_pool = false`` every checkpoint records 0.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.core.settings import default_experiment, settings_from_env
from leaderboard.store import Entry, LeaderboardStore
from podracer.train import train


def _run(out: Path, pool: bool) -> list[Entry]:
    # two rounds a pod: SAC's first already learns from PPO's rollouts when it can
    exp = default_experiment("torch/Pendulum-v1", name=f"poolshare-{pool}".lower(),
                             algos={"ppo": 1, "sac": 1}, pods=2, eval_episodes=4,
                             total_budget={"seconds": 8.0}, round_budget={"seconds": 4.0},
                             experience_pool=pool)
    result = train(settings_from_env(experiment=exp, store=out, torch_threads=1), out,
                   progress=False)
    assert result.exit_code == 0, result
    with LeaderboardStore(out, create=False) as store:
        return store.entries()


@pytest.mark.timeout(180)
def test_a_checkpoint_records_its_share_of_pool_data_and_zero_without_the_pool(
        tmp_path: Path) -> None:
    shared = _run(tmp_path / "pool", True)
    sac = [e for e in shared if e.algorithm == "sac"]
    ppo = [e for e in shared if e.algorithm == "ppo"]
    assert sac and ppo, [(e.algorithm, e.id) for e in shared]
    assert any(0.0 < e.pool_share <= 1.0 for e in sac), [(e.pool_rows, e.env_steps)
                                                          for e in sac]
    assert all(e.pool_rows == 0 for e in ppo)
    alone = _run(tmp_path / "nopool", False)
    # a SAC checkpoint among them: PPO records 0 with or without the pool
    assert any(e.algorithm == "sac" for e in alone), [(e.algorithm, e.id) for e in alone]
    assert all(e.pool_rows == 0 and e.pool_share == 0.0 for e in alone)
