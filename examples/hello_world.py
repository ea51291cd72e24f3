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

from broker.core.settings import Settings, default_experiment
from broker.runtime.service import ServiceContext
from broker.transports.connect import connector
from broker.transports.memory import MemoryBroker
from leaderboard.store import LeaderboardStore
from orchestrator.embedded import TaskScaler
from orchestrator.service import default_policy
from podracer.roles import Wiring, service

TARGET = -400.0


async def tournament(store: Path) -> None:
    # 1. What to train and when to stop: an Experiment, wrapped in service Settings.
    experiment = default_experiment(
        "torch/Pendulum-v1", name="hello", algos={"ppo": 1, "sac": 1}, pods=2,
        target_score=TARGET, total_budget={"seconds": 50}, round_budget={"seconds": 10})
    settings = Settings(experiment, broker="memory://", store=store, torch_threads=1)

    # 2. What services share, built once where the program starts: one broker connection
    #    and (made on first use) the algorithm and selection-strategy registries. Which
    #    service takes what is one table, podracer.roles.
    wiring = Wiring(connector("memory://", MemoryBroker()))

    # 3. Pods: the orchestrator starts and stops them through a scaler; here they are
    #    asyncio tasks whose rounds run in threads (`worker="process"`: a process each).
    run_pod = service("pod", wiring, worker="thread")
    scaler = TaskScaler(run_pod, lambda name: replace(settings, name=name))

    # 4. The services. The updater ranks checkpoints into the store, the generator turns
    #    the leaderboard into new rounds; both subscribe before anyone can stop them.
    pods_done = asyncio.Event()
    tasks = [asyncio.create_task(service("updater", wiring, pods_done=pods_done)(
                 ServiceContext(settings, "updater"))),
             asyncio.create_task(service("generator", wiring)(
                 ServiceContext(settings, "generator")))]
    await asyncio.sleep(0.2)
    # The orchestrator scales the pods and publishes control.stop at the target or the
    # budget; every service then drains and returns 0.
    boss = asyncio.create_task(service(
        "orchestrator", wiring, scaler=scaler, remind_for_s=0.0,
        policy=default_policy(settings, min_pods=experiment.pods),
    )(ServiceContext(settings, "orchestrator")))
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
