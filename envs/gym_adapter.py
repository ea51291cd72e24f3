"""Any registered Gymnasium id as a Podracer ``VecEnv`` (torch tensors on a chosen device).

Vectorization (``make(..., vectorization=...)``):

* ``"sync"``: ``gymnasium.vector.SyncVectorEnv``, in-process, one copy after another.
* ``"async"``: ``gymnasium.vector.AsyncVectorEnv``, one subprocess per copy, shared memory.
* ``"threads"``: ``envs.threaded_vector.ThreadedVectorEnv``, the same Gymnasium copies
  stepped on a few threads; worth it for MuJoCo only, whose physics releases the GIL.
* ``"batched"``: ``envs.mujoco_batched.MujocoBatchedVectorEnv``, ``Ant-v5``,
  ``HalfCheetah-v5``, ``Hopper-v5`` and ``Walker2d-v5`` only: physics on threads,
  observation and reward terms computed for the whole batch in numpy.
* ``"auto"`` (default): ``"batched"`` for those four (on one thread too: the batched
  terms are what it saves), ``"threads"`` for Gymnasium's other MuJoCo envs when more
  than one CPU and copy are there, ``"sync"`` otherwise.
  Every option keeps Gymnasium's semantics exactly (same rollout for the same seed and
  actions; the tests compare them).

Other MuJoCo backends were measured (``benchmarks/envs.py``) and not chosen, because
neither reproduces Gymnasium's rollout: envpool 1.2.5 (installs on Python 3.11, has
``Ant-v5`` with v5's reward terms; after a state copied in, observations agree to ~3e-4
and the cost terms exactly) draws initial states from its own RNG, carries its own
MuJoCo build and autoresets on the next step. ``mujoco.rollout`` (MuJoCo 4.0: a C++
thread pool over the same ``mj_step``, so no faster physics) returns only the
integrated states, not the per-copy ``MjData`` quantities Gymnasium's observation and
reward read (``cfrc_ext`` after ``mj_rnePostConstraint``, the torso ``xpos`` of the last
substep) nor the solver warm start, so it cannot give the same numbers.

Numpy meets torch only here at the edge: actions ``tensor -> numpy`` before the step,
results ``torch.from_numpy(...).to(device)`` after it. Floating observations become
``obs_dtype`` (float32 by default, the networks' dtype; ``None`` keeps Gymnasium's).
``info["final_obs"]`` is a tensor like ``obs``: rows of copies that ended hold their last
observation, other rows repeat ``obs`` (so it can be bootstrapped from directly). The
rest of Gymnasium's info passes through as numpy arrays.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import logging
import os
from typing import Any

import gymnasium
import numpy as np
import torch
from gymnasium.vector import AutoresetMode as GymAutoresetMode

from broker.core.errors import ConfigError, EnvUnavailable
from broker.core.settings import ENV_THREADS_VAR, whole_number
from envs.base import AutoresetMode, StepResult
from envs.mujoco_batched import BATCHED_TASKS, MujocoBatchedVectorEnv  # MuJoCo itself: lazily
from envs.threaded_vector import ThreadedVectorEnv

log = logging.getLogger(__name__)

VECTORIZATIONS = ("auto", "sync", "async", "threads", "batched")


class GymVecEnv:
    """A Gymnasium vector env (SAME_STEP autoreset) behind the Podracer ``VecEnv`` contract."""

    autoreset_mode = AutoresetMode.SAME_STEP

    def __init__(
        self,
        vector_env: gymnasium.vector.VectorEnv,
        device: torch.device | str = "cpu",
        obs_dtype: torch.dtype | None = torch.float32,
    ) -> None:
        mode = vector_env.metadata.get("autoreset_mode")
        if mode != GymAutoresetMode.SAME_STEP:
            raise ConfigError("vector_env", f"autoreset mode is {mode}, Podracer needs SAME_STEP",
                              "build it with autoreset_mode=AutoresetMode.SAME_STEP")
        space = vector_env.single_observation_space
        if not isinstance(space, gymnasium.spaces.Box | gymnasium.spaces.Discrete):
            raise ConfigError("observation_space", f"{type(space).__name__} is not supported",
                              "wrap the env in gymnasium.wrappers.FlattenObservation")
        self.vector_env = vector_env
        self.num_envs: int = vector_env.num_envs
        self.device = torch.device(device)
        self.single_action_space = vector_env.single_action_space
        self._obs_dtype = _torch_obs_dtype(space, obs_dtype)
        self.single_observation_space = _retyped(space, self._obs_dtype)
        self._action_dtype = self.single_action_space.dtype
        self._action_shape = (self.num_envs, *_shape(self.single_action_space))
        self._closed = False

    def reset(self, *, seed: int | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
        """Reset every copy; ``seed`` gives copy *i* the seed ``seed + i`` (Gymnasium's rule)."""
        obs, info = self.vector_env.reset(seed=seed)
        return self._to_torch_obs(obs), info

    def step(self, action: torch.Tensor) -> StepResult:
        """Step every copy with ``action[N, ...]``; see the module docs for ``final_obs``."""
        if tuple(action.shape) != self._action_shape:
            raise ConfigError("action", f"shape {tuple(action.shape)}, "
                              f"expected {self._action_shape}", "pass one action per copy")
        act = action.detach().cpu().numpy().astype(self._action_dtype, copy=False)
        obs, reward, terminated, truncated, info = self.vector_env.step(act)
        obs_t = self._to_torch_obs(obs)
        final_obs = obs_t
        ended = info.pop("_final_obs", None)
        finals = info.pop("final_obs", None)
        if ended is not None and finals is not None and ended.any():
            rows = np.flatnonzero(ended)
            final_obs = obs_t.clone()
            final_obs[torch.from_numpy(rows).to(self.device)] = self._to_torch_obs(
                np.stack([finals[i] for i in rows]))
        info["final_obs"] = final_obs
        return (
            obs_t,
            torch.from_numpy(reward).to(self.device, torch.float32),
            torch.from_numpy(terminated).to(self.device),
            torch.from_numpy(truncated).to(self.device),
            info,
        )

    def close(self) -> None:
        """Close the Gymnasium vector env; idempotent."""
        if not self._closed:
            self._closed = True
            self.vector_env.close()

    def _to_torch_obs(self, obs: np.ndarray) -> torch.Tensor:
        source = torch.from_numpy(np.asarray(obs))
        out = source.to(self.device, self._obs_dtype)
        # Vector envs reuse their buffers (copy=False); never hand out a view of one.
        return out.clone() if out.data_ptr() == source.data_ptr() else out


def make(
    gym_id: str,
    num_envs: int,
    device: torch.device | str = "cpu",
    *,
    vectorization: str = "auto",
    num_threads: int | None = None,
    obs_dtype: torch.dtype | None = torch.float32,
    **kwargs: Any,
) -> GymVecEnv:
    """``num_envs`` copies of ``gymnasium.make(gym_id, **kwargs)`` as a Podracer ``VecEnv``.

    ``kwargs`` go to ``gymnasium.make`` (``max_episode_steps=...`` and the env's own
    arguments). ``num_threads`` is for ``"threads"`` (default: ``env_threads()``).
    Unknown ids raise ``ConfigError`` listing close matches.
    """
    if not isinstance(num_envs, int) or num_envs < 1:
        raise ConfigError("num_envs", f"must be a positive integer, got {num_envs!r}")
    if vectorization not in VECTORIZATIONS:
        raise ConfigError("vectorization", f"unknown mode {vectorization!r}",
                          f"choose one of {', '.join(VECTORIZATIONS)}")
    spec = _find_spec(gym_id)
    if isinstance(spec.entry_point, str) and spec.entry_point.startswith("gymnasium.envs.mujoco"):
        route_mujoco_warnings()
    threads = num_threads if num_threads is not None else env_threads()
    if vectorization == "auto":
        vectorization = _auto(spec, min(threads, num_envs) > 1, kwargs)
    env_fn = functools.partial(gymnasium.make, gym_id, **kwargs)
    try:
        vector_env = _build(vectorization, env_fn, num_envs, threads)
    except (gymnasium.error.DependencyNotInstalled, ImportError) as exc:
        # a fault of this node (the simulator is not installed here), not of the name
        raise EnvUnavailable(f"gym_id: {gym_id} needs an extra dependency: {exc}; install "
                             "the extra it names, e.g. 'gymnasium[mujoco]'") from None
    except TypeError as exc:
        raise ConfigError("kwargs", f"{gym_id} rejected its arguments: {exc}",
                          "pass only arguments its constructor or gymnasium.make accepts") from None
    log.debug("gym env %s: %d copies, %s vectorization", gym_id, num_envs, vectorization)
    return GymVecEnv(vector_env, device, obs_dtype)


def env_threads() -> int:
    """Threads that step one env's copies: ``PODRACER_ENV_THREADS`` when set (``podracer
    train`` sets it for its pods: the node's CPUs shared among them,
    ``podracer.train.fit_to_machine``), else every CPU this process may use."""
    threads = whole_number(os.environ.get(ENV_THREADS_VAR), ENV_THREADS_VAR)
    return threads if threads is not None else len(os.sched_getaffinity(0))


KNOWN_MUJOCO_WARNINGS = ("compiler attribute 'settotalmass' is deprecated",)
"""MuJoCo warnings about Gymnasium's own model files: logged at debug, not printed."""


@functools.cache
def route_mujoco_warnings() -> None:
    """Send MuJoCo's warnings to the ``mujoco`` logger, once per process.

    MuJoCo prints them from C straight to the terminal, one per model compiled: dozens
    of ``settotalmass`` lines per run on Gymnasium's MuJoCo envs. The known ones go to
    debug; any other is logged as a warning, once per distinct text."""
    import mujoco  # only for MuJoCo envs

    mujoco_log = logging.getLogger("mujoco")
    seen: set[str] = set()

    def warn(message: str) -> None:
        if message in seen:
            return
        seen.add(message)
        known = any(message.startswith(k) for k in KNOWN_MUJOCO_WARNINGS)
        mujoco_log.log(logging.DEBUG if known else logging.WARNING, "%s", message)

    mujoco.set_mju_user_warning(warn)


def _auto(spec: gymnasium.envs.registration.EnvSpec, parallel: bool, kwargs: dict[str, Any]) -> str:
    """The fastest vectorization that keeps Gymnasium's rollout (see the module docs)."""
    entry = spec.entry_point if isinstance(spec.entry_point, str) else ""
    if entry in BATCHED_TASKS and kwargs.get("render_mode") is None:
        return "batched"
    if not parallel or not entry.startswith("gymnasium.envs.mujoco"):
        return "sync"
    return "threads"


def _build(mode: str, env_fn: Any, num_envs: int, threads: int) -> gymnasium.vector.VectorEnv:
    fns = [env_fn] * num_envs
    if mode == "batched":
        return MujocoBatchedVectorEnv(fns, num_threads=threads)
    if mode == "threads":
        return ThreadedVectorEnv(fns, num_threads=threads)
    if mode == "async":
        return gymnasium.vector.AsyncVectorEnv(
            fns, shared_memory=True, copy=False, autoreset_mode=GymAutoresetMode.SAME_STEP)
    return gymnasium.vector.SyncVectorEnv(
        fns, copy=False, autoreset_mode=GymAutoresetMode.SAME_STEP)


def _find_spec(gym_id: str) -> gymnasium.envs.registration.EnvSpec:
    """The registered spec of ``gym_id``, importing ``module:`` prefixes as Gymnasium does."""
    if ":" in gym_id:
        module, _, gym_id = gym_id.partition(":")
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ConfigError("gym_id", f"cannot import module {module!r}: {exc}",
                              "install the package that registers the env") from None
    try:
        return gymnasium.spec(gym_id)
    except gymnasium.error.Error:
        close = difflib.get_close_matches(gym_id, list(gymnasium.registry), n=5, cutoff=0.5)
        hint = f"close matches: {', '.join(close)}" if close else "see gymnasium.pprint_registry()"
        raise ConfigError("gym_id", f"unknown Gymnasium id {gym_id!r}", hint) from None


def _torch_obs_dtype(space: gymnasium.spaces.Space[Any], wanted: torch.dtype | None) -> torch.dtype:
    native = torch.from_numpy(np.zeros(0, dtype=space.dtype)).dtype
    if wanted is None or not native.is_floating_point:
        return native
    return wanted


def _retyped(space: gymnasium.spaces.Space[Any], dtype: torch.dtype) -> gymnasium.spaces.Space[Any]:
    """``space`` with the dtype the observations are handed out in."""
    np_dtype = torch.zeros(0, dtype=dtype).numpy().dtype
    if not isinstance(space, gymnasium.spaces.Box) or space.dtype == np_dtype:
        return space
    return gymnasium.spaces.Box(space.low.astype(np_dtype), space.high.astype(np_dtype),
                                shape=space.shape, dtype=np_dtype)


def _shape(space: gymnasium.spaces.Space[Any]) -> tuple[int, ...]:
    """The shape of one element of ``space`` (``()`` for Discrete)."""
    return tuple(space.shape or ())
