"""Hostile bodies on every queue and on the events exchange, on both transports.

Each forged body must land in ``<queue>.dead`` (events: be dropped) with exactly one
one-line warning naming it, the Python heap must stay small, the decoder must never
size a tensor from a header it has not checked, and a valid message sent after the
garbage must still arrive.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.core import codec
from broker.core.messages import CLAIM_CONTENT_TYPE, CONTENT_TYPE
from broker.core.schemas import (
    Budget,
    Checkpoint,
    Initialization,
    LeaderboardChanged,
    Message,
    Stop,
)
from tests.hostile.hostile_cases import Case, hostile_bodies, mac_cases, wire_of
from tests.hostile.hostile_rig import MAX_PEAK_BYTES, Rig, make_rig, watch_memory

pytestmark = pytest.mark.timeout(120)
BACKENDS = ["memory", pytest.param("amqp", marks=pytest.mark.rabbitmq)]


@pytest.fixture(params=BACKENDS)
async def rig(request: pytest.FixtureRequest, experiment: str,
              blob_root: Path) -> AsyncIterator[Rig]:
    url = "memory://" if request.param == "memory" else request.getfixturevalue("amqp_url")
    async with make_rig(url, experiment, blob_root) as made:
        yield made


def valid(kind: str, experiment: str) -> Message:
    """A small valid message of ``kind`` for ``experiment``."""
    if kind == "initialization":
        return Initialization(experiment=experiment, algorithm="ppo", env="torch/Pendulum-v1",
                              hparams={"lr": 3e-4}, budget=Budget(steps=64), seed=1)
    return Checkpoint(experiment=experiment, init_id="init-1", pod="pod-1", algorithm="ppo",
                      env="torch/Pendulum-v1", hparams={"lr": 3e-4},
                      state={"w": torch.ones(4)}, score_mean=-100.0, score_std=1.0,
                      env_steps=64, wall_time=1.0)


def broker_warnings(caplog: pytest.LogCaptureFixture, words: str) -> list[str]:
    """Messages of WARNING+ records from ``broker.*`` loggers that contain ``words``."""
    return [r.getMessage() for r in caplog.records
            if r.name.startswith("broker.") and r.levelno >= logging.WARNING
            and words in r.getMessage()]


def assert_one_line_each(lines: list[str], cases: list[Case]) -> None:
    """One single-line warning per case, each naming the case's message id."""
    assert len(lines) == len(cases), "\n".join(lines)
    assert all("\n" not in line and "\r" not in line for line in lines)
    for case in cases:
        naming = [line for line in lines if repr(case.sent_id) in line]
        assert len(naming) == 1, (case.name, naming)


@pytest.mark.parametrize(("queue", "kind", "other"), [
    ("generator", "initialization", "checkpoint"),
    ("updater", "checkpoint", "initialization"),
])
async def test_hostile_bodies_are_dead_lettered_and_the_queue_keeps_flowing(
    rig: Rig, queue: str, kind: str, other: str, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    good = valid(kind, rig.experiment)
    # a valid body whose MAC is missing or wrong is refused like garbage
    cases = hostile_bodies(wire_of(good), other, rig.blobs) + mac_cases(wire_of(good))
    expect = type(good)
    with caplog.at_level(logging.WARNING), watch_memory(monkeypatch) as (spy, peak):
        for case in cases:
            await rig.sender.to_queue(queue, case)
        await rig.transport.publish(queue, good)
        async with rig.transport.consume(queue, prefetch=4, expect=expect) as inbox:
            delivery = await asyncio.wait_for(anext(inbox), 60)
            assert delivery.message.id == good.id
            await delivery.ack()
    assert sorted(await rig.dead_ids(queue)) == sorted(c.sent_id for c in cases)
    assert_one_line_each(broker_warnings(caplog, "dead-lettered"), cases)
    assert peak[0] < MAX_PEAK_BYTES
    # the only tensor the decoder built is the valid message's own
    assert spy.largest <= 16


async def test_hostile_events_are_dropped_with_one_line_each(
    rig: Rig, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    good = LeaderboardChanged(experiment=rig.experiment, best_id="c1", best_score=-10.0,
                              top=[("c1", -10.0)], checkpoints=1)
    cases = hostile_bodies(wire_of(good), "stop", rig.blobs)
    stop = Stop(experiment=rig.experiment, reason="after the garbage")
    # valid events an outsider forged: no MAC, or a wrong one
    forged = (mac_cases(wire_of(Stop(experiment=rig.experiment, reason="forged")),
                        "forged-stop-mac")
              + mac_cases(wire_of(good), "forged-changed-mac"))
    with caplog.at_level(logging.WARNING), watch_memory(monkeypatch) as (spy, peak):
        async with rig.transport.subscribe(["leaderboard.changed", "control.*"]) as events:
            for case in forged:
                key = "control.stop" if case.name.startswith("forged-stop") else \
                    "leaderboard.changed"
                await rig.sender.to_events(key, case)
            for i, case in enumerate(cases):
                key = "leaderboard.changed" if i % 2 else "control.stop"
                await rig.sender.to_events(key, case)
            await rig.transport.publish_event("control.stop", stop)
            received = await asyncio.wait_for(anext(events), 60)
    assert isinstance(received, Stop) and received.id == stop.id
    assert_one_line_each(broker_warnings(caplog, "dropped event"), cases)
    # counted, and logged once (a flood of forgeries must not flood the log)
    unauthenticated = broker_warnings(caplog, "dropped unauthenticated event")
    assert len(unauthenticated) == 1 and repr(forged[0].sent_id) in unauthenticated[0]
    assert rig.transport.event_drops.unauthenticated == len(forged)
    assert peak[0] < MAX_PEAK_BYTES
    assert spy.largest == 0


# ------------------------------------------------------------------ fuzz

Edits = list[tuple[int, int]]
Drawn = tuple[int, bytes, Edits, str]
"""(mode: 0 raw bytes / 1 byte edits of a valid body / 2 truncation, raw, edits, type)."""

drawn_bodies = st.tuples(
    st.integers(0, 2), st.binary(max_size=300),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4),
    st.sampled_from([CONTENT_TYPE, CONTENT_TYPE, CLAIM_CONTENT_TYPE]),
)


def _body(drawn: Drawn, packed: bytes) -> bytes:
    mode, raw, edits, _ = drawn
    if mode == 0:
        return raw
    if mode == 2:
        return packed[: edits[0][0] % len(packed)]
    out = bytearray(packed)
    for where, byte in edits:
        out[where % len(out)] = byte
    return bytes(out)


async def _fuzz_round(url: str, experiment: str, blob_root: Path,
                      drawn: list[Drawn]) -> tuple[int, int, int]:
    """Send the drawn bodies then a sentinel; return (sent, delivered, newly dead)."""
    async with make_rig(url, experiment, blob_root) as rig:
        packed = codec.pack(valid("initialization", experiment).to_wire())
        dead_before = len(await rig.dead_ids("generator"))
        for i, one in enumerate(drawn):
            await rig.sender.to_queue("generator", Case(f"fuzz-{i}", _body(one, packed), one[3]))
        sentinel = valid("initialization", experiment)
        await rig.transport.publish("generator", sentinel)
        delivered = 0
        async with rig.transport.consume("generator", prefetch=1,
                                         expect=Initialization) as inbox:
            while True:
                delivery = await asyncio.wait_for(anext(inbox), 30)
                await delivery.ack()
                if delivery.message.id == sentinel.id:
                    break
                delivered += 1  # an edit can leave a valid message (a changed digit): fine
        dead = len(await rig.dead_ids("generator"))
        return len(drawn), delivered, dead - dead_before


@pytest.mark.parametrize("backend", BACKENDS)
def test_fuzzed_bytes_are_delivered_valid_or_dead_lettered_never_stuck(
    backend: str, request: pytest.FixtureRequest, experiment: str, blob_root: Path,
) -> None:
    url = "memory://" if backend == "memory" else request.getfixturevalue("amqp_url")

    @settings(max_examples=40 if backend == "memory" else 8, deadline=None,
              derandomize=True, suppress_health_check=list(HealthCheck), database=None)
    @given(st.lists(drawn_bodies, min_size=1, max_size=6))
    def check(drawn: list[Drawn]) -> None:
        sent, delivered, dead = asyncio.run(_fuzz_round(url, experiment, blob_root, drawn))
        assert delivered + dead == sent

    check()
