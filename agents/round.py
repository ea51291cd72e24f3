"""One training round of a pod: build the agent, train within a budget, evaluate.

Pure compute, no broker: the pod service calls ``build_agent`` and then
``train_round`` in a worker thread and turns the ``RoundResult`` into a ``Checkpoint``.

Round semantics (documented here because the pod and the leaderboard rely on them):

* The budget counts this round only: ``budget.steps`` env steps taken by the agent
  during the round (``agent.env_steps`` is cumulative over the lineage) and/or
  ``budget.seconds`` of wall time; whichever is hit first ends the round. The check
  runs between iterations, so a round overshoots by at most one iteration.
* The agent is evaluated every ``eval_every_s`` seconds (if given) and always at the
  end. ``best_state`` is the full state at the best evaluation, and
  ``score_mean``/``score_std`` are *that* evaluation's, so the published score always
  describes the published state.
* ``should_stop()`` returning True (e.g. ``control.stop``) ends the round early; the
  final evaluation still runs so the work is not lost.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium
import torch

from agents.base import Agent, AlgorithmRegistry, Scalar, config_from_hparams
from agents.evaluator import BestSnapshot, EvalResult, evaluate
from broker.errors import ConfigError
from broker.schemas import Budget
from envs.base import VecEnv

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Progress:
    """A report during a round: time and steps so far, the latest eval, latest metrics."""

    seconds: float
    env_steps: int
    score: float | None
    metrics: dict[str, float]


@dataclasses.dataclass(frozen=True)
class RoundResult:
    """What a round produced; ``best_state``/``score_*`` belong together (best eval)."""

    score_mean: float
    score_std: float
    env_steps: int
    """Env steps taken in this round."""
    total_env_steps: int
    """The agent's cumulative env steps (lineage) at the end of the round."""
    wall_time: float
    curve: list[tuple[float, float, int]]
    """(seconds since round start, eval mean, round env steps) at every evaluation."""
    metrics: dict[str, float]
    best_state: dict[str, torch.Tensor]


def resolve_config(registry: AlgorithmRegistry, algorithm: str, hparams: Mapping[str, Scalar]
                   ) -> Any:
    """The validated config of ``algorithm`` (read ``num_envs`` from it to build the env)."""
    return config_from_hparams(registry.get(algorithm).config_cls, hparams)


def check_action_space(registry: AlgorithmRegistry, algorithm: str,
                       action_space: gymnasium.spaces.Space[Any]) -> None:
    """``ConfigError`` if ``algorithm`` cannot act in ``action_space``."""
    spec = registry.get(algorithm)
    if isinstance(action_space, gymnasium.spaces.Discrete):
        ok, kind = spec.discrete, "discrete"
    elif isinstance(action_space, gymnasium.spaces.Box):
        ok, kind = spec.continuous, "continuous"
    else:
        ok, kind = False, type(action_space).__name__
    if not ok:
        able = [n for n in registry.names()
                if (registry.get(n).discrete if kind == "discrete" else registry.get(n).continuous)]
        raise ConfigError("algorithm", f"{algorithm} does not support {kind} actions",
                          f"use one of {', '.join(able) or 'none registered'} for this env")


def build_agent(
    registry: AlgorithmRegistry,
    algorithm: str,
    hparams: Mapping[str, Scalar],
    env: VecEnv,
    device: torch.device,
    seed: int,
    state: Mapping[str, torch.Tensor] | None = None,
) -> Agent:
    """Validate ``hparams``, check the action space, build the agent and load ``state``.

    ``env`` supplies the spaces; its ``num_envs`` must equal the config's (build the env
    from ``resolve_config(...).num_envs``). Every problem is a ``ConfigError`` naming the
    field (a tensor of the wrong shape is named ``state.<tensor>``).
    """
    config = resolve_config(registry, algorithm, hparams)
    check_action_space(registry, algorithm, env.single_action_space)
    if env.num_envs != config.num_envs:
        raise ConfigError("env.num_envs", f"env has {env.num_envs} copies, "
                          f"hparams.num_envs is {config.num_envs}",
                          "build the env with resolve_config(...).num_envs copies")
    spec = registry.get(algorithm)
    agent = spec.build(env.single_observation_space, env.single_action_space, config,
                       device, seed)
    if state is not None:
        agent.load_state_dict(state)
    log.debug("built %s agent (seed %d, state %s)", algorithm, seed,
              "loaded" if state is not None else "fresh")
    return agent


def _budget_left(budget: Budget, steps: int, seconds: float) -> bool:
    if budget.steps is not None and steps >= budget.steps:
        return False
    return budget.seconds is None or seconds < budget.seconds


def train_round(
    agent: Agent,
    env: VecEnv,
    eval_env: VecEnv,
    budget: Budget,
    *,
    eval_every_s: float | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    eval_episodes: int = 32,
) -> RoundResult:
    """Train ``agent`` on ``env`` until ``budget`` (or ``should_stop()``); see module doc."""
    start = time.monotonic()
    first_steps = agent.env_steps
    best = BestSnapshot()
    curve: list[tuple[float, float, int]] = []
    metrics: dict[str, float] = {}
    last_eval = start

    def run_eval() -> EvalResult:
        result = evaluate(lambda obs: agent.act(obs, True), eval_env, eval_episodes)
        steps = agent.env_steps - first_steps
        curve.append((time.monotonic() - start, result.mean, steps))
        best.offer(result, agent.state_dict, steps)
        return result

    while _budget_left(budget, agent.env_steps - first_steps, time.monotonic() - start):
        if should_stop is not None and should_stop():
            log.info("round stopped early after %d steps", agent.env_steps - first_steps)
            break
        metrics = agent.train_iteration(env)
        score = None
        if eval_every_s is not None and time.monotonic() - last_eval >= eval_every_s:
            score = run_eval().mean
            last_eval = time.monotonic()
        if on_progress is not None:
            on_progress(Progress(time.monotonic() - start, agent.env_steps - first_steps,
                                 score, dict(metrics)))
    final = run_eval()
    assert best.result is not None and best.state is not None
    wall = time.monotonic() - start
    steps = agent.env_steps - first_steps
    log.info("round done: %d steps in %.1fs, final %.2f, best %.2f", steps, wall, final.mean,
             best.result.mean)
    out_metrics = {**metrics, "eval/final_mean": final.mean, "eval/final_std": final.std,
                   "eval/best_mean": best.result.mean,
                   "round/steps_per_second": steps / wall if wall > 0 else 0.0}
    return RoundResult(score_mean=best.result.mean, score_std=best.result.std, env_steps=steps,
                       total_env_steps=agent.env_steps, wall_time=wall, curve=curve,
                       metrics=out_metrics, best_state=best.state)
