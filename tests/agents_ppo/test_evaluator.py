"""The evaluator counts the right episodes; BestSnapshot keeps the best state."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from agents.evaluator import BestSnapshot, EvalResult, evaluate
from broker.core.errors import PodracerError
from envs.base import VecEnv
from tests.agents_ppo.ppo_stub_envs import ScriptedEnv


def _zeros(obs: torch.Tensor) -> torch.Tensor:
    return torch.zeros(obs.shape[0], 1)


def _expected(per_copy: list[int]) -> list[float]:
    return [ScriptedEnv.length(i, k) * ScriptedEnv.reward(i, k)
            for i, n in enumerate(per_copy) for k in range(n)]


def test_counts_each_copys_first_episode_only() -> None:
    # copies end after 1, 2, 3, 1 steps; short ones finish more episodes meanwhile,
    # but only first episodes count (later ones pay 100+ per step and would show)
    result = evaluate(_zeros, ScriptedEnv(4), episodes=4)
    want = _expected([1, 1, 1, 1])
    assert result.episodes == 4
    assert result.mean == pytest.approx(sum(want) / 4)
    assert result.std == pytest.approx(float(torch.tensor(want).std(unbiased=False)))


def test_more_episodes_than_copies_spreads_them_evenly() -> None:
    result = evaluate(_zeros, ScriptedEnv(3), episodes=7)  # 3 + 2 + 2
    want = _expected([3, 2, 2])
    assert result.episodes == 7
    assert result.mean == pytest.approx(sum(want) / 7)


def test_fewer_episodes_than_copies_uses_the_first_copies() -> None:
    result = evaluate(_zeros, ScriptedEnv(4), episodes=2)
    assert result.mean == pytest.approx(sum(_expected([1, 1])) / 2)


def test_never_ending_env_raises_instead_of_hanging() -> None:
    class Endless(ScriptedEnv):
        @staticmethod
        def length(i: int, k: int) -> int:
            return 10**9

    with pytest.raises(PodracerError, match="0 of 2 episodes"):
        evaluate(_zeros, Endless(2), episodes=2, max_steps=50)


def test_best_snapshot_keeps_a_copy_of_the_best_state() -> None:
    best = BestSnapshot()
    weights = {"w": torch.tensor([1.0])}
    assert best.offer(EvalResult(-10.0, 1.0, 4), lambda: weights, env_steps=5)
    weights["w"].add_(1.0)  # training goes on in place; the snapshot must not follow
    assert not best.offer(EvalResult(-20.0, 1.0, 4), lambda: weights)
    assert not best.offer(EvalResult(math.nan, 1.0, 4), lambda: weights)
    assert best.state is not None and float(best.state["w"]) == 1.0
    assert best.offer(EvalResult(-5.0, 1.0, 4), lambda: weights, env_steps=9)
    assert best.state is not None and float(best.state["w"]) == 2.0
    assert best.result is not None and best.result.mean == -5.0 and best.env_steps == 9


@pytest.mark.parametrize("algorithm", ["ppo", "sac"])
def test_scores_on_episodes_the_agent_did_not_train_on(algorithm: str) -> None:
    # the agent resets its training env with a seed from its own RNG; an evaluation
    # resets its own env unseeded (fresh entropy), so its episodes start elsewhere
    from agents.build import build_agent
    from agents.registry import default_registry
    from envs.registry import make_env

    starts: dict[str, list[torch.Tensor]] = {"train": [], "eval": []}

    def spied(kind: str, copies: int) -> VecEnv:
        env = make_env("torch/Pendulum-v1", copies)
        reset = env.reset

        def spy(*, seed: int | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
            obs, info = reset(seed=seed)
            starts[kind].append(obs.clone())
            return obs, info

        env.reset = spy  # type: ignore[method-assign]
        return env

    train_env, eval_env = spied("train", 8), spied("eval", 8)
    agent = build_agent(default_registry(), algorithm, {"num_envs": 8}, train_env,
                        torch.device("cpu"), 0)
    agent.explore(train_env, 4)
    evaluate(lambda obs: agent.act(obs, True), eval_env, 8)
    trained, scored = torch.cat(starts["train"]), torch.cat(starts["eval"])
    assert trained.shape == scored.shape == (8, 3)
    assert not (trained[:, None, :] == scored[None, :, :]).all(-1).any()
