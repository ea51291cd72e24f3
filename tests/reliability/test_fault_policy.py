"""Whose fault it is, decided once (``broker.runtime.faults``), for the pod and the updater.

A fault of the node (a data file missing here, out of CPU or GPU memory, out of file
descriptors, ``/dev/shm`` full, a CUDA error) must never dead-letter the message: it
goes back to its queue, the service stops taking work and says why (one log line, its
heartbeat), probes, and takes the work again once the probe passes. Each case breaks
the real build at its boundary (the env factory, the agent build) until the test
repairs it.
"""

from __future__ import annotations

import asyncio
import datetime
import errno
import logging
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from agents.build import build_agent
from agents.pod import runner as runner_module
from agents.pod import service as pod_service
from agents.registry import default_registry
from broker.core.errors import (
    ConfigError,
    DecodeError,
    EnvUnavailable,
    PublishError,
    StoreUnavailable,
)
from broker.core.schemas import Checkpoint, Heartbeat, LeaderboardChanged
from broker.runtime.faults import Fault, Faulted, Verdict, judge
from broker.transports.memory import MemoryBroker
from envs.registry import make_env
from leaderboard import updater as updater_service
from tests.issued import issue_for, trust_scores
from tests.reliability.test_transient_faults import (
    FAST,
    PPO,
    Bed,
    bed_for,
    init,
    next_checkpoint,
    stop,
    until,
)

pytestmark = pytest.mark.timeout(120)

@pytest.fixture
async def bed(experiment: str, tmp_path: Path, wire: Callable[..., Any]
              ) -> AsyncIterator[Bed]:
    async for b in bed_for("memory://", MemoryBroker(), experiment, tmp_path / "store", wire):
        yield b


NODE_FAULTS: dict[str, Callable[[], BaseException]] = {
    "missing data file": lambda: EnvUnavailable("env stock/x.csv cannot be built here: "
                                                "path: x.csv is not a file"),
    "MemoryError": lambda: MemoryError(),
    "CPU OOM": lambda: RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: "
                                    "can't allocate memory: you tried to allocate 9 bytes"),
    "CUDA OOM": lambda: torch.cuda.OutOfMemoryError("CUDA out of memory. Tried 2 GiB"),
    "EMFILE": lambda: OSError(errno.EMFILE, "Too many open files"),
    "/dev/shm full": lambda: RuntimeError("unable to write to file </torch_1_2_3>: No space "
                                          "left on device (28)"),
    "ENOSPC": lambda: OSError(errno.ENOSPC, "No space left on device"),
    "CUDA error": lambda: RuntimeError("CUDA error: an illegal memory access was encountered"),
    "no simulator": lambda: ModuleNotFoundError("No module named 'mujoco'"),
}


@pytest.mark.parametrize("case", sorted(NODE_FAULTS))
def test_the_nodes_faults(case: str) -> None:
    verdict = judge(NODE_FAULTS[case](), unknown=Fault.MESSAGE)
    assert verdict.fault is Fault.NODE
    assert "\n" not in verdict.reason and len(verdict.reason) <= 300


@pytest.mark.parametrize(("exc", "unknown", "fault"), [
    (ConfigError("hparams.lr", "must be > 0"), Fault.MOMENT, Fault.MESSAGE),
    (DecodeError("bad tensor"), Fault.MOMENT, Fault.MESSAGE),
    (StoreUnavailable("store not mounted"), Fault.MESSAGE, Fault.MOMENT),
    (PublishError("not confirmed"), Fault.MESSAGE, Fault.MOMENT),
    (ConnectionResetError(), Fault.MESSAGE, Fault.MOMENT),
    (RuntimeError("Storage size calculation overflowed"), Fault.MESSAGE, Fault.MESSAGE),
    (RuntimeError("loss went sideways"), Fault.MOMENT, Fault.MOMENT),
    (Faulted(Verdict(Fault.NODE, "judged in a worker")), Fault.MESSAGE, Fault.NODE),
])
def test_the_messages_and_the_moments_faults(exc: BaseException, unknown: Fault,
                                             fault: Fault) -> None:
    assert judge(exc, unknown=unknown).fault is fault


def test_a_reason_is_one_bounded_line() -> None:
    verdict = judge(ValueError("first " + "x" * 1000 + "\nsecond"), unknown=Fault.MESSAGE)
    assert verdict.reason.startswith("ValueError: first") and len(verdict.reason) == 300


class Broken:
    """Makes what ``target`` names raise ``error`` until ``repair``; counts the tries."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, owner: Any, name: str,
                 error: Callable[[], BaseException]) -> None:
        self.tries = 0
        self.broken = threading.Event()
        self.broken.set()
        real = getattr(owner, name)

        def maybe_broken(*args: Any, **kwargs: Any) -> Any:
            if self.broken.is_set():
                self.tries += 1
                raise error()
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, maybe_broken)

    def repair(self) -> None:
        self.broken.clear()


def said(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    return any(text in r.getMessage() for r in caplog.records)


def write_prices(path: Path) -> None:
    """A small wide price file (two tickers, 300 days) for ``stock/<path>``."""
    gen = torch.Generator().manual_seed(0)
    moves = (1 + 0.01 * torch.randn(300, 2, generator=gen)).cumprod(0) * 100
    day = datetime.date(2020, 1, 1)
    rows = [f"{day + datetime.timedelta(days=i)},{a:.2f},{b:.2f}" for i, (a, b)
            in enumerate(moves.tolist())]
    path.write_text("date,AAA,BBB\n" + "\n".join(rows) + "\n")


class MissingFile:
    """The price file of ``stock/<path>``, absent on this node until ``repair``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def repair(self) -> None:
        write_prices(self.path)


async def _pod_survives(bed: Bed, broken: Broken | MissingFile, caplog: pytest.LogCaptureFixture,
                        heartbeat: bool = False) -> None:
    """The pod puts the round back, stops, says why, probes, and trains it once repaired."""
    exp = bed.settings.experiment.name
    with caplog.at_level(logging.INFO):
        async with bed.transport.subscribe([f"heartbeat.pod-{exp}"]) as beats:
            ctx, task = bed.start(pod_service.main, f"pod-{exp}")
            first = init(exp, bed.settings.experiment.env)
            await bed.transport.publish("generator", first)
            await until(lambda: said(caplog, "stopped taking rounds"), task)
            await until(lambda: said(caplog, "probe failed"), task)  # it probes, in vain
            assert await bed.depth("generator") == 1  # back in the queue, not taken
            assert await bed.depth("generator.dead") == 0
            if heartbeat:  # says why on its heartbeat too (every 5 s)
                while True:
                    beat = await asyncio.wait_for(anext(beats), 15)
                    assert isinstance(beat, Heartbeat)
                    if beat.status.startswith("unavailable: round"):
                        break
            broken.repair()
            checkpoint = await next_checkpoint(bed, task)
            assert checkpoint.init_id == first.id
            assert said(caplog, "probe passed")
            assert await bed.depth("generator.dead") == 0
            assert await stop(ctx, task) == 0


@pytest.mark.parametrize("case", sorted(set(NODE_FAULTS) - {"missing data file"}))
async def test_pod_hands_back_a_round_its_node_cannot_build(
    bed: Bed, case: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(pod_service, "TRANSIENT_BACKOFF", FAST)
    broken = Broken(monkeypatch, runner_module, "build_learners", NODE_FAULTS[case])
    await _pod_survives(bed, broken, caplog)


async def test_pod_on_a_node_without_the_price_file_hands_back_its_rounds(
    experiment: str, tmp_path: Path, wire: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(pod_service, "TRANSIENT_BACKOFF", FAST)
    prices = tmp_path / "prices.csv"
    async for bed in bed_for("memory://", MemoryBroker(), experiment, tmp_path / "store",
                             wire, env=f"stock/{prices}"):
        await _pod_survives(bed, MissingFile(prices), caplog, heartbeat=True)


@pytest.mark.rabbitmq
async def test_pod_hands_back_a_round_on_rabbitmq_when_out_of_file_descriptors(
    amqp_url: str, experiment: str, tmp_path: Path, wire: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(pod_service, "TRANSIENT_BACKOFF", FAST)
    broken = Broken(monkeypatch, runner_module, "build_learners", NODE_FAULTS["EMFILE"])
    async for bed in bed_for(amqp_url, None, experiment, tmp_path / "store", wire):
        await _pod_survives(bed, broken, caplog)


async def test_pod_retries_a_round_that_failed_for_a_moment(
    bed: Bed, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(pod_service, "TRANSIENT_BACKOFF", FAST)
    train = runner_module.train_round
    failures = [RuntimeError("a hiccup")]

    def flaky(*args: Any, **kwargs: Any) -> Any:
        if failures:
            raise failures.pop()
        return train(*args, **kwargs)

    monkeypatch.setattr(runner_module, "train_round", flaky)
    exp = bed.settings.experiment.name
    with caplog.at_level(logging.INFO):
        ctx, task = bed.start(pod_service.main, "pod-moment")
        first = init(exp)
        await bed.transport.publish("generator", first)
        assert (await next_checkpoint(bed, task)).init_id == first.id
        assert said(caplog, "returning it to the queue") and not said(caplog, "stopped taking")
        assert await bed.depth("generator.dead") == 0
        assert await stop(ctx, task) == 0


# ------------------------------------------------------------------ the updater


def _checkpoint(experiment: str, env: str) -> Checkpoint:
    venv = make_env(env, PPO["num_envs"], "cpu")
    try:
        agent = build_agent(default_registry(), "ppo", PPO, venv, torch.device("cpu"), 0)
    finally:
        venv.close()
    return Checkpoint(id="init-1", experiment=experiment, init_id="init-1", pod="pod-f",
                      algorithm="ppo",
                      env=env, hparams=dict(PPO), state=agent.state_dict(), score_mean=-1.0,
                      score_std=0.0, env_steps=64, wall_time=1.0)


async def _updater_survives(bed: Bed, checkpoint: Checkpoint, repair: Callable[[], None],
                            caplog: pytest.LogCaptureFixture,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    issue_for(bed.settings.store, checkpoint)  # a round the generator issued
    trust_scores(monkeypatch)  # the fault under test is the env's, not the claim's
    with caplog.at_level(logging.INFO):
        async with bed.transport.subscribe(["leaderboard.changed"]) as events:
            ctx, task = bed.start(updater_service.main, "updater-f")
            await bed.transport.publish("updater", checkpoint)
            await until(lambda: said(caplog, "stopped taking checkpoints"), task)
            await until(lambda: said(caplog, "probe failed"), task)
            assert await bed.depth("updater") == 1  # back in the queue, not taken
            assert await bed.depth("updater.dead") == 0
            repair()
            changed = await asyncio.wait_for(anext(events), 60)
            assert isinstance(changed, LeaderboardChanged)
            assert changed.best_id == checkpoint.id
            assert await bed.depth("updater.dead") == 0
            assert await stop(ctx, task) == 0


async def test_updater_on_a_node_without_the_price_file_keeps_the_checkpoints(
    experiment: str, tmp_path: Path, wire: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(updater_service, "STORE_BACKOFF", FAST)
    prices = tmp_path / "prices.csv"
    write_prices(prices)
    checkpoint = _checkpoint(experiment, f"stock/{prices}")
    prices.unlink()  # gone from this node
    async for bed in bed_for("memory://", MemoryBroker(), experiment, tmp_path / "store",
                             wire, env=f"stock/{prices}"):
        await _updater_survives(bed, checkpoint, lambda: write_prices(prices), caplog,
                                monkeypatch)


@pytest.mark.parametrize("case", ["MemoryError", "EMFILE", "CPU OOM"])
async def test_updater_keeps_the_checkpoints_while_its_env_cannot_be_built(
    bed: Bed, case: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(updater_service, "STORE_BACKOFF", FAST)
    checkpoint = _checkpoint(bed.settings.experiment.name, bed.settings.experiment.env)
    broken = Broken(monkeypatch, updater_service, "make_env", NODE_FAULTS[case])
    await _updater_survives(bed, checkpoint, broken.repair, caplog, monkeypatch)
