"""The tournament benchmark's plan and tables (no run: synthetic results)."""

from __future__ import annotations

import argparse

from benchmarks.tournament import TASKS, build_plan
from benchmarks.tournament_report import report
from benchmarks.tournament_runs import RunResult


def _args(**flags: object) -> argparse.Namespace:
    defaults = {"tasks": None, "methods": None, "seeds": 3, "task_seeds": None,
                "plan": None, "quick": False}
    return argparse.Namespace(**{**defaults, **flags})


def test_the_minimum_plan_runs_the_ablation_beside_the_tournament() -> None:
    plan = build_plan(_args(plan="minimum"))
    for task in ("halfcheetah", "hopper"):
        assert plan[task]["tournament"] == plan[task]["tournament-nopool"] == 3
        assert plan[task]["sac"] == 3
    assert plan["pendulum"]["sb3-ppo"] == 3


def test_the_report_prints_pool_shares_the_ablation_note_and_the_sb3_ratio() -> None:
    results = [
        RunResult("pendulum", "tournament", 0, time_to_target=6.0, confirm=-150.0,
                  wall=8.0, pool_share={"ppo": 0.0, "sac": 0.25}),
        RunResult("pendulum", "tournament-nopool", 0, time_to_target=9.0, confirm=-160.0,
                  wall=10.0, pool_share={"ppo": 0.0}),
        RunResult("pendulum", "ppo", 0, time_to_target=7.5, confirm=-170.0),
        RunResult("pendulum", "sb3-ppo", 0, time_to_target=12.0, confirm=-180.0),
    ]
    text = report([TASKS["pendulum"]], {"pendulum": 60.0}, results)
    assert "pool share of training data, tournament s0: ppo 0.00, sac 0.25" in text
    assert "pool share of training data, tournament-nopool s0: ppo 0.00" in text
    assert "does not exist yet" not in text  # POOL_OFF switches the pool off
    row = next(line for line in text.splitlines() if line.startswith("tournament "))
    # 6 s against the best lone 7.5 s and against SB3's 12 s in the same run
    assert "0.80" in row.split() and "0.50" in row.split()
