"""A lone agent's claim of the target counts as the tournament's does: once measured.

The tournament's time to target is its first checkpoint whose *measured* score reached
it (the updater re-evaluates a claim of the target before it stores it); a lone agent's
claim is measured the same way, and a refuted one trains on. Real torch Pendulum, real
PPO rounds; only the measurement's verdict is scripted.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

import pytest
import torch

from agents.base import Scalar
from benchmarks import tournament_runs
from benchmarks.tournament_report import report
from benchmarks.tournament_runs import (
    RunResult,
    Task,
    _refuted,
    _train_agent,
    measure_claim,
)
from broker.core.blobstore import BlobRef
from leaderboard.store import Entry

# every evaluation of a fresh agent reaches this: the first round ends on a claim
TASK = Task("pendulum", "torch/Pendulum-v1", target=-1e9, budget=20.0)


def _measurements(verdicts: list[float]) -> tuple[list[int], object]:
    seeds: list[int] = []

    def measure(env: str, algorithm: str, hparams: Mapping[str, Scalar],
                state: Mapping[str, torch.Tensor], seed: int) -> float:
        assert env == TASK.env and algorithm == "ppo" and state
        seeds.append(seed)
        return verdicts.pop(0)
    return seeds, measure


def test_a_refuted_claim_trains_on_and_the_next_claim_that_holds_counts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seeds, measure = _measurements([-2e9, -1e9 + 1.0])  # refuted, then held
    monkeypatch.setattr(tournament_runs, "measure_claim", measure)
    stop = threading.Event()
    started = time.monotonic()
    run = _train_agent(TASK, "ppo", {}, 3, TASK.budget, started, stop)
    assert run.refuted == 1
    assert seeds == [3000, 3001]  # one measurement per claim, each on its own seeds
    assert run.reached_at is not None and run.target_state is not None
    assert 0 < run.reached_at < time.monotonic() - started
    assert stop.is_set()  # the held claim ends the run (best-of-4: every agent)
    assert run.env_steps > 0


def test_a_claim_never_measured_at_the_target_is_no_hit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seeds, measure = _measurements([-2e9] * 1000)
    stop = threading.Event()

    def refute_three_then_stop(*args: object) -> float:
        verdict = measure(*args)  # type: ignore[operator]
        if len(seeds) == 3:
            stop.set()  # as another agent's hit would: not a deadline the machine races
        return verdict
    monkeypatch.setattr(tournament_runs, "measure_claim", refute_three_then_stop)
    run = _train_agent(TASK, "ppo", {}, 0, 120.0, time.monotonic(), stop)
    assert run.reached_at is None and run.target_state is None
    # it trained on after each refutation, and every claim measured was counted
    assert run.refuted == len(seeds) >= 3
    assert run.best_score is not None  # its best in-training state is still scored


def test_the_claim_measurement_is_the_updaters_episode_count() -> None:
    from agents.build import build_agent
    from agents.registry import default_registry
    from envs.registry import make_env
    env = make_env(TASK.env, 2, tournament_runs.CPU)
    try:
        state = build_agent(default_registry(), "ppo", {"num_envs": 2}, env,
                            tournament_runs.CPU, 0).state_dict()
    finally:
        env.close()
    first = measure_claim(TASK.env, "ppo", {}, state, 0)
    assert first == measure_claim(TASK.env, "ppo", {}, state, 0)  # seeded
    assert -2000.0 < first < 0.0  # Pendulum's returns over 200 steps
    assert tournament_runs.MEASURE_EPISODES == 32


def _entry(score: float, claimed: float, created: float) -> Entry:
    return Entry(id=f"c{created}", parent_id=None, experiment="e", init_id="i", pod="p",
                 algorithm="ppo", env=TASK.env, hparams={}, score_mean=score,
                 score_std=1.0, env_steps=1, wall_time=1.0, generation=0,
                 created=created, blob=BlobRef.of("0" * 64, 1),
                 score_claimed=claimed, reevaluated=claimed != score)


def test_the_tournament_counts_the_claims_its_updater_refuted_before_the_hit() -> None:
    entries = [_entry(-210.6, -144.9, 1.0), _entry(-250.0, -250.0, 2.0),
               _entry(-178.0, -160.0, 3.0), _entry(-205.0, -190.0, 4.0)]
    hit = entries[2]
    assert _refuted(entries, -200.0, hit) == [entries[0]]  # not the one after the hit
    assert _refuted(entries, -200.0, None) == [entries[0], entries[3]]
    text = report([tournament_runs.Task("pendulum", "torch/Pendulum-v1", -200.0, 60.0)],
                  {"pendulum": 60.0},
                  [RunResult("pendulum", "ppo", 0, time_to_target=5.0, confirm=-150.0,
                             refuted=1)])
    assert "s0 5.0s/-150 (1 refuted)" in text
