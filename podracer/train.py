"""``podracer train``: a whole tournament in one command.

* Embedded mode (``memory://``, the default): updater, generator, orchestrator and the
  pods run as asyncio tasks of this process on the in-process transport; nothing else
  needs to be installed.
* Broker mode (``--broker amqp://...``): the same services run as separate OS
  processes (``podracer serve <role>``) talking through RabbitMQ; the orchestrator
  starts the pods as processes of its own. This process only watches.

Either way ``runs/<experiment>/`` receives the leaderboard store (SQLite + blobs), the
resolved experiment, TensorBoard event files, a learning-curve PNG and (broker mode)
one log file per service.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from agents import pod as pod_service
from agents.base import AlgorithmRegistry
from agents.continuity import ReplayCache, default_cache_bytes
from agents.registry import default_registry
from broker.connect import Connector, connector
from broker.memory import MemoryBroker
from broker.schemas import Budget
from broker.service import ServiceContext
from broker.settings import Settings, settings_environment, write_experiment
from broker.supervise import ProcessGroup, supervised
from broker.transport import redact
from leaderboard import generator as generator_service
from leaderboard import updater as updater_service
from leaderboard.selection import SelectionRegistry, default_strategies
from orchestrator import service as orchestrator_service
from orchestrator.embedded import TaskScaler
from orchestrator.probes import machine_pods
from podracer.monitor import Monitor
from podracer.report import write_report

log = logging.getLogger(__name__)

SERVICE_ROLES = ("updater", "generator", "orchestrator")


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """How a training run ended."""

    exit_code: int
    best_score: float | None
    checkpoints: int
    seconds: float
    stop_reason: str | None


class _EmbeddedPods:
    """Pods of embedded mode: one replay cache for all; the first pod trains on a thread
    of this process, every other one in a worker process of its own (one Python process
    runs about one core's worth of an RL round, see ``agents.runner``)."""

    def __init__(self, registry: AlgorithmRegistry, connect: Connector) -> None:
        self.registry = registry
        self.connect = connect
        self.cache = ReplayCache(default_cache_bytes())
        self._thread_taken = False

    async def main(self, ctx: ServiceContext[Settings]) -> int:
        worker = "process" if self._thread_taken else "thread"
        self._thread_taken = True
        try:
            return await pod_service.main(ctx, registry=self.registry, connect=self.connect,
                                          worker=worker, cache=self.cache)
        finally:
            if worker == "thread":
                self._thread_taken = False


async def _embedded(settings: Settings, monitor: Monitor, registry: AlgorithmRegistry,
                    strategies: SelectionRegistry) -> int:
    loop = asyncio.get_running_loop()
    connect = connector("memory://", MemoryBroker())
    settings = dataclasses.replace(settings, broker="memory://")
    contexts = {role: ServiceContext(settings, role) for role in SERVICE_ROLES}
    pods = _EmbeddedPods(registry, connect)
    scaler = TaskScaler(pods.main, lambda name: dataclasses.replace(settings, name=name))
    policy = orchestrator_service.default_policy(settings, min_pods=settings.experiment.pods)

    def on_signal() -> None:
        log.info("interrupted: stopping every service")
        for ctx in contexts.values():
            ctx.stop()

    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signum, on_signal)
    async with connect(experiment=settings.experiment.name) as transport:
        watcher = asyncio.create_task(monitor.follow(transport))
        # the updater and generator subscribe before the orchestrator can stop them
        pods_done = asyncio.Event()
        # every service is restarted with backoff after a crash (broker.supervise)
        services = [asyncio.create_task(_guarded(supervised(functools.partial(
                        updater_service.main, registry=registry, connect=connect,
                        pods_done=pods_done))(contexts["updater"]))),
                    asyncio.create_task(_guarded(supervised(functools.partial(
                        generator_service.main, registry=registry, strategies=strategies,
                        connect=connect))(contexts["generator"])))]
        await asyncio.sleep(0.2)
        orchestrator = asyncio.create_task(_guarded(supervised(functools.partial(
            orchestrator_service.main, scaler=scaler, connect=connect, policy=policy,
            remind_for_s=0.0))(contexts["orchestrator"])))
        # the orchestrator returns once its scaler has stopped every pod (rounds published)
        orchestrator.add_done_callback(lambda _: pods_done.set())
        services.append(orchestrator)
        codes = await asyncio.gather(*services)
        await asyncio.sleep(0.3)  # let the last events reach the monitor
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
    for ctx in contexts.values():
        await ctx.close()
    return max(codes)


async def _guarded(coro: Any) -> int:
    try:
        code = await coro
        return 0 if code is None else int(code)
    except Exception as exc:
        log.error("service failed: %s: %s", type(exc).__name__, exc)
        log.debug("traceback", exc_info=True)
        return 1


def _budget_text(budget: Budget) -> str:
    parts = ([f"{budget.seconds:g} s"] if budget.seconds is not None else []) + (
        [f"{budget.steps} steps"] if budget.steps is not None else [])
    return " or ".join(parts)


async def _processes(settings: Settings, monitor: Monitor, out: Path) -> int:
    experiment_file = write_experiment(settings.experiment, out / "experiment.json")
    env = {**os.environ, **settings_environment(settings, experiment_file)}
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    group = ProcessGroup(env, logs)  # restarts a crashed service with backoff
    async with connector(settings.broker)(experiment=settings.experiment.name) as transport:
        watcher = asyncio.create_task(monitor.follow(transport))
        for role in SERVICE_ROLES:
            argv = [sys.executable, "-m", "podracer", "serve", role]
            if role == "orchestrator":
                argv += ["--scaler", "local", "--min-pods", str(settings.experiment.pods),
                         "--log-dir", str(logs)]
            group.start(role, argv)
            if role != "orchestrator":
                await asyncio.sleep(1.0)  # subscribed before anyone can publish control.stop
        log.info("services started (%s); logs in %s",
                 ", ".join(f"{r} pid {p.pid}" for r, p in group.procs.items()), logs)
        try:
            while group.running():
                group.poll()
                await asyncio.sleep(0.5)
        except asyncio.CancelledError:
            group.terminate()
            raise
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
    codes = group.codes
    for role, code in codes.items():
        if code != 0:
            log.error("%s exited with %s (see %s)", role, code, logs / f"{role}.log")
    return max(codes.values())


def fit_to_machine(settings: Settings) -> Settings:
    """``settings`` with the population and torch threads the machine decides: pods from
    ``machine_pods`` unless the experiment sets them, and one torch thread per pod
    unless ``--threads`` says otherwise.

    One thread, because a second one adds almost nothing to an RL round (see
    ``machine_pods``), and an OpenMP pool wider than the free cores spins: with another
    process busy, a 2-thread PPO pod on 2 cores ran 14x slower than a 1-thread one."""
    exp = settings.experiment
    if not exp.pods:
        exp = dataclasses.replace(exp, pods=machine_pods())
    return dataclasses.replace(settings, experiment=exp, torch_threads=settings.torch_threads or 1)


def train(settings: Settings, out: Path, *, progress: bool = True,
          registry: AlgorithmRegistry | None = None,
          strategies: SelectionRegistry | None = None) -> TrainResult:
    """Run a tournament to its stop condition; write ``out`` (see the module doc).

    ``registry`` and ``strategies`` are the algorithms and selection strategies of the
    embedded services (default: Podracer's own); broker mode's services build theirs."""
    out.mkdir(parents=True, exist_ok=True)
    settings = dataclasses.replace(fit_to_machine(settings), store=out)
    exp = settings.experiment
    print(f"podracer: training {', '.join(exp.algos)} on {exp.env} with {exp.pods} pods "
          f"({'embedded' if settings.broker.startswith('memory') else redact(settings.broker)})"
          f"; {settings.torch_threads} torch thread(s) per pod; rounds of "
          f"{_budget_text(exp.round_budget)}; target {exp.target_score}; writing {out}",
          flush=True)
    monitor = Monitor(exp, out / "tb", echo=progress)
    started = time.monotonic()
    try:
        if settings.broker.startswith("memory"):
            code = asyncio.run(_embedded(settings, monitor, registry or default_registry(),
                                         strategies or default_strategies()))
        else:
            code = asyncio.run(_processes(settings, monitor, out))
    finally:
        monitor.close()
    seconds = time.monotonic() - started
    summary = write_report(out, started_wall=monitor.started_wall, target=exp.target_score)
    result = TrainResult(code, summary.best_score, summary.checkpoints, seconds,
                         monitor.stop_reason)
    print(f"podracer: {'done' if code == 0 else 'FAILED'} in {seconds:.1f}s: "
          f"{result.checkpoints} checkpoints, best {result.best_score}, "
          f"stop: {result.stop_reason or 'n/a'}; charts {out / 'tournament.png'} and "
          f"{out / 'throughput.png'}",
          flush=True)
    return result
