"""Gymnasium's ``Ant-v5`` with its physics on threads and its step terms batched in numpy.

``ThreadedVectorEnv`` runs each copy's whole Gymnasium ``step`` on a thread; the Python
around MuJoCo's ``mj_step`` (observation, reward, health check, wrappers, info) holds the
GIL and ends up being what limits a 2-core machine. Here the threads only set
``ctrl`` and call ``mj_step``/``mj_rnePostConstraint`` (both release the GIL) on each
copy's own ``MjData``; the observation, every reward term, termination and truncation
are then computed once for the whole batch in numpy, with the same operations, order
and dtypes as ``gymnasium/envs/mujoco/ant_v5.py`` (the float32 control cost included),
so the rollout is bit-for-bit Gymnasium's (tests compare them). Resets (autoreset and
``reset(seed)``) go through each copy's own Gymnasium ``reset``, so the initial states
and RNG streams are Gymnasium's too. ``info`` carries Ant's per-step entries
(``x_position``, ``reward_ctrl``...) like ``SyncVectorEnv``; ``distance_from_origin`` may
differ from Gymnasium's in the last bit (computed without ``np.linalg.norm``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium
import mujoco
import numpy as np

from broker.core.errors import ConfigError
from envs.threaded_vector import ThreadedVectorEnv

ANT_V5_ENTRY_POINT = "gymnasium.envs.mujoco.ant_v5:AntEnv"
# The wrappers gymnasium.make adds whose step this backend may bypass: TimeLimit is
# mirrored by ``_elapsed``, the other two only check call order and types.
_BYPASSED_WRAPPERS = {"TimeLimit", "OrderEnforcing", "PassiveEnvChecker"}


class AntBatchedVectorEnv(ThreadedVectorEnv):
    """``Ant-v5`` copies: physics per copy on threads, step terms batched (SAME_STEP)."""

    def __init__(self, env_fns: Sequence[Callable[[], gymnasium.Env]], num_threads: int) -> None:
        super().__init__(env_fns, num_threads)
        ant: Any = self.envs[0].unwrapped  # AntEnv: its private config is what we mirror
        if ant.spec is None or ant.spec.entry_point != ANT_V5_ENTRY_POINT or ant.render_mode:
            raise ConfigError("gym_id", "the batched MuJoCo backend only runs Ant-v5 without "
                              "rendering", "use vectorization='threads' for other envs")
        _check_wrappers(self.envs[0])
        self._ants: list[Any] = [env.unwrapped for env in self.envs]
        self._max_steps = self.envs[0].spec.max_episode_steps if self.envs[0].spec else None
        self._elapsed = np.zeros(self.num_envs, dtype=np.int64)
        body = ant.data.body(ant._main_body).id
        # MjData arrays are views into buffers that live as long as the MjData: cache them.
        self._qpos = [a.data.qpos for a in self._ants]
        self._qvel = [a.data.qvel for a in self._ants]
        self._cfrc = [a.data.cfrc_ext for a in self._ants]
        self._torso = [a.data.xpos[body] for a in self._ants]

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset every copy through Gymnasium (seed ``seed + i`` for copy *i*)."""
        self._elapsed[:] = 0
        return super().reset(seed=seed, options=options)

    def step(
        self, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step the physics on threads, then compute Ant-v5's step terms for the batch."""
        actions = np.asarray(actions)
        if actions.shape != self.action_space.shape:
            raise ConfigError("action", f"shape {actions.shape}, "
                              f"expected {self.action_space.shape}")
        xy_before = np.stack(self._torso)[:, :2]
        futures = [self._pool.submit(self._physics, lo, hi, actions)
                   for lo, hi in self._ranges[1:]] if self._pool is not None else []
        self._physics(*self._ranges[0], actions)
        for future in futures:
            future.result()
        obs, reward, terminated, info = self._terms(actions, xy_before)
        self._elapsed += 1
        truncated = (self._elapsed >= self._max_steps if self._max_steps is not None
                     else np.zeros(self.num_envs, dtype=np.bool_))
        infos: dict[str, Any] = {}
        for key, value in info.items():
            infos[key], infos[f"_{key}"] = value, np.ones(self.num_envs, dtype=np.bool_)
        for i in map(int, np.flatnonzero(terminated | truncated)):
            final_info = {key: value[i] for key, value in info.items()}
            infos = self._add_info(infos, {"final_obs": obs[i].copy(), "final_info": final_info}, i)
            obs[i], reset_info = self.envs[i].reset()
            self._elapsed[i] = 0
            # As in SyncVectorEnv, a reset copy reports only its reset info.
            for key in info.keys() - reset_info.keys():
                infos[key][i], infos[f"_{key}"][i] = 0, False
            infos = self._add_info(infos, reset_info, i)
        return obs, reward, terminated, truncated, infos

    def _physics(self, lo: int, hi: int, actions: np.ndarray) -> None:
        """What ``MujocoEnv.do_simulation`` does, for copies ``lo..hi-1`` (GIL released)."""
        for i in range(lo, hi):
            ant = self._ants[i]
            ant.data.ctrl[:] = actions[i]
            mujoco.mj_step(ant.model, ant.data, nstep=ant.frame_skip)
            mujoco.mj_rnePostConstraint(ant.model, ant.data)

    def _terms(
        self, actions: np.ndarray, xy_before: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """``AntEnv.step``'s observation, reward, termination and info, batched."""
        ant = self._ants[0]
        qpos, qvel = np.stack(self._qpos), np.stack(self._qvel)
        xy_velocity = (np.stack(self._torso)[:, :2] - xy_before) / ant.dt
        lo, hi = ant._contact_force_range
        contact = np.clip(np.stack(self._cfrc), lo, hi)
        position = qpos[:, 2:] if ant._exclude_current_positions_from_observation else qpos
        parts = [position, qvel]
        if ant._include_cfrc_ext_in_observation:
            parts.append(contact[:, 1:].reshape(self.num_envs, -1))
        obs = np.concatenate(parts, axis=1)
        min_z, max_z = ant._healthy_z_range
        healthy = (np.isfinite(qpos).all(axis=1) & np.isfinite(qvel).all(axis=1)
                   & (min_z <= qpos[:, 2]) & (qpos[:, 2] <= max_z))
        forward = xy_velocity[:, 0] * ant._forward_reward_weight
        survive = healthy * ant._healthy_reward
        ctrl_cost = ant._ctrl_cost_weight * np.sum(np.square(actions), axis=1)
        contact_cost = ant._contact_cost_weight * np.sum(
            np.square(contact).reshape(self.num_envs, -1), axis=1)
        reward = (forward + survive) - (ctrl_cost + contact_cost)
        terminated = ~healthy & bool(ant._terminate_when_unhealthy)
        info = {
            "x_position": qpos[:, 0], "y_position": qpos[:, 1],
            "distance_from_origin": np.sqrt(qpos[:, 0] ** 2 + qpos[:, 1] ** 2),
            "x_velocity": xy_velocity[:, 0], "y_velocity": xy_velocity[:, 1],
            "reward_forward": forward, "reward_ctrl": -ctrl_cost,
            "reward_contact": -contact_cost, "reward_survive": survive,
        }
        return obs, reward, terminated, info


def _check_wrappers(env: gymnasium.Env) -> None:
    """Refuse wrappers whose ``step`` would change the rollout if it were bypassed."""
    while isinstance(env, gymnasium.Wrapper):
        if type(env).__name__ not in _BYPASSED_WRAPPERS:
            raise ConfigError("gym_id", f"Ant-v5 is wrapped in {type(env).__name__}, which the "
                              "batched backend would bypass", "use vectorization='threads'")
        env = env.env
