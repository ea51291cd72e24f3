"""Scalers: real child processes (tiny python sleepers) and in-process pod tasks (Swarm:
``test_swarm_scaler``); every Scaler method is a coroutine."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from broker.core.errors import BrokerError, ConfigError
from broker.core.experiment import parse_experiment
from broker.core.settings import Settings
from broker.runtime.service import ServiceContext
from broker.transports.connect import connector
from broker.transports.memory import MemoryBroker
from orchestrator.embedded import TaskScaler
from orchestrator.policy import ScalingPolicy
from orchestrator.probes import FakeProbe, NodeLoad
from orchestrator.scalers import (
    LocalProcessScaler,
    NullScaler,
    Scaler,
    build_scaler,
)
from orchestrator.service import Orchestrator
from tests.processes import alive

SLEEPER = "import time; time.sleep(60)"
# Announces itself once its SIGTERM handler is in place, then ignores SIGTERM (saying
# "term" when one arrives: the test's readiness signal that it was ignored).
STUBBORN = ("import os, signal, time; "
            "signal.signal(signal.SIGTERM, lambda *_: print('term', flush=True)); "
            "print('ready', os.environ['PODRACER_POD'], flush=True); time.sleep(60)")


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


async def wait_until(check: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


def holds(check: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    """A plain condition for ``wait_until``."""
    async def poll() -> bool:
        return check()
    return poll


class Clock:
    """A hand-driven monotonic clock for backoff and grace deadlines."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def scalers() -> AsyncIterator[list[LocalProcessScaler]]:
    """Scalers made by a test; closed afterwards so no child outlives the test."""
    made: list[LocalProcessScaler] = []
    yield made
    for scaler in made:
        await scaler.close()


async def test_scale_up_and_down(scalers: list[LocalProcessScaler]) -> None:
    scaler = LocalProcessScaler(python(SLEEPER), grace=5.0)
    scalers.append(scaler)
    assert isinstance(scaler, Scaler)
    await scaler.scale_to(3)
    pids = scaler.pids()
    assert await scaler.current() == 3 and len(set(pids)) == 3 and all(alive(p) for p in pids)
    await scaler.scale_to(1)
    assert await scaler.current() == 1 and scaler.pids() == pids[:1]  # the newest go first

    async def stopped() -> bool:
        await scaler.reap()
        return scaler.stopping() == 0

    await wait_until(stopped)
    assert not alive(pids[1]) and not alive(pids[2]) and alive(pids[0])
    await scaler.close()
    assert not alive(pids[0]) and await scaler.current() == 0
    await scaler.close()  # idempotent


async def test_pods_get_names_and_env(tmp_path: Path,
                                      scalers: list[LocalProcessScaler]) -> None:
    code = "import os; print(os.environ['PODRACER_POD'], os.environ['EXTRA'], flush=True)"
    scaler = LocalProcessScaler(python(code + "; import time; time.sleep(60)"),
                                env={"EXTRA": "yes"}, name_prefix="pendulum", log_dir=tmp_path)
    scalers.append(scaler)
    await scaler.scale_to(2)
    logs = [tmp_path / "pendulum-1.log", tmp_path / "pendulum-2.log"]
    await wait_until(holds(lambda: all(p.exists() and p.read_text() for p in logs)))
    assert [p.read_text().split() for p in logs] == [["pendulum-1", "yes"], ["pendulum-2", "yes"]]


async def test_sigterm_then_sigkill_after_grace(tmp_path: Path,
                                                scalers: list[LocalProcessScaler]) -> None:
    clock = Clock()
    scaler = LocalProcessScaler(python(STUBBORN), grace=30.0, log_dir=tmp_path, clock=clock)
    scalers.append(scaler)
    await scaler.scale_to(1)
    await wait_until(holds(lambda: "ready" in (tmp_path / "pod-1.log").read_text()))
    pid = scaler.pids()[0]
    await scaler.scale_to(0)
    await wait_until(holds(lambda: "term" in (tmp_path / "pod-1.log").read_text()))
    await scaler.reap()
    assert alive(pid) and scaler.stopping() == 1  # SIGTERM ignored, grace not over yet
    clock.now += 31.0
    await scaler.reap()
    assert not alive(pid) and scaler.stopping() == 0


async def test_crashed_pods_restart_with_backoff(scalers: list[LocalProcessScaler]) -> None:
    clock = Clock()
    scaler = LocalProcessScaler(python("raise SystemExit(3)"), restart_backoff=2.0,
                                max_backoff=5.0, clock=clock)
    scalers.append(scaler)
    await scaler.scale_to(1)
    first = scaler.pids()[0]
    await wait_until(holds(lambda: not alive(first)))
    assert await scaler.reap() == 0  # crash noticed; restart waits 2 s
    assert await scaler.current() == 1 and scaler.pids() == []
    clock.now += 2.0
    assert await scaler.reap() == 1
    second = scaler.pids()[0]
    assert second != first
    await wait_until(holds(lambda: not alive(second)))
    await scaler.reap()  # second consecutive crash: 4 s
    clock.now += 3.9
    assert await scaler.reap() == 0
    clock.now += 0.1
    assert await scaler.reap() == 1


async def test_clean_exit_is_not_restarted(scalers: list[LocalProcessScaler]) -> None:
    scaler = LocalProcessScaler(python("pass"), restart_backoff=0.0)
    scalers.append(scaler)
    await scaler.scale_to(2)

    async def gone() -> bool:
        await scaler.reap()
        return await scaler.current() == 0

    await wait_until(gone)
    assert scaler.pids() == []


async def test_bad_commands_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="command"):
        LocalProcessScaler([])
    scaler = LocalProcessScaler(["/nonexistent/podracer", "serve", "pod"])
    with pytest.raises(ConfigError, match="cannot start '/nonexistent/podracer'"):
        await scaler.scale_to(1)
    assert await scaler.current() == 0  # the pod that could not start is not counted
    with pytest.raises(ConfigError, match="pods"):
        await scaler.scale_to(-1)


# -------------------------------------------------------------- in-process pods


def _settings(tmp_path: Path) -> Settings:
    experiment = parse_experiment({"name": "t", "env": "e", "algos": {"sac": 1},
                                   "round_budget": {"steps": 5}})
    return Settings(experiment=experiment, store=tmp_path)


async def test_task_scaler_restarts_failed_pods_and_stops_the_newest(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    started: list[str] = []
    ended: list[str] = []

    async def pod(ctx: ServiceContext[Settings]) -> int:
        started.append(ctx.name)
        if ctx.name == "pod-2":
            return 3  # a crash
        await ctx.stopping.wait()
        ended.append(ctx.name)
        return 0

    scaler = TaskScaler(pod, lambda name: settings, grace=5.0)
    assert isinstance(scaler, Scaler)
    try:
        await scaler.scale_to(3)
        assert await scaler.current() == 3
        await wait_until(holds(lambda: started == ["pod-1", "pod-2", "pod-3"]))

        async def crashed() -> bool:
            return await scaler.current() == 2  # pod-2 is done

        await wait_until(crashed)
        assert await scaler.reap() == 1 and scaler.restarts == 1
        assert await scaler.current() == 3
        await wait_until(holds(lambda: started[-1] == "pod-4"))
        await scaler.scale_to(1)  # the newest (pod-3, pod-4) are asked to stop
        assert await scaler.current() == 1
        await wait_until(holds(lambda: sorted(ended) == ["pod-3", "pod-4"]))
        assert await scaler.reap() == 0  # stopped on purpose: not restarted
        assert await scaler.current() == 1
    finally:
        await scaler.close()
    assert sorted(ended) == ["pod-1", "pod-3", "pod-4"] and await scaler.current() == 0
    await scaler.close()  # idempotent


async def test_task_scaler_close_cancels_pods_after_the_grace(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    cancelled: list[str] = []

    started: list[str] = []

    async def stubborn(ctx: ServiceContext[Settings]) -> int:
        started.append(ctx.name)
        try:
            await asyncio.sleep(60)  # ignores ctx.stopping
        except asyncio.CancelledError:
            cancelled.append(ctx.name)
            raise
        return 0

    scaler = TaskScaler(stubborn, lambda name: settings, grace=0.2)
    await scaler.scale_to(2)
    await wait_until(holds(lambda: len(started) == 2))  # the pods run
    begun = time.monotonic()
    await scaler.close()
    assert 0.18 <= time.monotonic() - begun < 5.0  # waited the grace, then cancelled
    await wait_until(holds(lambda: sorted(cancelled) == ["pod-1", "pod-2"]))


# ----------------------------------------------------------------- orchestrator


async def test_orchestrator_awaits_its_scaler_and_caches_the_count(tmp_path: Path) -> None:
    """``Orchestrator.pods`` (what its heartbeat reports) follows each poll and change."""
    settings = _settings(tmp_path)
    scaler = NullScaler()
    probe = FakeProbe([NodeLoad(node="n", cpu_percent=10.0, cpu_count=8, mem_percent=30.0)])
    policy = ScalingPolicy(min_pods=1, max_pods=6, cpu_per_pod=1.0, cpu_low=50.0,
                           cpu_high=85.0, up_polls=2, down_polls=2)
    connect = connector("memory://", MemoryBroker())
    async with connect(experiment=settings.experiment.name) as transport:
        orch = Orchestrator(ServiceContext(settings, "orchestrator"), transport, scaler,
                            probe, policy, poll_s=0.1)
        assert orch.pods == 0
        await orch.step(first=True)  # 10% of 8 cores: room for 4
        assert orch.pods == await scaler.current() == 4
        await scaler.scale_to(2)  # changed behind the orchestrator's back
        await orch.step(first=False)
        assert orch.pods == 2


# ---------------------------------------------------------------------- builder


async def test_null_scaler_only_remembers_the_target() -> None:
    scaler = NullScaler()
    assert isinstance(scaler, Scaler) and await scaler.current() == 0
    await scaler.scale_to(4)
    assert await scaler.current() == 4 and await scaler.reap() == 0
    with pytest.raises(ConfigError, match="pods"):
        await scaler.scale_to(-2)


async def test_build_scaler_local_passes_the_experiment_to_pods(tmp_path: Path) -> None:
    experiment = parse_experiment({"name": "t", "env": "Pendulum-v1", "algos": {"sac": 1},
                                   "round_budget": {"seconds": 5}, "pods": 2})
    settings = Settings(experiment=experiment, broker="amqp://u:p@broker:5672/",
                        store=tmp_path / "store", device="cpu", torch_threads=1)
    scaler = build_scaler(None, settings, log_dir=tmp_path / "logs", environ={})
    assert isinstance(scaler, LocalProcessScaler)
    assert scaler.command[1:] == ["-m", "podracer", "serve", "pod"]
    assert scaler.log_dir == tmp_path / "logs"
    assert scaler.env["PODRACER_BROKER"] == "amqp://u:p@broker:5672/"
    assert scaler.env["PODRACER_STORE"] == str(tmp_path / "store")
    assert (scaler.env["PODRACER_DEVICE"], scaler.env["PODRACER_TORCH_THREADS"]) == ("cpu", "1")
    written = Path(scaler.env["PODRACER_EXPERIMENT_FILE"])
    assert parse_experiment(json.loads(written.read_text())) == experiment
    assert await scaler.current() == 0  # nothing starts before scale_to


def test_build_scaler_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    experiment = parse_experiment({"name": "t", "env": "e", "algos": {"sac": 1},
                                   "round_budget": {"steps": 5}})
    settings = Settings(experiment=experiment, store=tmp_path)
    assert isinstance(build_scaler(None, settings, environ={"PODRACER_SCALER": "none"}),
                      NullScaler)
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    with pytest.raises(BrokerError, match="docker: podracer_pod-gpu"):
        build_scaler("swarm", settings, environ={"PODRACER_SWARM_SERVICE": "podracer_pod-gpu"})
    with pytest.raises(ConfigError, match="choose one of local, swarm, none"):
        build_scaler("k8s", settings)

