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
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agents import pod as pod_service
from broker.memory import MemoryBroker
from broker.service import ServiceContext
from broker.transport import connect, redact
from leaderboard import generator as generator_service
from leaderboard import updater as updater_service
from orchestrator import service as orchestrator_service
from orchestrator.embedded import TaskScaler
from podracer.monitor import Monitor
from podracer.report import write_report
from podracer.settings import Settings, write_experiment

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


async def _embedded(settings: Settings, monitor: Monitor) -> int:
    loop = asyncio.get_running_loop()
    hub = MemoryBroker()
    settings = dataclasses.replace(settings, memory=hub, broker="memory://")
    contexts = {role: ServiceContext(settings, role) for role in SERVICE_ROLES}
    scaler = TaskScaler(pod_service.main, lambda name: dataclasses.replace(settings, name=name),
                        loop)
    policy = orchestrator_service.default_policy(settings, min_pods=settings.experiment.pods)

    def on_signal() -> None:
        log.info("interrupted: stopping every service")
        for ctx in contexts.values():
            ctx.stop()

    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signum, on_signal)
    async with connect("memory://", experiment=settings.experiment.name,
                       memory=hub) as transport:
        watcher = asyncio.create_task(monitor.follow(transport))
        # the updater and generator subscribe before the orchestrator can stop them
        services = [asyncio.create_task(_guarded(updater_service.main(contexts["updater"]))),
                    asyncio.create_task(_guarded(generator_service.main(contexts["generator"])))]
        await asyncio.sleep(0.2)
        services.append(asyncio.create_task(_guarded(orchestrator_service.main(
            contexts["orchestrator"], scaler, policy=policy))))
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


def _service_env(settings: Settings, experiment_file: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "PODRACER_BROKER": settings.broker,
        "PODRACER_EXPERIMENT_FILE": str(experiment_file),
        "PODRACER_STORE": str(settings.store),
    })
    if settings.device:
        env["PODRACER_DEVICE"] = settings.device
    if settings.torch_threads:
        env["PODRACER_TORCH_THREADS"] = str(settings.torch_threads)
    return env


async def _processes(settings: Settings, monitor: Monitor, out: Path) -> int:
    experiment_file = write_experiment(settings.experiment, out / "experiment.json")
    env = _service_env(settings, experiment_file)
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    async with connect(settings.broker, experiment=settings.experiment.name) as transport:
        watcher = asyncio.create_task(monitor.follow(transport))
        for role in SERVICE_ROLES:
            argv = [sys.executable, "-m", "podracer", "serve", role]
            if role == "orchestrator":
                argv += ["--scaler", "local", "--min-pods", str(settings.experiment.pods),
                         "--log-dir", str(logs)]
            with (logs / f"{role}.log").open("ab") as fh:
                procs[role] = subprocess.Popen(argv, env=env, stdout=fh, stderr=subprocess.STDOUT)
            if role != "orchestrator":
                await asyncio.sleep(1.0)  # subscribed before anyone can publish control.stop
        log.info("services started (%s); logs in %s",
                 ", ".join(f"{r} pid {p.pid}" for r, p in procs.items()), logs)
        try:
            while any(p.poll() is None for p in procs.values()):
                await asyncio.sleep(0.5)
        except asyncio.CancelledError:
            for proc in procs.values():
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            raise
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
    codes = {role: proc.returncode for role, proc in procs.items()}
    for role, code in codes.items():
        if code != 0:
            log.error("%s exited with %s (see %s)", role, code, logs / f"{role}.log")
    return max(codes.values())


def train(settings: Settings, out: Path, *, progress: bool = True) -> TrainResult:
    """Run a tournament to its stop condition; write ``out`` (see the module doc)."""
    out.mkdir(parents=True, exist_ok=True)
    exp = settings.experiment
    # Pods sharing a CPU must not each spin a full-width OpenMP pool: oversubscribed,
    # small batched ops get orders of magnitude slower.
    threads = settings.torch_threads or max(1, (os.cpu_count() or 1) // exp.pods)
    settings = dataclasses.replace(settings, store=out, torch_threads=threads)
    print(f"podracer: training {', '.join(exp.algos)} on {exp.env} with {exp.pods} pods "
          f"({'embedded' if settings.broker.startswith('memory') else redact(settings.broker)})"
          f"; target {exp.target_score}; writing {out}", flush=True)
    monitor = Monitor(exp, out / "tb", echo=progress)
    started = time.monotonic()
    try:
        if settings.broker.startswith("memory"):
            code = asyncio.run(_embedded(settings, monitor))
        else:
            code = asyncio.run(_processes(settings, monitor, out))
    finally:
        monitor.close()
    seconds = time.monotonic() - started
    summary = write_report(out, started_wall=monitor.started_wall)
    result = TrainResult(code, summary.best_score, summary.checkpoints, seconds,
                         monitor.stop_reason)
    print(f"podracer: {'done' if code == 0 else 'FAILED'} in {seconds:.1f}s: "
          f"{result.checkpoints} checkpoints, best {result.best_score}, "
          f"stop: {result.stop_reason or 'n/a'}; curve {out / 'learning_curve.png'}",
          flush=True)
    return result
