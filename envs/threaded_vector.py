"""A Gymnasium vector env that steps its copies on a few threads.

MuJoCo's ``mj_step`` releases the GIL, so while one thread runs a copy's physics another
can run the Python around it (observation, reward, wrappers). Each copy is an ordinary
``gymnasium.make`` env stepped by its own ``step``/``reset``: the rollout is Gymnasium's
by construction (same observations, rewards incl. every cost term, termination and
truncation, same per-copy seeds ``seed + i`` as ``SyncVectorEnv``), only the wall time
changes. Copies are split into contiguous ranges, one per thread; the calling thread
steps the first range itself so a step costs one hand-off, not two.

It only pays off for simulators that release the GIL (MuJoCo); pure-Python envs such as
classic control run slower than ``SyncVectorEnv`` here.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import gymnasium
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from broker.core.errors import ConfigError

log = logging.getLogger(__name__)

# (index, final_obs, final_info) of a copy whose episode ended on this step.
_Ended = tuple[int, Any, dict[str, Any]]


class ThreadedVectorEnv(VectorEnv):
    """``SyncVectorEnv`` semantics (SAME_STEP autoreset) with copies stepped on threads."""

    def __init__(self, env_fns: Sequence[Callable[[], gymnasium.Env]], num_threads: int) -> None:
        super().__init__()
        if num_threads < 1:
            raise ConfigError("num_threads", f"must be >= 1, got {num_threads}")
        self.envs = [fn() for fn in env_fns]
        self.num_envs = len(self.envs)
        self.metadata = dict(self.envs[0].metadata)
        self.metadata["autoreset_mode"] = AutoresetMode.SAME_STEP
        self.autoreset_mode = AutoresetMode.SAME_STEP
        self.render_mode = self.envs[0].render_mode
        self.single_observation_space = self.envs[0].observation_space
        self.single_action_space = self.envs[0].action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        for env in self.envs[1:]:
            if (env.observation_space != self.single_observation_space
                    or env.action_space != self.single_action_space):
                raise ConfigError("env_fns", "copies have different spaces",
                                  "build every copy from the same id and kwargs")
        space = self.single_observation_space
        if not isinstance(space, gymnasium.spaces.Box | gymnasium.spaces.Discrete):
            raise ConfigError("observation_space", f"{type(space).__name__} is not supported",
                              "wrap the env in gymnasium.wrappers.FlattenObservation")
        threads = min(num_threads, self.num_envs)
        bounds = np.linspace(0, self.num_envs, threads + 1).astype(int)
        self._ranges = [(int(a), int(b)) for a, b in itertools.pairwise(bounds)]
        self._pool = (ThreadPoolExecutor(threads - 1, thread_name_prefix="podracer-env")
                      if threads > 1 else None)
        self._obs = np.zeros((self.num_envs, *(space.shape or ())), dtype=space.dtype)
        self._rewards = np.zeros(self.num_envs, dtype=np.float64)
        self._terminations = np.zeros(self.num_envs, dtype=np.bool_)
        self._truncations = np.zeros(self.num_envs, dtype=np.bool_)
        self._infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        log.debug("threaded vector env: %d copies on %d threads", self.num_envs, threads)

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset every copy; an int seed gives copy *i* the seed ``seed + i`` (as Gymnasium)."""
        if seed is None:
            seeds: list[int | None] = [None] * self.num_envs
        elif isinstance(seed, int):
            seeds = [seed + i for i in range(self.num_envs)]
        else:
            seeds = list(seed)
        if len(seeds) != self.num_envs:
            raise ConfigError("seed", f"{len(seeds)} seeds for {self.num_envs} copies",
                              "pass one int or one seed per copy")
        infos: dict[str, Any] = {}
        for i, (env, s) in enumerate(zip(self.envs, seeds, strict=True)):
            self._obs[i], info = env.reset(seed=s, options=options)
            infos = self._add_info(infos, info, i)
        self._terminations[:] = False
        self._truncations[:] = False
        return self._obs, infos

    def step(
        self, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every copy once; a copy that ends is reset on the same step (SAME_STEP)."""
        futures = [self._pool.submit(self._step_range, lo, hi, actions)
                   for lo, hi in self._ranges[1:]] if self._pool is not None else []
        ended = self._step_range(*self._ranges[0], actions)
        for future in futures:
            ended += future.result()
        infos: dict[str, Any] = {}
        for i, final_obs, final_info in ended:
            infos = self._add_info(infos, {"final_obs": final_obs, "final_info": final_info}, i)
        for i, info in enumerate(self._infos):
            infos = self._add_info(infos, info, i)
        return (self._obs, self._rewards.copy(), self._terminations.copy(),
                self._truncations.copy(), infos)

    def _step_range(self, lo: int, hi: int, actions: np.ndarray) -> list[_Ended]:
        """Step copies ``lo..hi-1``; runs on a worker thread, touching only those rows."""
        ended: list[_Ended] = []
        for i in range(lo, hi):
            obs, reward, terminated, truncated, info = self.envs[i].step(actions[i])
            self._rewards[i] = reward
            self._terminations[i] = terminated
            self._truncations[i] = truncated
            if terminated or truncated:
                ended.append((i, obs, info))
                obs, info = self.envs[i].reset()
            self._obs[i] = obs
            self._infos[i] = info
        return ended

    def close_extras(self, **kwargs: Any) -> None:
        """Stop the worker threads and close every copy."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        for env in self.envs:
            env.close()
