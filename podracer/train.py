"""``podracer train``: a whole tournament in one command.

* Embedded mode (``memory://``, the default): updater, generator, orchestrator and the
  pods run as asyncio tasks of this process on the in-process transport; nothing else
  needs to be installed.
* Broker mode (``--broker amqp://...``): the same services run as separate OS
  processes (``podracer serve <role>``) talking through RabbitMQ; the orchestrator
  starts the pods as processes of its own. This process only watches.

Either way ``runs/<experiment>/`` receives the leaderboard store (SQLite + blobs), the
resolved experiment (``experiment.json``), ``run.json`` (one record per session: when it
started and ended, and how), TensorBoard event files, the charts and the logs.

An experiment's life (``docs/tutorials/lifecycle.md``):

* **Resume** (``resume=True``, ``podracer train --resume runs/<exp>``) carries on from
  the store: the planner derives lineages and generations from it; the time budget
  left is the asked one minus ``leaderboard.store.spent`` (the env-step budget and the
  target are checked against the store's totals and best anyway); the progress view,
  TensorBoard and the charts continue on the first session's time axis. A round that
  was waiting or in flight when the run died is re-issued (the generator purges what
  it did not issue itself); a checkpoint a pod had published but the updater had not
  stored is stored now. Replay rows (``agents.pod.continuity.ReplayCache``) lived in the
  dead processes: a resumed lineage continues from its stored weights, optimizer state
  and hyperparameters with an empty replay buffer (unless ``checkpoint_replay``).
* **Clean end** (broker mode): on any stop the services obey ``control.stop`` (Ctrl-C
  sends it; a second Ctrl-C terminates them), then this process purges waiting
  initializations and deletes every queue of the experiment that is empty and unused;
  a checkpoint not yet stored or a dead letter keeps its queue. An expiry policy lets
  the work queues of a run that was killed outright go away after ``queue_expiry_s``.

Messages are authenticated (``broker.core.auth``): the embedded hub makes a secret of its
own; broker mode uses ``PODRACER_SECRET_FILE``/``PODRACER_SECRET`` if set, else makes
``<run>/secret`` (owner-only, kept for ``--resume``) and hands it to its services.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from agents.base import AlgorithmRegistry
from agents.pod import service as pod_service
from agents.pod.continuity import ReplayCache, default_cache_bytes
from agents.registry import default_registry
from broker.core.auth import run_secret_env, secret_from_env
from broker.core.errors import BrokerError, ConfigError
from broker.core.experiment import Experiment, TotalBudget
from broker.core.schemas import Budget, Stop
from broker.core.settings import Settings, settings_environment, write_experiment
from broker.runtime.service import ServiceContext
from broker.runtime.supervise import ProcessGroup, supervised
from broker.transports.base import redact
from broker.transports.connect import Connector, connector
from broker.transports.memory import MemoryBroker
from leaderboard import generator as generator_service
from leaderboard import updater as updater_service
from leaderboard.selection import SelectionRegistry, default_strategies
from leaderboard.store import DB_NAME, LeaderboardStore, Spent, spent
from orchestrator import service as orchestrator_service
from orchestrator.embedded import TaskScaler
from orchestrator.policy import StopCondition
from orchestrator.probes import machine_pods
from podracer.monitor import Monitor
from podracer.report import write_report

log = logging.getLogger(__name__)

SERVICE_ROLES = ("updater", "generator", "orchestrator")
RUN_FILE = "run.json"
"""One record per session of a run: started, ended, state, stop reason."""
EXPERIMENT_FILE = "experiment.json"
"""The experiment as asked (``--resume`` reads it back)."""
SESSION_FILE = "session.json"
"""The experiment this session's services run: the asked one with the time left."""
INTERRUPTED = "interrupted by the user"
"""``Stop.reason`` when Ctrl-C (SIGINT) or SIGTERM ends a run."""
STOP_GRACE_S = 90.0
"""After an interruption, services get this long to publish their rounds and exit
before they are sent SIGTERM (and as long again before SIGKILL)."""
DEFAULT_QUEUE_EXPIRY_S = 24 * 3600.0
"""Work queues of a run nobody uses any more go away after this long (a day: time to
``--resume`` a killed run before its unstored checkpoints expire with its queue)."""


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """How a training run ended."""

    exit_code: int
    best_score: float | None
    checkpoints: int
    seconds: float
    stop_reason: str | None


@dataclasses.dataclass
class _Session:
    """What happened in this session, as the run loop learns it."""

    interrupted: bool = False


def has_run(out: Path) -> bool:
    """Whether ``out`` already holds a run (a store with checkpoints, or a session)."""
    if (out / RUN_FILE).is_file():
        return True
    if not (out / DB_NAME).is_file():
        return False
    with LeaderboardStore(out, create=False) as store:
        return store.count() > 0


def read_sessions(out: Path) -> list[dict[str, Any]]:
    """The session records of the run in ``out`` (``[]`` if it has none or they are
    unreadable)."""
    try:
        data = json.loads((out / RUN_FILE).read_text())
    except (OSError, ValueError):
        return []
    sessions = data.get("sessions") if isinstance(data, dict) else None
    return [s for s in sessions if isinstance(s, dict)] if isinstance(sessions, list) else []


def _write_sessions(out: Path, sessions: list[dict[str, Any]]) -> None:
    tmp = out / f".{RUN_FILE}.tmp"
    tmp.write_text(json.dumps({"sessions": sessions}, indent=2))
    os.replace(tmp, out / RUN_FILE)


def already_done(experiment: Experiment, done: Spent) -> str | None:
    """Why a run that has spent ``done`` is over already (None: it can go on)."""
    return StopCondition.from_experiment(experiment).check(
        done.best.score_mean if done.best else None, done.seconds, done.env_steps)


def time_left(experiment: Experiment, done: Spent) -> Experiment:
    """``experiment`` with the time budget reduced by what ``done`` spent (the env-step
    budget and the target are checked against the store's totals anyway)."""
    total = experiment.total_budget
    if total.seconds is None:
        return experiment
    left = TotalBudget(seconds=max(1.0, total.seconds - done.seconds), env_steps=total.env_steps)
    return dataclasses.replace(experiment, total_budget=left)


class _EmbeddedPods:
    """Pods of embedded mode: one replay cache for all; the first pod trains on a thread
    of this process, every other one in a worker process of its own (one Python process
    runs about one core's worth of an RL round, see ``agents.pod.runner``)."""

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
                    strategies: SelectionRegistry, session: _Session) -> int:
    loop = asyncio.get_running_loop()
    connect = connector("memory://", MemoryBroker())
    settings = dataclasses.replace(settings, broker="memory://")
    contexts = {role: ServiceContext(settings, role) for role in SERVICE_ROLES}
    pods = _EmbeddedPods(registry, connect)
    scaler = TaskScaler(pods.main, lambda name: dataclasses.replace(settings, name=name))
    policy = orchestrator_service.default_policy(settings, min_pods=settings.experiment.pods)

    def on_signal() -> None:
        log.info("interrupted: stopping every service")
        session.interrupted = True
        for ctx in contexts.values():
            ctx.stop()

    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signum, on_signal)
    async with connect(experiment=settings.experiment.name) as transport:
        watcher = asyncio.create_task(monitor.follow(transport))
        # the updater and generator subscribe before the orchestrator can stop them
        pods_done = asyncio.Event()
        # every service is restarted with backoff after a crash (broker.runtime.supervise)
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


async def _processes(settings: Settings, monitor: Monitor, out: Path,
                     session: _Session) -> int:
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
        with contextlib.suppress(NotImplementedError):
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
                     settings: Settings, session: _Session, signals: list[int],
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
          strategies: SelectionRegistry | None = None, resume: bool = False,
          queue_expiry_s: float = DEFAULT_QUEUE_EXPIRY_S) -> TrainResult:
    """Run a tournament to its stop condition; write ``out`` (see the module doc).

    ``resume`` carries on the run in ``out``; without it, ``out`` must not hold a run
    yet (``ConfigError`` naming ``--resume`` and ``--fresh``). ``registry`` and
    ``strategies`` are the algorithms and selection strategies of the embedded
    services (default: Podracer's own); broker mode's services build theirs."""
    if resume and not (out / EXPERIMENT_FILE).is_file():
        raise ConfigError("--resume", f"{out} holds no run to resume",
                          "point it at the run directory of an earlier `podracer train` "
                          "(runs/<experiment>)")
    if not resume and has_run(out):
        raise ConfigError("--out", f"{out} already holds a run",
                          f"continue it with `podracer train --resume {out}`, or start "
                          "over with --fresh (deletes it)")
    out.mkdir(parents=True, exist_ok=True)
    settings = dataclasses.replace(fit_to_machine(settings), store=out)
    exp = settings.experiment
    embedded = settings.broker.startswith("memory")
    done = _spent(out) if resume else None
    if done is not None:
        finished = already_done(exp, done)
        if finished is not None:
            print(f"podracer: {out} is finished already ({finished}); nothing to resume. "
                  "Give a larger --budget or --target-score to go on.", flush=True)
            best = done.best.score_mean if done.best else None
            return TrainResult(0, best, done.checkpoints, 0.0, finished)
        print(f"podracer: resuming {exp.name}: {done.checkpoints} checkpoints, generation "
              f"{done.generation}, best {done.best.score_mean if done.best else None}, "
              f"{done.seconds:.0f} s and {done.env_steps} env steps spent", flush=True)
    write_experiment(exp, out / EXPERIMENT_FILE)
    if not embedded:
        _prepare_broker(settings.broker, exp.name, resume, queue_expiry_s)
    session_settings = dataclasses.replace(
        settings, experiment=time_left(exp, done) if done is not None else exp)
    print(f"podracer: training {', '.join(exp.algos)} on {exp.env} with {exp.pods} pods "
          f"({'embedded' if embedded else redact(settings.broker)})"
          f"; {settings.torch_threads} torch thread(s) per pod; rounds of "
          f"{_budget_text(exp.round_budget)}; target {exp.target_score}; writing {out}",
          flush=True)
    sessions = read_sessions(out)
    record: dict[str, Any] = {"started": time.time(), "host": socket.gethostname(),
                              "pid": os.getpid(),
                              "broker": "embedded" if embedded else redact(settings.broker)}
    _write_sessions(out, [*sessions, record])
    monitor = Monitor(exp, out / "tb", echo=progress)
    if done is not None:  # one time axis and the stored best, from the first session on
        monitor.started -= done.seconds
        monitor.best_score = done.best.score_mean if done.best else None
        monitor.checkpoints, monitor.total_env_steps = done.checkpoints, done.env_steps
    session = _Session()
    started = time.monotonic()
    code = 1
    try:
        if embedded:
            code = asyncio.run(_embedded(session_settings, monitor,
                                         registry or default_registry(),
                                         strategies or default_strategies(), session))
        else:
            code = asyncio.run(_processes(session_settings, monitor, out, session))
            _clean_end(settings.broker, exp.name)
    finally:
        monitor.close()
        state = ("interrupted" if session.interrupted or monitor.stop_reason in (None,
                                                                                INTERRUPTED)
                 else "finished" if code == 0 else "failed")
        record.update(ended=time.time(), state=state, stop=monitor.stop_reason,
                      exit_code=code)
        _write_sessions(out, [*sessions, record])
    seconds = time.monotonic() - started
    first = sessions[0].get("started") if sessions else None
    zero = float(first) if isinstance(first, int | float) else monitor.started_wall
    summary = write_report(out, started_wall=zero, target=exp.target_score)
    result = TrainResult(code, summary.best_score, summary.checkpoints, seconds,
                         monitor.stop_reason)
    print(f"podracer: {'done' if code == 0 else 'FAILED'} in {seconds:.1f}s: "
          f"{result.checkpoints} checkpoints, best {result.best_score}, "
          f"stop: {result.stop_reason or 'n/a'}; charts {out / 'tournament.png'} and "
          f"{out / 'throughput.png'}"
          + (f"; go on with `podracer train --resume {out}`" if state == "interrupted" else ""),
          flush=True)
    return result


def _spent(out: Path) -> Spent:
    with LeaderboardStore(out) as store:
        return spent(store)


def _prepare_broker(url: str, experiment: str, resume: bool, expiry_s: float) -> None:
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


def _clean_end(url: str, experiment: str) -> None:
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
        log.warning("%s keeps %d message(s)%s", queue.name, queue.ready,
                    " (dead letters: podracer dead-letters)" if queue.name.endswith(".dead")
                    else " not stored yet: resume the run to store them")
