"""Podracer's whole tournament in one process: ``python examples/hello_world.py [DIR]``.

Updater, generator, orchestrator and two pods run as asyncio tasks and talk through
``memory://`` (in-process, with RabbitMQ's semantics). PPO and SAC train on torch
Pendulum until the leaderboard's best reaches -400, or 50 s pass. ``podracer train``
does the same (``podracer/train.py``), plus a live panel, charts, worker processes.
"""

import asyncio
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from agents.pod import service as pod
from agents.registry import default_registry
from broker.core.settings import Settings, default_experiment
from broker.runtime.service import ServiceContext
from broker.transports.connect import connector
from broker.transports.memory import MemoryBroker
from leaderboard import generator, updater
from leaderboard.selection import default_strategies
from leaderboard.store import LeaderboardStore
from orchestrator import service as orchestrator
from orchestrator.embedded import TaskScaler

TARGET = -400.0


async def tournament(store: Path) -> None:
    # 1. What to train and when to stop: an Experiment, wrapped in service Settings.
    experiment = default_experiment(
        "torch/Pendulum-v1", name="hello", algos={"ppo": 1, "sac": 1}, pods=2,
        target_score=TARGET, total_budget={"seconds": 50}, round_budget={"seconds": 10})
    settings = Settings(experiment, broker="memory://", store=store, torch_threads=1)

    # 2. Registries (algorithms, selection strategies) and one broker connection: built
    #    once where the program starts and handed to every service.
    registry, strategies = default_registry(), default_strategies()
    connect = connector("memory://", MemoryBroker())

    # 3. Pods: the orchestrator starts and stops them through a scaler; here they are
    #    asyncio tasks whose rounds run in threads (`worker="process"`: a process each).
    async def run_pod(ctx: ServiceContext[Settings]) -> int:
        return await pod.main(ctx, registry=registry, connect=connect, worker="thread")
    scaler = TaskScaler(run_pod, lambda name: replace(settings, name=name))

    # 4. The services. The updater ranks checkpoints into the store, the generator turns
    #    the leaderboard into new rounds; both subscribe before anyone can stop them.
    pods_done = asyncio.Event()
    tasks = [asyncio.create_task(updater.main(ServiceContext(settings, "updater"),
                                              registry=registry, connect=connect,
                                              pods_done=pods_done)),
             asyncio.create_task(generator.main(ServiceContext(settings, "generator"),
                                                registry=registry, strategies=strategies,
                                                connect=connect))]
    await asyncio.sleep(0.2)
    # The orchestrator scales the pods and publishes control.stop at the target or the
    # budget; every service then drains and returns 0.
    boss = asyncio.create_task(orchestrator.main(
        ServiceContext(settings, "orchestrator"), scaler, connect=connect, remind_for_s=0.0,
        policy=orchestrator.default_policy(settings, min_pods=experiment.pods)))
    boss.add_done_callback(lambda _: pods_done.set())  # once its pods have returned
    print("exit codes (updater, generator, orchestrator):", await asyncio.gather(*tasks, boss))


def main() -> None:
    store = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp())
    asyncio.run(tournament(store))
    # 5. The leaderboard: every checkpoint is in SQLite, the top-K is a query.
    with LeaderboardStore(store) as board:
        for rank, e in enumerate(board.top(5), 1):
            print(f"{rank}. {e.algorithm:4} {e.score_mean:9.1f}  gen {e.generation}  "
                  f"{e.env_steps:>8} env steps  {e.id[:8]} <- {(e.parent_id or '-')[:8]}")
        best = board.best()
    reached = best is not None and best.score_mean >= TARGET
    print(f"best {best.score_mean if best else None}: target {TARGET} "
          f"{'reached' if reached else 'NOT reached'} (store: {store})")
    sys.exit(0 if reached else 1)


if __name__ == "__main__":
    main()
