"""Env-steps per second, Podracer envs side by side with Gymnasium's ``SyncVectorEnv``.

Run: ``python benchmarks/envs.py [--seconds 0.5] [--repeats 3]``. Prints one table:

* torch Pendulum (``envs.registry.make_env("torch/Pendulum-v1", N)``) at N in
  {1, 64, 1024, 16384} against ``gymnasium.vector.SyncVectorEnv`` of ``Pendulum-v1`` at
  N in {1, 64, 1024} (stopped there: Sync's cost per copy is flat from 64 copies on, so
  16384 Python copies would only lengthen the run);
* MuJoCo ``Ant-v5`` at 16 copies, ``HalfCheetah-v5`` and ``Hopper-v5`` at 64 (a SAC
  pod's copies) through ``envs.gym_adapter.make`` with the backend it picks (``"auto"``,
  on every CPU and on one thread, as a pod beside another gets it) and with the others,
  against a raw ``SyncVectorEnv`` of as many copies, plus envpool's ``Ant-v5`` when
  envpool is installed (measured, not used: see gym_adapter).

Each figure is the best of ``--repeats`` timed windows of about ``--seconds`` each, and
the windows of the contenders in one comparison alternate (the machine is shared: the
best window is the least disturbed one, and a burst of load hits every contender
alike). Actions are drawn once, before timing. Podracer rows include the torch <-> numpy
edge; Gymnasium and envpool rows are raw numpy. Targets on a 2-core CPU: torch Pendulum
N=16384 >= 50M steps/s and >= 100x Sync at N=1024; Ant >= 2x Sync(16).
HalfCheetah and Hopper have no target: their rows say what the batched backend
gives a pod (their Python step terms were most of a step).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import gymnasium
import numpy as np
import torch

Stepper = Callable[[int], object]


def race(steppers: dict[str, Stepper], num_envs: int, seconds: float,
         repeats: int) -> dict[str, float]:
    """Best env-steps/s of each stepper; windows alternate between them so that a burst
    of load from other processes hits every contender alike. ``step(k)`` runs step k."""
    for step in steppers.values():
        step(0)  # warm up (first-call allocations, thread start-up)
    best = dict.fromkeys(steppers, 0.0)
    k = 1
    for _ in range(repeats):
        for label, step in steppers.items():
            steps, start = 0, time.perf_counter()
            while True:
                step(k)
                k += 1
                steps += 1
                elapsed = time.perf_counter() - start
                if elapsed >= seconds and steps >= 3:
                    break
            best[label] = max(best[label], steps * num_envs / elapsed)
    return best


def podracer_stepper(env: Any, actions: torch.Tensor) -> Stepper:
    """Step a Podracer ``VecEnv`` with pre-drawn actions, cycling through them."""
    env.reset(seed=0)
    return lambda k: env.step(actions[k % len(actions)])


def gym_sync_stepper(gym_id: str, num_envs: int, actions: np.ndarray) -> tuple[Stepper, Any]:
    """A raw ``SyncVectorEnv`` (SAME_STEP, numpy) with pre-drawn actions."""
    env = gymnasium.vector.SyncVectorEnv(
        [functools.partial(gymnasium.make, gym_id)] * num_envs,
        autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP)
    env.reset(seed=0)
    return (lambda k: env.step(actions[k % len(actions)])), env


def pendulum_rows(seconds: float, repeats: int) -> list[tuple[str, int, float, float | None]]:
    """(label, N, podracer steps/s, Sync steps/s or None)."""
    from envs.registry import make_env

    rows: list[tuple[str, int, float, float | None]] = []
    for num_envs in (1, 64, 1024, 16384):
        actions = torch.rand(8, num_envs, 1) * 4 - 2
        env = make_env("torch/Pendulum-v1", num_envs)
        steppers = {"torch": podracer_stepper(env, actions)}
        sync = None
        if num_envs <= 1024:
            steppers["sync"], sync = gym_sync_stepper("Pendulum-v1", num_envs, actions.numpy())
        rates = race(steppers, num_envs, seconds, repeats)
        rows.append(("Pendulum-v1 torch vs Sync", num_envs, rates["torch"], rates.get("sync")))
        env.close()
        if sync is not None:
            sync.close()
    return rows


def mujoco_rows(task: str, num_envs: int, seconds: float,
                repeats: int) -> list[tuple[str, int, float, float | None]]:
    """``task`` at ``num_envs`` copies: the chosen backend (on every CPU, and on one thread
    as a pod beside another gets it), the others, envpool (Ant), raw Sync."""
    from envs.gym_adapter import make as make_gym

    space = gymnasium.make(task).action_space
    act_dim = space.shape[0] if space.shape else 1
    actions_np = np.random.default_rng(0).uniform(
        -1, 1, (64, num_envs, act_dim)).astype(np.float32)
    actions = torch.from_numpy(actions_np)
    steppers: dict[str, Stepper] = {}
    steppers["sync"], sync = gym_sync_stepper(task, num_envs, actions_np)
    closers: list[Any] = [sync]
    for mode, threads in (("auto", None), ("auto", 1), ("threads", None), ("sync", None)):
        env = make_gym(task, num_envs, vectorization=mode, num_threads=threads)
        on = "" if threads is None else f", {threads} thread"
        label = f"{task} {mode}{on}: {type(env.vector_env).__name__.removesuffix('VectorEnv')}"
        steppers[label] = podracer_stepper(env, actions)
        closers.append(env)
    if task == "Ant-v5":
        try:
            import envpool
        except ImportError:
            pass
        else:
            pool = envpool.make_gymnasium("Ant-v5", num_envs=num_envs, seed=0,
                                          num_threads=min(num_envs, os.cpu_count() or 1))
            pool.reset()
            steppers["Ant-v5 envpool (numpy, not chosen)"] = lambda k: pool.step(
                actions_np[k % 64])
            closers.append(pool)
    rates = race(steppers, num_envs, seconds, repeats)
    for closer in closers:
        closer.close()
    baseline = rates.pop("sync")
    return [(label, num_envs, rate, baseline) for label, rate in rates.items()]


def main() -> None:
    """Run both groups and print the table."""
    # Run as a script, this folder heads sys.path and this file's name would shadow the
    # ``envs`` package; the project root goes first instead.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [os.path.dirname(here)] + [p for p in sys.path if os.path.abspath(p) != here]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.5, help="length of one timed window")
    parser.add_argument("--repeats", type=int, default=3, help="timed windows per figure")
    parser.add_argument("--torch-threads", type=int, default=1,
                        help="torch intra-op threads (on a busy machine more than 1 stalls)")
    args = parser.parse_args()
    # On a shared 2-core machine torch's intra-op pool waits on a busy core: torch.sin of
    # 16384 floats took 3.3 ms with 2 threads against 0.008 ms with 1 (load 9).
    torch.set_num_threads(args.torch_threads)
    print(f"cpus={os.cpu_count()} torch_threads={torch.get_num_threads()} "
          f"load_before={os.getloadavg()[0]:.2f}")
    rows = pendulum_rows(args.seconds, args.repeats)
    rows += mujoco_rows("Ant-v5", 16, args.seconds, args.repeats)
    for task in ("HalfCheetah-v5", "Hopper-v5"):  # at the copies SAC's pods step
        rows += mujoco_rows(task, 64, args.seconds, args.repeats)
    print(f"{'benchmark':46} {'N':>6} {'podracer steps/s':>17} {'Sync steps/s':>13} {'ratio':>8}")
    for label, num_envs, ours, theirs in rows:
        sync = f"{theirs:13,.0f}" if theirs else f"{'n/a':>13}"
        ratio = f"{ours / theirs:7.2f}x" if theirs else f"{'':>8}"
        print(f"{label:46} {num_envs:6d} {ours:17,.0f} {sync} {ratio}")
    print(f"load_after={os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
