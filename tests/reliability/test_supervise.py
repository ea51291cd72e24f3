"""Supervision: a crashed service is restarted with backoff, and given up on loudly."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from pathlib import Path

import pytest

from broker.core.errors import ConfigError, ConnectionClosed
from broker.runtime.service import ServiceContext
from broker.runtime.supervise import Backoff, ProcessGroup, Supervision, supervise, supervised

pytestmark = pytest.mark.timeout(60)
QUICK = Supervision(max_restarts=3, window_s=60.0, backoff_base_s=0.01, backoff_cap_s=0.05)


def test_backoff_grows_to_its_cap_and_resets() -> None:
    backoff = Backoff(base=1.0, cap=8.0)
    delays = [backoff.next() for _ in range(6)]
    assert all(0.5 * min(8.0, 2.0**i) <= d <= min(8.0, 2.0**i) for i, d in enumerate(delays))
    backoff.reset()
    assert backoff.next() <= 1.0


async def test_a_crashing_service_is_restarted_until_it_runs_cleanly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outcomes: list[int | Exception] = [ConnectionClosed("broker gone"), 1, 0]
    runs = []

    async def service() -> int:
        runs.append(time.monotonic())
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    with caplog.at_level(logging.WARNING):
        assert await supervise("generator", service, QUICK) == 0
    assert len(runs) == 3
    assert sum("restart" in r.getMessage() for r in caplog.records) == 2


async def test_supervision_gives_up_loudly(caplog: pytest.LogCaptureFixture) -> None:
    runs = []

    async def service() -> int:
        runs.append(1)
        raise RuntimeError("disk on fire")

    with caplog.at_level(logging.ERROR):
        assert await supervise("updater", service, QUICK) == 1
    assert len(runs) == QUICK.max_restarts + 1
    assert any("giving up" in r.getMessage() and r.levelno == logging.ERROR
               for r in caplog.records)


async def test_bad_configuration_is_not_restarted() -> None:
    runs = []

    async def service() -> int:
        runs.append(1)
        raise ConfigError("env", "unknown env 'x'")

    assert await supervise("pod", service, QUICK) == 1
    assert runs == [1]


async def test_supervised_closes_a_crashed_runs_heartbeats() -> None:
    ctx: ServiceContext[None] = ServiceContext(None, "svc")
    beats: list[asyncio.Task[None]] = []
    crashes = [1]

    async def forever() -> None:
        await asyncio.Event().wait()

    async def main(c: ServiceContext[None]) -> int:
        task = asyncio.create_task(forever())
        c._tasks.add(task)  # what ctx.heartbeat registers
        beats.append(task)
        if crashes:
            crashes.pop()
            raise ConnectionClosed("consumer cancelled")
        return 0

    assert await supervised(main, QUICK)(ctx) == 0
    assert len(beats) == 2 and all(t.cancelled() for t in beats)


async def test_process_group_restarts_a_crashed_process_and_gives_up_on_a_hopeless_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    counter = tmp_path / "runs"
    flaky = ("import pathlib, sys; p = pathlib.Path(sys.argv[1]); "
             "n = int(p.read_text() or 0) if p.exists() else 0; p.write_text(str(n + 1)); "
             "sys.exit(0 if n >= 2 else 3)")
    group = ProcessGroup({}, tmp_path, QUICK)
    group.start("generator", [sys.executable, "-c", flaky, str(counter)])
    group.start("updater", [sys.executable, "-c", "raise SystemExit(5)"])
    with caplog.at_level(logging.WARNING):
        deadline = time.monotonic() + 30
        while group.running() and time.monotonic() < deadline:
            group.poll()
            await asyncio.sleep(0.02)
    assert group.codes == {"generator": 0, "updater": 5}
    assert counter.read_text() == "3"
    assert any("updater" in r.getMessage() and "giving up" in r.getMessage()
               for r in caplog.records)
