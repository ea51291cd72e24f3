"""The benchmark's lone rows are the CLI's lone pod: ``podracer train`` with one pod of
one algorithm, one round for the budget, its hyperparameters pinned. Real torch
Pendulum, real PPO rounds, embedded mode."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from benchmarks.tournament_runs import Task, lone_pod, random_hparams, run_lone
from broker.core.settings import default_experiment

TASK = Task("pendulum", "torch/Pendulum-v1", target=None, budget=6.0)


def test_a_lone_pod_is_one_pod_of_one_algorithm_in_one_round_for_the_budget() -> None:
    exp = default_experiment(TASK.env, **lone_pod("sac", 300.0, {"batch_size": 128}))
    assert (exp.algos, exp.pods, exp.round_budget.seconds) == ({"sac": 1}, 1, 290.0)
    assert exp.overrides_for("sac")["batch_size"] == 128
    # a short budget keeps half of it for the round; no hparams: the tuned defaults
    short = default_experiment(TASK.env, **lone_pod("ppo", 12.0))
    assert (short.round_budget.seconds, short.hparams) == (6.0, {})


def test_a_drawn_lone_row_trains_its_draw_in_the_cli_pod(tmp_path: Path) -> None:
    result = run_lone(TASK, "ppo-random", "ppo", 0, TASK.budget, tmp_path / "run", draw=1)
    assert (result.method, result.seed, result.draw, result.algorithm) == \
        ("ppo-random", 0, 1, "ppo")
    assert result.checkpoints >= 1 and result.env_steps > 0 and result.score is not None
    with sqlite3.connect(tmp_path / "run" / "leaderboard.sqlite") as db:
        issued = db.execute("SELECT algorithm, hparams, budget_seconds FROM issued").fetchall()
    drawn = random_hparams("ppo", TASK, 0, 1)
    assert issued and all(algo == "ppo" and json.loads(hp) == drawn and budget == 3.0
                          for algo, hp, budget in issued)
