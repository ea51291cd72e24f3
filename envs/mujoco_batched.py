"""Gymnasium's ``Ant-v5``, ``HalfCheetah-v5``, ``Hopper-v5`` and ``Walker2d-v5`` with
their physics on threads and their step terms batched in numpy.

``ThreadedVectorEnv`` runs each copy's whole Gymnasium ``step`` on a thread; the Python
around MuJoCo's ``mj_step`` (observation, reward, health check, wrappers, info) holds the
GIL and ends up being what limits a 2-core machine. Here the threads only set
``ctrl`` and call ``mj_step``/``mj_rnePostConstraint`` (both release the GIL) on each
copy's own ``MjData``; the observation, every reward term, termination and truncation
are then computed once for the whole batch in numpy (``_Terms``, one class per task),
with the same operations, order and dtypes as the task's ``gymnasium/envs/mujoco/*_v5.py``
(the float32 control cost included), so the rollout is bit-for-bit Gymnasium's (tests
compare them). Resets (autoreset and ``reset(seed)``) go through each copy's own
Gymnasium ``reset``, so the initial states and RNG streams are Gymnasium's too. ``info``
carries the task's per-step entries (``x_position``, ``reward_ctrl``...) like
``SyncVectorEnv``; Ant's ``distance_from_origin`` may differ from Gymnasium's in the last
bit (computed without ``np.linalg.norm``).

Even on one thread this is faster than ``SyncVectorEnv``: the per-copy Python of a
Gymnasium step is most of a HalfCheetah or Hopper step (``benchmarks/envs.py``).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import gymnasium
import numpy as np

from broker.core.errors import ConfigError
from envs.threaded_vector import ThreadedVectorEnv

# The wrappers gymnasium.make adds whose step this backend may bypass: TimeLimit is
# mirrored by ``_elapsed``, the other two only check call order and types.
_BYPASSED_WRAPPERS = {"TimeLimit", "OrderEnforcing", "PassiveEnvChecker"}

Terms = tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]
"""A batch's observation, reward, termination and step info."""


class _Terms(abc.ABC):
    """One task's step terms for a batch of copies: what its ``step`` computes after the
    physics, read from the copies' ``MjData`` (arrays cached: they live as long as it)."""

    ENTRY_POINT: ClassVar[str]
    """The Gymnasium entry point whose ``step`` this mirrors."""

    def __init__(self, models: Sequence[Any]) -> None:
        self.first = models[0]
        self.num = len(models)
        self.qpos = [m.data.qpos for m in models]
        self.qvel = [m.data.qvel for m in models]

    def before(self) -> np.ndarray:
        """What the step needs from before the physics: the x positions."""
        return np.stack(self.qpos)[:, 0]

    def planar(self, before: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                  np.ndarray]:
        """A planar walker's ``qpos``, ``qvel``, x velocity over the step, and the
        positions its observation shows (without x unless the env asks for it)."""
        qpos, qvel = np.stack(self.qpos), np.stack(self.qvel)
        x_velocity = (qpos[:, 0] - before) / self.first.dt
        shown = self.first._exclude_current_positions_from_observation
        return qpos, qvel, x_velocity, qpos[:, 1:] if shown else qpos

    @abc.abstractmethod
    def after(self, actions: np.ndarray, before: np.ndarray) -> Terms:
        """The step's terms, after the physics."""

    def ctrl_cost(self, actions: np.ndarray) -> np.ndarray:
        """``control_cost(action)`` per copy (float32, as Gymnasium's on float32 actions)."""
        return self.first._ctrl_cost_weight * np.sum(np.square(actions), axis=1)


class _AntTerms(_Terms):
    ENTRY_POINT = "gymnasium.envs.mujoco.ant_v5:AntEnv"

    def __init__(self, models: Sequence[Any]) -> None:
        super().__init__(models)
        body = self.first.data.body(self.first._main_body).id
        self.cfrc = [m.data.cfrc_ext for m in models]
        self.torso = [m.data.xpos[body] for m in models]

    def before(self) -> np.ndarray:
        return np.stack(self.torso)[:, :2]

    def after(self, actions: np.ndarray, before: np.ndarray) -> Terms:
        ant = self.first
        qpos, qvel = np.stack(self.qpos), np.stack(self.qvel)
        xy_velocity = (np.stack(self.torso)[:, :2] - before) / ant.dt
        lo, hi = ant._contact_force_range
        contact = np.clip(np.stack(self.cfrc), lo, hi)
        position = qpos[:, 2:] if ant._exclude_current_positions_from_observation else qpos
        parts = [position, qvel]
        if ant._include_cfrc_ext_in_observation:
            parts.append(contact[:, 1:].reshape(self.num, -1))
        obs = np.concatenate(parts, axis=1)
        min_z, max_z = ant._healthy_z_range
        healthy = (np.isfinite(qpos).all(axis=1) & np.isfinite(qvel).all(axis=1)
                   & (min_z <= qpos[:, 2]) & (qpos[:, 2] <= max_z))
        forward = xy_velocity[:, 0] * ant._forward_reward_weight
        survive = healthy * ant._healthy_reward
        ctrl_cost = self.ctrl_cost(actions)
        contact_cost = ant._contact_cost_weight * np.sum(
            np.square(contact).reshape(self.num, -1), axis=1)
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


class _HalfCheetahTerms(_Terms):
    ENTRY_POINT = "gymnasium.envs.mujoco.half_cheetah_v5:HalfCheetahEnv"

    def after(self, actions: np.ndarray, before: np.ndarray) -> Terms:
        cheetah = self.first
        qpos, qvel, x_velocity, position = self.planar(before)
        obs = np.concatenate((position, qvel), axis=1)
        forward = cheetah._forward_reward_weight * x_velocity
        ctrl_cost = self.ctrl_cost(actions)
        reward = forward - ctrl_cost
        info = {"x_position": qpos[:, 0], "x_velocity": x_velocity,
                "reward_forward": forward, "reward_ctrl": -ctrl_cost}
        return obs, reward, np.zeros(self.num, dtype=np.bool_), info


class _HopperTerms(_Terms):
    ENTRY_POINT = "gymnasium.envs.mujoco.hopper_v5:HopperEnv"

    def healthy(self, qpos: np.ndarray, qvel: np.ndarray) -> np.ndarray:
        """``HopperEnv.is_healthy``: every state entry past x and z, then z and the angle,
        all strictly inside their ranges."""
        hopper = self.first
        state = np.concatenate((qpos, qvel), axis=1)[:, 2:]
        min_state, max_state = hopper._healthy_state_range
        return np.all((min_state < state) & (state < max_state), axis=1) & self.upright(qpos)

    def upright(self, qpos: np.ndarray) -> np.ndarray:
        """z and the torso's angle strictly inside their healthy ranges."""
        min_z, max_z = self.first._healthy_z_range
        min_angle, max_angle = self.first._healthy_angle_range
        return ((min_z < qpos[:, 1]) & (qpos[:, 1] < max_z)
                & (min_angle < qpos[:, 2]) & (qpos[:, 2] < max_angle))

    def after(self, actions: np.ndarray, before: np.ndarray) -> Terms:
        hopper = self.first
        qpos, qvel, x_velocity, position = self.planar(before)
        obs = np.concatenate((position, np.clip(qvel, -10, 10)), axis=1)
        healthy = self.healthy(qpos, qvel)
        forward = hopper._forward_reward_weight * x_velocity
        survive = healthy * hopper._healthy_reward
        ctrl_cost = self.ctrl_cost(actions)
        reward = (forward + survive) - ctrl_cost
        terminated = ~healthy & bool(hopper._terminate_when_unhealthy)
        info = {"x_position": qpos[:, 0],
                "z_distance_from_origin": qpos[:, 1] - hopper.init_qpos[1],
                "x_velocity": x_velocity, "reward_forward": forward,
                "reward_ctrl": -ctrl_cost, "reward_survive": survive}
        return obs, reward, terminated, info


class _Walker2dTerms(_HopperTerms):
    """Walker2d-v5's step is Hopper-v5's but for its health: z and the angle only."""

    ENTRY_POINT = "gymnasium.envs.mujoco.walker2d_v5:Walker2dEnv"

    def healthy(self, qpos: np.ndarray, qvel: np.ndarray) -> np.ndarray:
        return self.upright(qpos)


BATCHED_TASKS: dict[str, type[_Terms]] = {
    terms.ENTRY_POINT: terms
    for terms in (_AntTerms, _HalfCheetahTerms, _HopperTerms, _Walker2dTerms)}
"""The Gymnasium entry points the batched backend mirrors, and how."""


class MujocoBatchedVectorEnv(ThreadedVectorEnv):
    """Copies of a ``BATCHED_TASKS`` env: physics per copy on threads, step terms batched
    (SAME_STEP)."""

    def __init__(self, env_fns: Sequence[Callable[[], gymnasium.Env]], num_threads: int) -> None:
        super().__init__(env_fns, num_threads)
        first: Any = self.envs[0].unwrapped  # its private config is what the terms mirror
        entry = first.spec.entry_point if first.spec is not None else None
        terms = BATCHED_TASKS.get(entry) if isinstance(entry, str) else None
        if terms is None or first.render_mode:
            names = ", ".join(t.ENTRY_POINT.rsplit(":", 1)[1].removesuffix("Env") + "-v5"
                              for t in BATCHED_TASKS.values())
            raise ConfigError("gym_id", f"the batched MuJoCo backend only runs {names} "
                              "without rendering", "use vectorization='threads' for other envs")
        _check_wrappers(self.envs[0])
        self._models: list[Any] = [env.unwrapped for env in self.envs]
        self._terms = terms(self._models)
        self._max_steps = self.envs[0].spec.max_episode_steps if self.envs[0].spec else None
        self._elapsed = np.zeros(self.num_envs, dtype=np.int64)
        import mujoco  # here, not at the top: BATCHED_TASKS is read without MuJoCo installed

        self._mj_step, self._mj_rne_post_constraint = mujoco.mj_step, mujoco.mj_rnePostConstraint

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset every copy through Gymnasium (seed ``seed + i`` for copy *i*)."""
        self._elapsed[:] = 0
        return super().reset(seed=seed, options=options)

    def step(
        self, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step the physics on threads, then compute the task's step terms for the batch."""
        actions = np.asarray(actions)
        if actions.shape != self.action_space.shape:
            raise ConfigError("action", f"shape {actions.shape}, "
                              f"expected {self.action_space.shape}")
        before = self._terms.before()
        futures = [self._pool.submit(self._physics, lo, hi, actions)
                   for lo, hi in self._ranges[1:]] if self._pool is not None else []
        self._physics(*self._ranges[0], actions)
        for future in futures:
            future.result()
        obs, reward, terminated, info = self._terms.after(actions, before)
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
            model = self._models[i]
            model.data.ctrl[:] = actions[i]
            self._mj_step(model.model, model.data, nstep=model.frame_skip)
            self._mj_rne_post_constraint(model.model, model.data)


def _check_wrappers(env: gymnasium.Env) -> None:
    """Refuse wrappers whose ``step`` would change the rollout if it were bypassed."""
    while isinstance(env, gymnasium.Wrapper):
        if type(env).__name__ not in _BYPASSED_WRAPPERS:
            raise ConfigError("gym_id", f"the env is wrapped in {type(env).__name__}, which "
                              "the batched backend would bypass", "use vectorization='threads'")
        env = env.env
