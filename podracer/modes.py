"""Mode dispatch of ``podracer train``: where the services of a session run.

* Embedded mode (``memory://``, the default): updater, generator, orchestrator and the
  pods run as asyncio tasks of this process on the in-process transport; nothing else
  needs to be installed.
* Broker mode (``--broker amqp://...``): the same services run as separate OS
  processes (``podracer serve <role>``) talking through RabbitMQ; the orchestrator
  starts the pods as processes of its own. This process only watches.

Either way each service is bound through ``podracer.roles``. A clean end (broker
mode): on any stop the services obey ``control.stop`` (Ctrl-C sends it; a second
Ctrl-C terminates them), then this process purges waiting initializations and deletes
every queue of the experiment that is empty and unused; a checkpoint not yet stored or
a dead letter keeps its queue. An expiry policy lets the work queues of a run that was
killed outright go away after ``queue_expiry_s``.

Messages are authenticated (``broker.core.auth``): the embedded hub makes a secret of its
own; broker mode uses ``PODRACER_SECRET_FILE``/``PODRACER_SECRET`` if set, else makes
``<run>/secret`` (owner-only, kept for ``--resume``) and hands it to its services.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from agents.base import AlgorithmRegistry
from agents.pod.continuity import ReplayCache, default_cache_bytes
from agents.pod.pool import ExperiencePool, node_pool
from broker.core.auth import run_secret_env, secret_from_env
from broker.core.errors import BrokerError, ConfigError
from broker.core.schemas import Stop
from broker.core.settings import Settings, settings_environment, write_experiment
from broker.runtime.service import ServiceContext
from broker.runtime.supervise import ProcessGroup, supervised
from broker.transports.connect import connector
from broker.transports.memory import MemoryBroker
from envs.registry import env_maker
from leaderboard.selection import SelectionRegistry
from orchestrator.embedded import TaskScaler
from orchestrator.service import default_policy
from podracer.monitor import Monitor
from podracer.roles import Wiring, service
from podracer.run_dir import INTERRUPTED, SESSION_FILE

log = logging.getLogger(__name__)

SERVICE_ROLES = ("updater", "generator", "orchestrator")
"""The roles a session starts itself (the orchestrator starts the pods)."""
STOP_GRACE_S = 90.0
"""After an interruption, services get this long to publish their rounds and exit
before they are sent SIGTERM (and as long again before SIGKILL)."""
LISTEN_WAIT_S = 10.0
"""Longest wait of embedded mode for its updater and generator to hear ``control.stop``
before the orchestrator (which may publish it) starts (``listening``)."""
DEFAULT_QUEUE_EXPIRY_S = 24 * 3600.0
"""Work queues of a run nobody uses any more go away after this long (a day: time to
``--resume`` a killed run before its unstored checkpoints expire with its queue)."""


@dataclasses.dataclass
class Session:
    """What happened in this session, as the run loop learns it."""

    interrupted: bool = False


def embedded_wiring(registry: AlgorithmRegistry | None = None,
                    strategies: SelectionRegistry | None = None) -> Wiring:
    """What the services of an embedded session share: one in-process broker, and the
    algorithms and strategies (default: Podracer's own)."""
    return Wiring(connector("memory://", MemoryBroker()), registry=registry,
                  strategies=strategies)


def run_session(settings: Settings, monitor: Monitor, out: Path, session: Session,
                wiring: Wiring | None) -> int:
    """Run the session's services: embedded on ``wiring``, or as processes on
    ``settings.broker`` when there is none (then clean the broker up); their exit code."""
    if wiring is not None:
        return asyncio.run(_embedded(settings, monitor, wiring, session))
    code = asyncio.run(_processes(settings, monitor, out, session))
    clean_end(settings.broker, settings.experiment.name)
    return code


class _EmbeddedPods:
    """Pods of embedded mode: one replay cache for all; the first pod trains on a thread
    of this process, every other one in a worker process of its own (one Python process
    runs about one core's worth of an RL round, see ``agents.pod.runner``)."""

    def __init__(self, wiring: Wiring, pool: ExperiencePool | None = None) -> None:
        self.wiring = wiring
        self.cache = ReplayCache(default_cache_bytes())
        self.pool = pool
        """The experience pool every pod of this process and its workers share."""
        self._thread_taken = False

    async def main(self, ctx: ServiceContext[Settings]) -> int:
        worker = "process" if self._thread_taken else "thread"
        self._thread_taken = True
        try:
            code: int = await service("pod", self.wiring, worker=worker, cache=self.cache,
                                      pool=self.pool)(ctx)
            return code
        finally:
            if worker == "thread":
                self._thread_taken = False


async def _embedded(settings: Settings, monitor: Monitor, wiring: Wiring,
                    session: Session) -> int:
    loop = asyncio.get_running_loop()
    settings = dataclasses.replace(settings, broker="memory://")
    contexts = {role: ServiceContext(settings, role) for role in SERVICE_ROLES}
    exp = settings.experiment
    pods = _EmbeddedPods(wiring, await asyncio.to_thread(
        node_pool, exp.env, exp.experience_pool, exp.pool_mib, env_maker(exp.env_kwargs)))
    scaler = TaskScaler(pods.main, lambda name: dataclasses.replace(settings, name=name))
    policy = default_policy(settings, min_pods=settings.experiment.pods)

    def on_signal() -> None:
        log.info("interrupted: stopping every service")
        session.interrupted = True
        for ctx in contexts.values():
            ctx.stop()

    def start(role: str, **options: Any) -> asyncio.Task[int]:
        # every service is restarted with backoff after a crash (broker.runtime.supervise)
        main = supervised(service(role, wiring, **options))
        return asyncio.create_task(_guarded(main(contexts[role])))

    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # (podracer.api)
            loop.add_signal_handler(signum, on_signal)
    async with wiring.connect(experiment=settings.experiment.name) as transport:
        watcher = asyncio.create_task(monitor.follow(transport))
        # the updater and generator subscribe before the orchestrator can stop them
        pods_done = asyncio.Event()
        services = [start("updater", pods_done=pods_done), start("generator")]
        await listening([contexts["updater"], contexts["generator"]], services)
        orchestrator = start("orchestrator", scaler=scaler, policy=policy, remind_for_s=0.0)
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


async def listening(contexts: list[ServiceContext[Settings]], services: list[asyncio.Task[int]],
                    timeout_s: float = LISTEN_WAIT_S) -> bool:
    """Wait until every service of ``contexts`` hears ``control.stop``, one of
    ``services`` has ended (it failed: its supervisor or the run deals with it), or
    ``timeout_s``; whether all were listening. (A fixed 0.2 s sleep stood here: on
    Pendulum, 0.2 s of the 1.0 s before the first rounds, where a run takes 6-9 s.)"""
    heard = asyncio.gather(*(ctx.listening.wait() for ctx in contexts))
    try:
        ends: list[asyncio.Future[Any]] = [heard, *services]
        await asyncio.wait(ends, timeout=timeout_s,
                           return_when=asyncio.FIRST_COMPLETED)
    finally:
        heard.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await heard
    return all(ctx.listening.is_set() for ctx in contexts)


async def _guarded(coro: Any) -> int:
    try:
        code = await coro
        return 0 if code is None else int(code)
    except Exception as exc:
        log.error("service failed: %s: %s", type(exc).__name__, exc)
        log.debug("traceback", exc_info=True)
        return 1


async def _processes(settings: Settings, monitor: Monitor, out: Path,
                     session: Session) -> int:
    experiment_file = write_experiment(settings.experiment, out / SESSION_FILE)
    env = {**os.environ, **settings_environment(settings, experiment_file)}
    env.update(run_secret_env(out, env))  # every service of the run signs with it
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    group = ProcessGroup(env, logs)  # restarts a crashed service with backoff
    loop = asyncio.get_running_loop()
    signals: list[int] = []
    wake = asyncio.Event()

    def on_signal(signum: int) -> None:
        signals.append(signum)
        wake.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # (podracer.api)
            loop.add_signal_handler(signum, on_signal, signum)
    async with connector(settings.broker, secret=secret_from_env(env))(
            experiment=settings.experiment.name) as transport:
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
            await _supervise(group, transport, settings, session, signals, wake)
        except asyncio.CancelledError:
            group.terminate()
            raise
        finally:
            for signum in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(NotImplementedError):
                    loop.remove_signal_handler(signum)
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
    codes = group.codes
    for role, code in codes.items():
        if code != 0:
            log.error("%s exited with %s (see %s)", role, code, logs / f"{role}.log")
    return max(codes.values())


async def _supervise(group: ProcessGroup, transport: Any,
                     settings: Settings, session: Session, signals: list[int],
                     wake: asyncio.Event) -> None:
    """Wait for the services to exit. The first Ctrl-C (or SIGTERM) announces
    ``control.stop``: every service stops as at the end of a run (pods publish their
    shortened rounds, the updater stores them). Services still running after
    ``STOP_GRACE_S``, or at a second signal, get SIGTERM, and at a third SIGKILL."""
    escalated = 0
    deadline: float | None = None
    while group.running():
        group.poll()
        wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), 0.5)
        overdue = deadline is not None and time.monotonic() > deadline
        if len(signals) <= escalated and not overdue:
            continue
        step = max(len(signals), escalated + 1)
        if step == 1:
            session.interrupted = True
            print("podracer: interrupted; stopping the services (Ctrl-C again to "
                  "terminate them)", flush=True)
            try:
                await transport.publish_event("control.stop", Stop(
                    experiment=settings.experiment.name, reason=INTERRUPTED))
            except BrokerError as exc:
                log.warning("control.stop not sent (%s); terminating the services", exc)
                step = 2
        if step >= 2:
            sig = signal.SIGTERM if step == 2 else signal.SIGKILL
            group.stopping = True  # nothing is restarted from now on
            for proc in group.procs.values():
                if proc.poll() is None:
                    proc.send_signal(sig)
        escalated = step
        deadline = time.monotonic() + STOP_GRACE_S


def prepare_broker(url: str, experiment: str, resume: bool, expiry_s: float) -> None:
    """Before a broker-mode session: refuse to run beside a live session of the same
    experiment; for a fresh run, drop work left by an earlier one under this name (a
    resume keeps it: the updater stores the checkpoints, the generator re-issues the
    rounds); let the work queues expire once unused (``expiry_s``)."""
    from broker.runtime.lifecycle import BrokerAdmin, Management

    with BrokerAdmin(url, experiment) as admin:
        busy = admin.running()
        if busy is not None:
            raise ConfigError("--name", f"experiment {experiment!r} is running on this broker "
                              f"({busy.name} has {busy.consumers} consumer(s))",
                              "stop it first (podracer status), or use another --name")
        if not resume:
            for queue in ("generator", "updater"):
                dropped = admin.purge(queue)
                if dropped:
                    log.warning("dropped %d message(s) an earlier run of %s left in %s",
                                dropped, experiment, queue)
    try:
        Management.of(url).set_expiry(experiment, expiry_s)
    except BrokerError as exc:
        log.warning("queue expiry not set (%s): the queues of a killed run stay until "
                    "`podracer clean %s`", exc, experiment)


def clean_end(url: str, experiment: str) -> None:
    """After the services have exited: no initialization left waiting, and every queue
    that is empty and unused deleted (what holds a checkpoint or a dead letter stays)."""
    from broker.runtime.lifecycle import BrokerAdmin, Management

    try:
        with BrokerAdmin(url, experiment) as admin:
            dropped = admin.purge("generator")
            deleted = admin.delete_idle()
            left = admin.queues()
        if not left:  # nothing left to expire
            Management.of(url).clear_expiry(experiment)
    except BrokerError as exc:
        log.warning("queues of %s not cleaned up: %s (`podracer clean %s` does it)",
                    experiment, exc, experiment)
        return
    log.info("clean end: %d waiting initialization(s) dropped, %d queue(s) deleted",
             dropped, len(deleted))
    for queue in left:
        log.warning("%s keeps %d message(s)%s", queue.name, queue.messages,
                    " (dead letters: podracer dead-letters)" if queue.name.endswith(".dead")
                    else " not stored yet: resume the run to store them")
