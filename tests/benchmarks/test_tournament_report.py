"""The tournament benchmark's plan and tables (no run: synthetic results)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import tournament
from benchmarks.tournament import TASKS, build_plan, execute, load_results, merge, save_results
from benchmarks.tournament_report import pool_line, report
from benchmarks.tournament_runs import RunResult, Task, kept_pod
from leaderboard.population import KEEPER, RETURN, STAND_IN
from leaderboard.store import LeaderboardStore
from tests.broker.transport_helpers import make_checkpoint
from tests.issued import issue_for


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
                  wall=8.0, algorithm="sac", pool_share={"ppo": 0.0, "sac": 0.25},
                  pool_share_best=0.4, pool_share_all=0.125),
        RunResult("pendulum", "tournament-nopool", 0, time_to_target=9.0, confirm=-160.0,
                  wall=10.0, algorithm="ppo", pool_share={"ppo": 0.0},
                  pool_share_best=0.0, pool_share_all=0.0),
        RunResult("pendulum", "ppo", 0, time_to_target=7.5, confirm=-170.0, env_steps=600_000,
                  wall=7.5),
        RunResult("pendulum", "sb3-ppo", 0, time_to_target=12.0, confirm=-180.0),
    ]
    text = report([TASKS["pendulum"]], {"pendulum": 60.0}, results)
    assert ("pool share of training data, tournament s0: best lineage (sac) 0.40, "
            "all members 0.12 (ppo 0.00, sac 0.25)") in text
    assert ("pool share of training data, tournament-nopool s0: best lineage (ppo) 0.00, "
            "all members 0.00 (ppo 0.00)") in text
    row = next(line for line in text.splitlines() if line.startswith("tournament "))
    # 6 s against the best lone 7.5 s and against SB3's 12 s in the same run
    assert "0.80" in row.split() and "0.50" in row.split()
    # the machine's speed, from the lone row only (8e4 env steps/s)
    assert ("env steps per second of the lone rows (this machine's speed): ppo 80,000"
            in text.splitlines())
    older = RunResult("pendulum", "tournament", 1)  # recorded before checkpoints had it
    assert pool_line("tournament", older).endswith(": not recorded")


def test_results_accumulate_across_invocations_and_first_seed_adds_a_seed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[tuple[str, str, int]] = []

    def fake_run(task: Task, method: str, seed: int, draw: int | None, budget: float,
                 retries: int) -> RunResult:
        ran.append((task.key, method, seed))
        return RunResult(task.key, method, seed, draw, budget=budget, score=100.0 + seed)

    monkeypatch.setattr(tournament, "OUT", tmp_path)
    monkeypatch.setattr(tournament, "run_with_retry", fake_run)
    path = tmp_path / "results.json"
    plan = {"hopper": {"tournament": 2, "sac": 2}}
    budgets = {"hopper": 300.0}
    first = execute(plan, budgets, 1, 0)
    assert len(load_results(path)) == len(first) == 4
    # a later invocation adds seed 2 only and keeps the first two
    plan3 = {"hopper": {"tournament": 3, "sac": 3}}
    runs = execute(plan3, budgets, 1, 0, first_seed=2, earlier=load_results(path))
    assert ran[4:] == [("hopper", "tournament", 2), ("hopper", "sac", 2)]
    stored = load_results(path)
    assert sorted((r.method, r.seed) for r in stored) == sorted(
        (m, s) for m in ("tournament", "sac") for s in range(3))
    assert len(runs) == 6
    text = report([TASKS["hopper"]], budgets, stored)
    assert any(line.startswith("sac ") and " 3 " in line for line in text.splitlines())
    # the same run again replaces the older one; another budget is kept apart
    again = merge(stored, [RunResult("hopper", "sac", 0, budget=300.0, score=1.0),
                           RunResult("hopper", "sac", 0, budget=20.0, score=2.0)])
    assert len(again) == 7
    assert [r.score for r in again if (r.method, r.seed, r.budget) == ("sac", 0, 300.0)] == [1.0]


def test_runs_recorded_without_a_budget_get_their_files_budget(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    save_results(path, {"hopper": 300.0}, {}, [RunResult("hopper", "sac", 0, score=5.0)])
    data: dict[str, Any] = json.loads(path.read_text())
    del data["runs"][0]["budget"]  # a file written before runs carried their budget
    data["runs"][0]["unknown_later_field"] = 1
    path.write_text(json.dumps(data))
    (run,) = load_results(path)
    assert run.budget == 300.0 and run.score == 5.0


def test_the_report_prints_the_training_behind_the_best_checkpoint_against_the_lone_pod(
) -> None:
    results = [
        RunResult("halfcheetah", "tournament", 0, score=4400.0, algorithm="sac",
                  best_steps=305_248, best_seconds=275.4),
        RunResult("halfcheetah", "sac", 0, score=5300.0, env_steps=347_136, wall=302.9),
        RunResult("halfcheetah", "sac", 1, score=5100.0, env_steps=353_000, wall=303.0),
        RunResult("halfcheetah", "td3", 0, score=5000.0, env_steps=900_000, wall=303.0),
    ]
    text = report([TASKS["halfcheetah"]], {"halfcheetah": 300.0}, results)
    # against the best lone row (sac: 5200 over td3's 5000), its mean env steps over both
    # seeds, not td3's many cheap steps
    assert ("training behind the best checkpoint, tournament s0: 305,248 env steps in "
            "275 s of rounds (0.87x the sac row's mean 350,068)") in text


def test_the_report_says_who_held_the_kept_pod_read_from_the_store(tmp_path: Path) -> None:
    rounds = [("a", "ppo", "first of its algorithm", 0.0, 20.0),
              ("b", "ppo", KEEPER, 133.0, 60.5), ("c", "ppo", KEEPER, 194.0, 60.7),
              ("d", "sac", RETURN, 255.0, 46.0), ("e", "sac", STAND_IN, 260.0, 20.0)]
    with LeaderboardStore(tmp_path) as store:
        for init_id, algorithm, reason, at, wall in rounds:
            checkpoint = dataclasses.replace(make_checkpoint("kept"), id=init_id,
                                             init_id=init_id, algorithm=algorithm,
                                             wall_time=wall)
            init = issue_for(store, checkpoint)
            store.write("UPDATE issued SET issued = ?, reason = ? WHERE init_id = ?",
                        (1_000.0 + at, reason, init.id))
            store.insert(checkpoint)
        kept, since = kept_pod(store)
    assert kept == pytest.approx({"ppo": 121.2, "sac": 46.0}) and since == pytest.approx(133.0)
    results = [RunResult("hopper", "tournament", 1, score=2195.0, algorithm="td3",
                         kept=kept, kept_from=since),
               RunResult("hopper", "tournament", 2, score=3000.0, algorithm="sac", kept={}),
               RunResult("hopper", "tournament", 3, score=2000.0, algorithm="sac"),
               RunResult("hopper", "sac", 1, score=3195.0, env_steps=484_672, wall=318.0)]
    lines = report([TASKS["hopper"]], {"hopper": 300.0}, results).splitlines()
    assert "kept pod, tournament s1: from 133 s, ppo 121 s, sac 46 s" in lines
    assert "kept pod, tournament s2: never kept" in lines
    assert "kept pod, tournament s3: not recorded" in lines  # recorded before the field
