"""leaderboard.answer: the run's answer is its best checkpoint, or the ensemble of its top
when that measures significantly better; it is measured for real at the run's end, holds
until a checkpoint is stored after it, and is what export and evaluate take by default."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from agents.evaluator import evaluate
from broker.core.settings import default_experiment
from envs.registry import make_env
from leaderboard import answer
from leaderboard.answer import Answer, answer_of, choose, current, record
from leaderboard.export import policy_from_store
from leaderboard.store import LeaderboardStore
from podracer.cli import main
from tests.cli.cli_store import ROWS, build_store, module_store
from tests.reliability.reliability_states import ppo_checkpoint, ppo_state

pytestmark = pytest.mark.timeout(180)

BY_SCORE = sorted(ROWS, key=lambda r: -r.score)
"""The store's rows, best first: d1 (-100), b1 (-150), a1 (-200), a1f1 (-300)."""


@pytest.fixture(scope="module")
def store_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return module_store(tmp_path_factory, "answer-store")


def test_the_ensemble_is_the_answer_only_when_it_measures_significantly_higher() -> None:
    single = Answer(("best",), 9100.0, 120.0, 32)
    better = Answer(("best", "second", "third"), 9700.0, 150.0, 32)
    assert choose(single, better) is better
    # higher, but within the noise of 32 episodes a side: one lucky measurement
    lucky = dataclasses.replace(better, score_mean=9150.0)
    assert choose(single, lucky) is single
    assert choose(single, dataclasses.replace(better, score_mean=8000.0)) is single
    assert choose(single, None) is single
    # the same gap with a wide spread is not significant either
    assert choose(single, dataclasses.replace(better, score_std=2500.0)) is single


def test_an_answer_holds_until_a_checkpoint_is_stored_after_it(tmp_path: Path) -> None:
    build_store(tmp_path)
    with LeaderboardStore(tmp_path) as store:
        best = store.best()
        assert best is not None and best.id == BY_SCORE[0].id
        # nothing recorded (a run with a target): the best checkpoint alone
        fallback = answer_of(store)
        assert fallback is not None and fallback.members == (best.id,)
        assert fallback.score_mean == best.score_mean and fallback.episodes == 0
        ensemble = Answer((BY_SCORE[0].id, BY_SCORE[1].id), -90.0, 5.0, 32, answer.now())
        record(store, ensemble)
        assert current(store) == ensemble and answer_of(store) == ensemble
        # a resumed run trains on: a new checkpoint makes the old answer stale
        env, hparams = "torch/Pendulum-v1", {"num_envs": 8, "rollout_steps": 16,
                                             "hidden_size": 16}
        store.insert(ppo_checkpoint("clitest", env, hparams, score=-120.0,
                                    state=ppo_state(env, hparams)))
        assert current(store) is None
        after = answer_of(store)
        assert after is not None and after.members == (best.id,)


def ppo_state_of(env: str, hparams: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    """An untrained PPO agent's state, its weights drawn with ``seed``."""
    from agents.build import build_agent
    from agents.registry import default_registry

    vec = make_env(env, int(hparams["num_envs"]), "cpu")
    try:
        return build_agent(default_registry(), "ppo", hparams, vec, torch.device("cpu"),
                           seed).state_dict()
    finally:
        vec.close()


def test_the_final_measurement_records_the_measured_answer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The top 3 measured again, then their ensemble on as many seeded episodes: the
    ensemble's measurement is what its policy really scores there, and the recorded
    answer is what ``choose`` makes of the two measurements."""
    from leaderboard.updater import FINAL_TOP, MEASURE_EPISODES
    from tests.leaderboard.test_claims import _updater

    weighed: list[tuple[Answer, Answer | None]] = []
    real_choose = answer.choose

    def spy(single: Answer, ensemble: Answer | None, alpha: float = answer.ALPHA) -> Answer:
        weighed.append((single, ensemble))
        return real_choose(single, ensemble, alpha)

    monkeypatch.setattr(answer, "choose", spy)
    env, ppo = "gym/Pendulum-v1", {"num_envs": 4, "rollout_steps": 16, "hidden_size": 16}
    exp = default_experiment(env).with_overrides(
        name="answer", algos={"ppo": 1}, reproducible=True, seed=7,
        round_budget={"steps": 1000}, total_budget={"env_steps": 10_000})
    with LeaderboardStore(tmp_path) as s:
        for seed, score in enumerate((-100.0, -110.0, -120.0)):
            s.insert(ppo_checkpoint("answer", env, ppo, score=score,
                                    state=ppo_state_of(env, ppo, seed)))
        updater = _updater(exp, s, tmp_path, "updater-a")
        assert len(updater.final_measure()) == FINAL_TOP
        updater.close()
        chosen = current(s)
        top = s.top(FINAL_TOP)
        members, _ = answer.split_weak(top)
        policy = policy_from_store(s, [e.id for e in members])
    assert len(members) >= 2
    vec = make_env(env, MEASURE_EPISODES, "cpu")
    try:
        measured = evaluate(policy, vec, MEASURE_EPISODES, seed=7)
    finally:
        vec.close()
    [(single, ensemble)] = weighed
    assert single.members == (top[0].id,) and single.score_mean == top[0].score_mean
    assert ensemble is not None and ensemble.members == tuple(e.id for e in members)
    assert ensemble.score_mean == pytest.approx(measured.mean, rel=1e-9)
    assert ensemble.episodes == single.episodes == MEASURE_EPISODES
    assert chosen is not None and chosen == real_choose(single, ensemble)


def test_three_copies_of_one_policy_answer_with_the_best_alone(tmp_path: Path) -> None:
    """An ensemble of one policy acts as that policy and measures the same on the same
    seeded episodes: never significantly higher, so the best alone is the answer."""
    from tests.leaderboard.test_claims import _updater

    env, ppo = "gym/Pendulum-v1", {"num_envs": 4, "rollout_steps": 16, "hidden_size": 16}
    exp = default_experiment(env).with_overrides(
        name="answer", algos={"ppo": 1}, reproducible=True, seed=3,
        round_budget={"steps": 1000}, total_budget={"env_steps": 10_000})
    state = ppo_state(env, ppo)
    with LeaderboardStore(tmp_path) as s:
        for score in (-100.0, -110.0, -120.0):
            s.insert(ppo_checkpoint("answer", env, ppo, score=score, state=state))
        updater = _updater(exp, s, tmp_path, "updater-c")
        updater.final_measure()
        updater.close()
        chosen, best = current(s), s.best()
    assert chosen is not None and best is not None
    assert chosen.members == (best.id,) and chosen.score_mean == best.score_mean


def test_export_evaluate_and_leaderboard_take_the_answer_unless_told_otherwise(
        store_root: Path, tmp_path: Path, capsys: Any) -> None:
    with LeaderboardStore(store_root) as store:
        record(store, Answer((BY_SCORE[0].id, BY_SCORE[1].id), -90.0, 5.0, 32, answer.now()))
    out = tmp_path / "answer.policy"
    assert main(["export", "--store", str(store_root), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"exported 2 member(s) to {out}" in printed
    assert BY_SCORE[0].id[:12] in printed and BY_SCORE[1].id[:12] in printed
    assert main(["export", "--store", str(store_root), "--top", "1",
                 "--out", str(tmp_path / "one.policy")]) == 0
    assert "exported 1 member(s)" in capsys.readouterr().out
    assert main(["evaluate", "--store", str(store_root), "--episodes", "4"]) == 0
    assert "2 member(s)" in capsys.readouterr().out
    assert main(["leaderboard", "--store", str(store_root)]) == 0
    assert "the run's answer: an ensemble of 2" in capsys.readouterr().out
