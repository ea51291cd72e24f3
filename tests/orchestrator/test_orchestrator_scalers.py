"""Scalers: real child processes (tiny python sleepers) and Swarm at its SDK boundary."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import docker.errors
import pytest

from broker.errors import BrokerError, ConfigError
from broker.experiment import parse_experiment
from broker.settings import Settings
from orchestrator.scalers import (
    LocalProcessScaler,
    NullScaler,
    Scaler,
    SwarmScaler,
    build_scaler,
)

SLEEPER = "import time; time.sleep(60)"
# Announces itself once its SIGTERM handler is in place, then ignores SIGTERM.
STUBBORN = ("import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', os.environ['PODRACER_POD'], flush=True); time.sleep(60)")


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def wait_until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purpose.
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().split(")")[-1].split()[0] != "Z"


class Clock:
    """A hand-driven monotonic clock for backoff and grace deadlines."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def scalers() -> Iterator[list[LocalProcessScaler]]:
    """Scalers made by a test; closed afterwards so no child outlives the test."""
    made: list[LocalProcessScaler] = []
    yield made
    for scaler in made:
        scaler.close()


def test_scale_up_and_down(scalers: list[LocalProcessScaler]) -> None:
    scaler = LocalProcessScaler(python(SLEEPER), grace=5.0)
    scalers.append(scaler)
    assert isinstance(scaler, Scaler)
    scaler.scale_to(3)
    pids = scaler.pids()
    assert scaler.current() == 3 and len(set(pids)) == 3 and all(alive(p) for p in pids)
    scaler.scale_to(1)
    assert scaler.current() == 1 and scaler.pids() == pids[:1]  # the newest go first
    wait_until(lambda: (scaler.reap(), scaler.stopping())[1] == 0)
    assert not alive(pids[1]) and not alive(pids[2]) and alive(pids[0])
    scaler.close()
    assert not alive(pids[0]) and scaler.current() == 0
    scaler.close()  # idempotent


def test_pods_get_names_and_env(tmp_path: Path, scalers: list[LocalProcessScaler]) -> None:
    code = "import os; print(os.environ['PODRACER_POD'], os.environ['EXTRA'], flush=True)"
    scaler = LocalProcessScaler(python(code + "; import time; time.sleep(60)"),
                                env={"EXTRA": "yes"}, name_prefix="pendulum", log_dir=tmp_path)
    scalers.append(scaler)
    scaler.scale_to(2)
    logs = [tmp_path / "pendulum-1.log", tmp_path / "pendulum-2.log"]
    wait_until(lambda: all(p.exists() and p.read_text() for p in logs))
    assert [p.read_text().split() for p in logs] == [["pendulum-1", "yes"], ["pendulum-2", "yes"]]


def test_sigterm_then_sigkill_after_grace(tmp_path: Path,
                                          scalers: list[LocalProcessScaler]) -> None:
    clock = Clock()
    scaler = LocalProcessScaler(python(STUBBORN), grace=30.0, log_dir=tmp_path, clock=clock)
    scalers.append(scaler)
    scaler.scale_to(1)
    wait_until(lambda: "ready" in (tmp_path / "pod-1.log").read_text())
    pid = scaler.pids()[0]
    scaler.scale_to(0)
    time.sleep(0.3)
    scaler.reap()
    assert alive(pid) and scaler.stopping() == 1  # SIGTERM ignored, grace not over yet
    clock.now += 31.0
    scaler.reap()
    assert not alive(pid) and scaler.stopping() == 0


def test_crashed_pods_restart_with_backoff(scalers: list[LocalProcessScaler]) -> None:
    clock = Clock()
    scaler = LocalProcessScaler(python("raise SystemExit(3)"), restart_backoff=2.0,
                                max_backoff=5.0, clock=clock)
    scalers.append(scaler)
    scaler.scale_to(1)
    first = scaler.pids()[0]
    wait_until(lambda: not alive(first))
    assert scaler.reap() == 0  # crash noticed; restart waits 2 s
    assert scaler.current() == 1 and scaler.pids() == []
    clock.now += 2.0
    assert scaler.reap() == 1
    second = scaler.pids()[0]
    assert second != first
    wait_until(lambda: not alive(second))
    scaler.reap()  # second consecutive crash: 4 s
    clock.now += 3.9
    assert scaler.reap() == 0
    clock.now += 0.1
    assert scaler.reap() == 1


def test_clean_exit_is_not_restarted(scalers: list[LocalProcessScaler]) -> None:
    scaler = LocalProcessScaler(python("pass"), restart_backoff=0.0)
    scalers.append(scaler)
    scaler.scale_to(2)
    wait_until(lambda: (scaler.reap(), scaler.current())[1] == 0)
    assert scaler.pids() == []


def test_bad_commands_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="command"):
        LocalProcessScaler([])
    scaler = LocalProcessScaler(["/nonexistent/podracer", "serve", "pod"])
    with pytest.raises(ConfigError, match="cannot start '/nonexistent/podracer'"):
        scaler.scale_to(1)
    with pytest.raises(ConfigError, match="pods"):
        scaler.scale_to(-1)


# ------------------------------------------------------------------------ Swarm


class FakeService:
    def __init__(self, replicas: int | None, error: Exception | None = None) -> None:
        mode: dict[str, Any] = ({"Global": {}} if replicas is None
                                else {"Replicated": {"Replicas": replicas}})
        self.attrs = {"Spec": {"Mode": mode}}
        self.error = error
        self.scaled: list[int] = []

    def scale(self, replicas: int) -> bool:
        if self.error is not None:
            raise self.error
        self.scaled.append(replicas)
        self.attrs["Spec"]["Mode"] = {"Replicated": {"Replicas": replicas}}
        return True


class FakeDocker:
    """``docker.DockerClient``'s ``services.get`` surface; raises NotFound for other names."""

    def __init__(self, services: dict[str, FakeService]) -> None:
        self.closed = False

        def get(name: str) -> FakeService:
            if name not in services:
                raise docker.errors.NotFound(f"service {name} not found")
            return services[name]

        self.services = SimpleNamespace(get=get)

    def close(self) -> None:
        self.closed = True


def test_swarm_scaler_reads_and_sets_replicas() -> None:
    """No Docker engine runs in CI: this tests SwarmScaler at the Docker SDK boundary."""
    service = FakeService(replicas=2)
    client = FakeDocker({"podracer_pod": service})
    scaler = SwarmScaler("podracer_pod", client=client)
    assert isinstance(scaler, Scaler)
    assert scaler.current() == 2
    scaler.scale_to(5)
    assert service.scaled == [5] and scaler.current() == 5
    assert scaler.reap() == 0
    scaler.close()
    assert not client.closed  # a client passed in belongs to the caller
    with pytest.raises(BrokerError, match="closed"):
        scaler.current()


def test_swarm_errors_are_translated() -> None:
    """Docker SDK exceptions (raised by a fake client) become ConfigError / BrokerError."""
    broken = FakeService(2, error=docker.errors.APIError("update out of sequence"))
    client = FakeDocker({"global": FakeService(None), "broken": broken})
    with pytest.raises(ConfigError, match="no Swarm service named 'missing'"):
        SwarmScaler("missing", client=client).current()
    with pytest.raises(ConfigError, match="not replicated"):
        SwarmScaler("global", client=client).current()
    with pytest.raises(BrokerError, match="update out of sequence"):
        SwarmScaler("broken", client=client).scale_to(3)
    with pytest.raises(ConfigError, match="pods"):
        SwarmScaler("broken", client=client).scale_to(-1)


# ---------------------------------------------------------------------- builder


def test_null_scaler_only_remembers_the_target() -> None:
    scaler = NullScaler()
    assert isinstance(scaler, Scaler) and scaler.current() == 0
    scaler.scale_to(4)
    assert scaler.current() == 4 and scaler.reap() == 0
    with pytest.raises(ConfigError, match="pods"):
        scaler.scale_to(-2)


def test_build_scaler_local_passes_the_experiment_to_pods(tmp_path: Path) -> None:
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
    assert scaler.current() == 0  # nothing starts before scale_to


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
