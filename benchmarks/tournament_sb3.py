"""Stable-Baselines3 rows of ``benchmarks.tournament``, measured in the same run.

Only when ``stable_baselines3`` imports (``pip install 'podracer[sb3]'``); otherwise the
rows are skipped and the report says so. Each run happens in a fresh process like every
other row, on the task's Gymnasium id (``Task.gym_id``), with one torch thread:

* ``sb3-ppo``: PPO with RL-Zoo's settings for Pendulum-v1 (``PPO_PENDULUM``; its
  ``VecNormalize`` included), SB3's defaults elsewhere;
* ``sb3-sac``: SAC with SB3's defaults and RL-Zoo's ``learning_starts=10000`` (its
  MuJoCo setting).

Training stops at the wall budget (or at the target). An evaluation callback scores
the deterministic policy on ``IN_TRAINING_EPISODES`` episodes every ``EVAL_EVERY_S``
seconds of wall time (2 s on a task with a target, 60 s otherwise, as the pods), keeps
the best policy weights (the final policy is evaluated too), and the clock of the time
to target stops at the evaluation that reached it. The score is that best policy
re-evaluated on ``EVAL_EPISODES`` episodes seeded from ``EVAL_SEED`` (one env per
episode, seeds ``EVAL_SEED + i``).
"""

from __future__ import annotations

import copy
import importlib.util
import logging
import time
from typing import Any

import gymnasium
import numpy as np
import torch

from benchmarks.tournament_runs import EVAL_EPISODES, EVAL_SEED, RunResult, Task

log = logging.getLogger(__name__)

SB3_METHODS = ("sb3-ppo", "sb3-sac")
PPO_PENDULUM: dict[str, Any] = {
    "n_steps": 1024, "gae_lambda": 0.95, "gamma": 0.9, "n_epochs": 10, "ent_coef": 0.0,
    "learning_rate": 1e-3, "clip_range": 0.2, "use_sde": True, "sde_sample_freq": 4}
"""RL-Zoo's hyperparameters of PPO on Pendulum-v1 (4 envs, normalized)."""
SAC_MUJOCO: dict[str, Any] = {"learning_starts": 10_000}
IN_TRAINING_EPISODES = 10


def available() -> bool:
    """Whether Stable-Baselines3 is installed."""
    return importlib.util.find_spec("stable_baselines3") is not None


Stats = tuple[np.ndarray, np.ndarray, float, float]
"""A ``VecNormalize``'s observation statistics: mean, var, clip, epsilon."""


def _stats(normalize: Any) -> Stats | None:
    if normalize is None:
        return None
    rms = normalize.obs_rms
    return (rms.mean.copy(), rms.var.copy(), float(normalize.clip_obs),
            float(normalize.epsilon))


def _episodes(policy: Any, gym_id: str, episodes: int, seed: int | None,
              stats: Stats | None = None) -> float:
    """Mean return of ``policy``'s deterministic actions over ``episodes`` episodes, one
    env per episode stepped in lockstep (one batched ``predict`` per step)."""
    envs = [gymnasium.make(gym_id) for _ in range(episodes)]
    try:
        obs = np.stack([env.reset(seed=None if seed is None else seed + i)[0]
                        for i, env in enumerate(envs)])
        totals = np.zeros(episodes)
        live = np.ones(episodes, dtype=bool)
        while live.any():
            seen = obs
            if stats is not None:
                mean, var, clip, eps = stats
                seen = np.clip((obs - mean) / np.sqrt(var + eps), -clip, clip)
            actions, _ = policy.predict(seen.astype(np.float32), deterministic=True)
            for i in np.flatnonzero(live):
                o, reward, terminated, truncated, _ = envs[i].step(actions[i])
                obs[i] = o
                totals[i] += float(reward)
                live[i] = not (terminated or truncated)
        return float(totals.mean())
    finally:
        for env in envs:
            env.close()


def run_sb3(task: Task, method: str, seed: int, budget: float) -> RunResult:
    """One SB3 agent for ``budget`` seconds (module doc), scored like the other rows."""
    from stable_baselines3 import PPO, SAC
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    result = RunResult(task.key, method, seed, algorithm=method)
    every = 2.0 if task.target is not None else 60.0
    started = time.monotonic()
    pendulum = task.gym_id == "Pendulum-v1"
    if method == "sb3-ppo":
        env: Any = make_vec_env(task.gym_id, n_envs=4 if pendulum else 1, seed=seed)
        if pendulum:
            env = VecNormalize(env, gamma=PPO_PENDULUM["gamma"])
        model: Any = PPO("MlpPolicy", env, seed=seed, device="cpu",
                         **(PPO_PENDULUM if pendulum else {}))
    else:
        env = make_vec_env(task.gym_id, n_envs=1, seed=seed)
        model = SAC("MlpPolicy", env, seed=seed, device="cpu",
                    **({} if pendulum else SAC_MUJOCO))
    normalize = env if isinstance(env, VecNormalize) else None
    best: dict[str, Any] = {}

    class Clock(BaseCallback):
        """Evaluates on schedule, keeps the best policy, stops at the budget/target."""

        def __init__(self) -> None:
            super().__init__()
            self.last = time.monotonic()

        def offer(self) -> float:
            """Evaluate now; keep the policy if it is the best so far."""
            stats = _stats(normalize)
            score = _episodes(model.policy, task.gym_id, IN_TRAINING_EPISODES, None, stats)
            if score > best.get("score", -np.inf):
                best.update(score=score, policy=copy.deepcopy(model.policy.state_dict()),
                            stats=stats)
            return score

        def _on_step(self) -> bool:
            now = time.monotonic()
            if now - self.last >= every:
                self.last = now
                score = self.offer()
                if task.target is not None and score >= task.target:
                    result.time_to_target = time.monotonic() - started
                    return False
            return time.monotonic() - started < budget

    clock = Clock()
    model.learn(total_timesteps=10**9, callback=clock)
    result.wall = time.monotonic() - started
    if result.time_to_target is None:
        clock.offer()  # the final policy is a candidate too, as a round's final evaluation
    result.env_steps = int(model.num_timesteps)
    result.checkpoints = 1
    if best:
        model.policy.load_state_dict(best["policy"])
        result.in_training_best = best["score"]
        result.score = _episodes(model.policy, task.gym_id, EVAL_EPISODES, EVAL_SEED,
                                 best["stats"])
        if result.time_to_target is not None:
            result.confirm = result.score
    env.close()
    return result
