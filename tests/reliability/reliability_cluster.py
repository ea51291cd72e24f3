"""A hand-driven Podracer cluster for fault tests: every service an OS process.

The test starts ``python -m podracer serve <role>`` processes itself (instead of
``podracer train``) so it decides exactly which process dies when, plays the
supervisor that restarts crashed ones, and can restart the RabbitMQ app in between.
Each process writes its own log file; the ledger is rebuilt from those logs, the
leaderboard store and the broker's queues at the end.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions

from broker.core.experiment import Experiment
from broker.core.schemas import Stop
from broker.core.settings import write_experiment
from broker.transports.sync_client import SyncClient

log = logging.getLogger(__name__)

RABBITMQCTL = "rabbitmqctl"
_STARTED = re.compile(r"round (\w{8}) \(")
_PUBLISHED = re.compile(r"round (\w{8}) published")


@dataclasses.dataclass
class Proc:
    """One service process the cluster started."""

    name: str
    role: str
    popen: subprocess.Popen[bytes]
    log: Path
    killed: bool = False
    """The test SIGKILLed it on purpose."""

    def alive(self) -> bool:
        """Still running."""
        return self.popen.poll() is None

    def text(self) -> str:
        """Its log so far."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def mid_round(self) -> bool:
        """A pod that has taken an initialization and not yet published its checkpoint."""
        text = self.text()
        return len(_STARTED.findall(text)) > len(_PUBLISHED.findall(text))


class Cluster:
    """Starts, kills and restarts the services of one experiment (see the module doc)."""

    def __init__(self, url: str, experiment: Experiment, root: Path,
                 rng: random.Random | None = None) -> None:
        self.url = url
        self.experiment = experiment
        self.root = root
        self.logs = root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.store = root / "store"
        self.rng = rng or random.Random(0)
        self.procs: list[Proc] = []
        self._serial: dict[str, int] = {}
        self.stop_events = 0
        """How many times ``stop_all`` had to publish ``control.stop``."""
        self._env = {
            **os.environ,
            "PODRACER_BROKER": url,
            "PODRACER_EXPERIMENT_FILE": str(write_experiment(experiment,
                                                             root / "experiment.json")),
            "PODRACER_STORE": str(self.store),
            "PODRACER_TORCH_THREADS": "1",
            "PODRACER_DEVICE": "cpu",
            "PODRACER_LOG_LEVEL": "INFO",
        }

    # ------------------------------------------------------------ processes

    def start(self, role: str) -> Proc:
        """Start one ``podracer serve <role>`` process named ``<role>-<n>``."""
        self._serial[role] = self._serial.get(role, 0) + 1
        name = f"{role}-{self._serial[role]}"
        path = self.logs / f"{name}.log"
        with path.open("ab") as fh:
            popen = subprocess.Popen(
                [sys.executable, "-m", "podracer", "serve", role, "--instance", name],
                env=self._env, stdout=fh, stderr=subprocess.STDOUT)
        proc = Proc(name, role, popen, path)
        self.procs.append(proc)
        log.info("started %s (pid %d)", name, popen.pid)
        return proc

    def live(self, role: str) -> list[Proc]:
        """Running processes of ``role``."""
        return [p for p in self.procs if p.role == role and p.alive()]

    def kill(self, proc: Proc) -> None:
        """SIGKILL ``proc`` and reap it."""
        proc.killed = True
        with contextlib.suppress(ProcessLookupError):
            proc.popen.send_signal(signal.SIGKILL)
        proc.popen.wait(timeout=30)
        log.info("killed %s", proc.name)

    def victim_pod(self, wait_s: float = 10.0) -> Proc | None:
        """A live pod in the middle of a round (so a round is at stake), waiting up to
        ``wait_s`` for one (fresh pods are still importing torch); else any live pod."""
        deadline = time.monotonic() + wait_s
        while True:
            pods = self.live("pod")
            busy = [p for p in pods if p.mid_round()]
            if busy or time.monotonic() >= deadline:
                pool = busy or pods
                return self.rng.choice(pool) if pool else None
            time.sleep(0.5)

    def crashed(self) -> list[Proc]:
        """Processes that ended by themselves with a non-zero code."""
        return [p for p in self.procs if not p.killed and not p.alive()
                and p.popen.returncode != 0]

    def stop_all(self, reason: str, timeout: float = 120.0,
                 every_s: float = 5.0) -> dict[str, int | None]:
        """Publish ``control.stop`` until every live process exits; their exit codes.

        ``control.stop`` is an event, seen only by processes already subscribed: a pod
        still starting up when it is first published would miss it, so it is repeated
        every ``every_s`` seconds while anything runs.
        """
        live = [p for p in self.procs if p.alive()]
        deadline = time.monotonic() + timeout
        with SyncClient(self.url, self.experiment.name) as client:
            while any(p.alive() for p in live) and time.monotonic() < deadline:
                client.publish_control(Stop(experiment=self.experiment.name, reason=reason))
                self.stop_events += 1
                until = min(deadline, time.monotonic() + every_s)
                while any(p.alive() for p in live) and time.monotonic() < until:
                    time.sleep(0.2)
        return {p.name: p.popen.poll() for p in live}

    def terminate_all(self) -> None:
        """Last resort in ``finally``: SIGKILL whatever still runs."""
        for proc in self.procs:
            if proc.alive():
                with contextlib.suppress(ProcessLookupError):
                    proc.popen.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.popen.wait(timeout=10)

    def all_logs(self, role: str | None = None) -> str:
        """The concatenated logs of every process (of ``role``)."""
        return "\n".join(p.text() for p in self.procs if role is None or p.role == role)


# ---------------------------------------------------------------- the broker itself


def broker_up(url: str) -> bool:
    """Whether RabbitMQ accepts an AMQP connection at ``url`` right now."""
    params = pika.URLParameters(url)
    params.connection_attempts = 1
    params.socket_timeout = 2
    try:
        pika.BlockingConnection(params).close()
    except (pika.exceptions.AMQPError, OSError):
        return False
    return True


def wait_broker(url: str, timeout: float = 60.0) -> bool:
    """Poll until RabbitMQ accepts connections (or ``timeout``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if broker_up(url):
            return True
        time.sleep(0.5)
    return False


def _ctl(*args: str) -> None:
    subprocess.run([RABBITMQCTL, *args], check=True, capture_output=True, timeout=120)


@contextlib.contextmanager
def broker_guard(url: str) -> Iterator[None]:
    """Whatever happens inside, leave the RabbitMQ app started and reachable."""
    try:
        yield
    finally:
        if not broker_up(url):
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                _ctl("start_app")
            wait_broker(url)


def restart_broker(url: str, down_s: float = 3.0) -> float:
    """``rabbitmqctl stop_app``, wait ``down_s``, ``start_app``; seconds it was down."""
    started = time.monotonic()
    try:
        _ctl("stop_app")
        time.sleep(down_s)
    finally:
        _ctl("start_app")
    if not wait_broker(url):
        raise RuntimeError("RabbitMQ did not come back after start_app")
    return time.monotonic() - started
