"""The time budget survives a restart of the orchestrator (issue 22, item 6): a new
orchestrator goes on from the elapsed time its predecessor saved in the store, so the
run still ends when its total budget says, not a whole budget after the restart."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from broker.core.experiment import parse_experiment
from broker.core.settings import Settings
from broker.runtime.service import ServiceContext
from broker.transports.connect import connector
from broker.transports.memory import MemoryBroker
from orchestrator.clock import CLOCK_FILE, RunClock, reset
from orchestrator.policy import ScalingPolicy
from orchestrator.probes import FakeProbe, NodeLoad
from orchestrator.scalers import NullScaler
from orchestrator.service import Orchestrator

pytestmark = pytest.mark.timeout(60)

BUDGET_S = 4.0


def _settings(store: Path) -> Settings:
    experiment = parse_experiment({"name": "clocked", "env": "e", "algos": {"sac": 1},
                                   "round_budget": {"steps": 5},
                                   "total_budget": {"seconds": BUDGET_S}})
    return Settings(experiment=experiment, store=store)


def _orchestrator(ctx: ServiceContext[Settings], transport: object) -> Orchestrator:
    probe = FakeProbe([NodeLoad(node="n", cpu_percent=10.0, cpu_count=2, mem_percent=30.0)])
    policy = ScalingPolicy(min_pods=0, max_pods=1, cpu_per_pod=1.0, cpu_low=50.0,
                           cpu_high=85.0, up_polls=2, down_polls=2)
    return Orchestrator(ctx, transport, NullScaler(), probe, policy,  # type: ignore[arg-type]
                        poll_s=0.1)


def _saved(store: Path) -> float:
    try:
        return float(json.loads((store / CLOCK_FILE).read_text())["elapsed"])
    except (OSError, ValueError, KeyError):
        return 0.0


async def test_a_restarted_orchestrator_keeps_the_run_s_time_budget(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    connect = connector("memory://", MemoryBroker())
    async with connect(experiment=settings.experiment.name) as transport:
        first_ctx = ServiceContext(settings, "orchestrator")
        first = asyncio.create_task(_orchestrator(first_ctx, transport).run())
        deadline = time.monotonic() + 20
        while _saved(tmp_path) < 2.5:  # the first one has counted most of the budget
            assert time.monotonic() < deadline and not first.done()
            await asyncio.sleep(0.05)
        first_ctx.stop()  # it dies (SIGTERM, a crash): the run goes on
        await asyncio.wait_for(first, 5)

        restarted_at = time.monotonic()
        second = _orchestrator(ServiceContext(settings, "orchestrator"), transport)
        await asyncio.wait_for(second.run(), 10)
        took = time.monotonic() - restarted_at
    assert second.stop_reason is not None and "time budget spent" in second.stop_reason
    # what was left (about 1.5 s), not a whole new budget of 4 s
    assert 0.8 <= took < 2.5, took


def test_the_clock_ignores_another_run_s_or_a_bad_value(tmp_path: Path) -> None:
    for text in ['{"experiment": "other", "elapsed": 50}', '{"experiment": "x", '
                 '"elapsed": -1}', '{"experiment": "x", "elapsed": "NaN"}', "not json",
                 '{"experiment": "x", "elapsed": true}']:
        (tmp_path / CLOCK_FILE).write_text(text)
        assert RunClock(tmp_path, "x").before == 0.0, text
    (tmp_path / CLOCK_FILE).write_text('{"experiment": "x", "elapsed": 12.5}')
    assert RunClock(tmp_path, "x").before == 12.5
    reset(tmp_path)  # a new session of `podracer train` starts from zero
    assert RunClock(tmp_path, "x").before == 0.0
