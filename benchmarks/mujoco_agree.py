"""Whether two MuJoCo releases step the benchmark's tasks alike.

Run: ``python -m benchmarks.mujoco_agree [--steps 5000]``, once per MuJoCo release, e.g.
with an older one installed beside the project's (``pip install --no-deps --target
/tmp/mj mujoco==3.17.0``, then ``PYTHONPATH=/tmp/mj python -m benchmarks.mujoco_agree``).
Each task (Gymnasium's Hopper-v5 and HalfCheetah-v5, one copy) steps ``--steps`` actions
drawn from a seeded generator, resetting with a fixed seed at every episode's end, and
prints the MuJoCo version, the sum of the rewards, the episodes ended and the
observation after 20 steps: equal lines mean the release did not change what the
agents see. It asks the question a table left open (the tournament's Hopper runs fell
on a machine that had installed MuJoCo 4.0.0; see ``docs/concepts.md``).
"""

from __future__ import annotations

import argparse

import gymnasium
import mujoco
import numpy as np

TASKS = ("Hopper-v5", "HalfCheetah-v5")


def rollout(env_id: str, steps: int) -> tuple[float, int, np.ndarray]:
    """(reward sum, episodes ended, observation after 20 steps) of seeded random play."""
    env = gymnasium.make(env_id)
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    total, ends, early = 0.0, 0, np.zeros(0)
    for i in range(steps):
        obs, reward, terminated, truncated, _ = env.step(
            rng.uniform(-1.0, 1.0, env.action_space.shape))
        total += float(reward)
        if i == 20:
            early = np.asarray(obs).copy()
        if terminated or truncated:
            ends += 1
            env.reset(seed=i)
    env.close()
    return total, ends, early


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5000)
    args = parser.parse_args()
    for env_id in TASKS:
        total, ends, early = rollout(env_id, args.steps)
        print(f"mujoco {mujoco.__version__}  {env_id:15s} reward sum {total:.6f}  "
              f"episodes ended {ends}  obs after 20 steps {np.round(early[:4], 8)}")


if __name__ == "__main__":
    main()
