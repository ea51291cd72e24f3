"""Reproducible mode (issue 23, item 7): one pod, step budgets and a seed give the same
leaderboard twice: same scores, env steps, hyperparameters and lineage shape (ids are
random). Without the mode, the updater's and the pod's evaluations draw unseeded
episodes, the population counts wall seconds, and a round may start before the stop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import podracer

EXPERIMENT = """
name = "{name}"
env = "torch/Pendulum-v1"
algos = {{ppo = 1, sac = 1}}
round_budget = {{steps = 1024}}
total_budget = {{env_steps = 5000}}
num_envs = {{ppo = 32, sac = 16}}
eval_episodes = 4
seed = 7
reproducible = true

[hparams.sac]
learning_starts = 128
batch_size = 64
hidden_size = 32
updates_per_iter = 1
"""


def _run(tmp_path: Path, name: str) -> list[tuple[Any, ...]]:
    path = tmp_path / f"{name}.toml"
    path.write_text(EXPERIMENT.format(name=name))
    result = podracer.train(experiment=path, out=tmp_path / name)
    by_id = {e.id: e for e in result.leaderboard}
    return [(e.algorithm, e.score_mean, e.score_std, e.env_steps, e.generation,
             sorted(e.hparams.items()),
             by_id[e.parent_id].score_mean if e.parent_id in by_id else None)
            for e in result.leaderboard]


@pytest.mark.timeout(400)
def test_two_reproducible_runs_give_the_same_leaderboard(tmp_path: Path) -> None:
    first = _run(tmp_path, "rep-a")
    second = _run(tmp_path, "rep-b")
    assert len(first) >= 4 and {row[0] for row in first} == {"ppo", "sac"}
    assert first == second
