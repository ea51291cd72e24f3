"""After ``control.stop`` the updater waits for the pods' last rounds, however late.

A pod that hears the stop ends its round, evaluates it and publishes it; on a big env
that takes longer than any fixed idle time. Outside embedded mode (processes, compose,
Swarm) the updater knows its pods only by their heartbeats: a pod beats on while it
finishes, then says ``STOPPED`` (``broker.runtime.control.Returning``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from broker.core.schemas import STOPPED, Heartbeat, LeaderboardChanged, Stop
from broker.runtime.control import RETURN_HEAR_ALL_S, RETURN_SILENT_S, Returning
from broker.runtime.service import ServiceContext
from leaderboard import updater as updater_service
from leaderboard.store import LeaderboardStore
from tests.hostile.test_services import (  # noqa: F401  (services: a fixture)
    Services,
    alive_until,
    checkpoint,
    ppo_state,
    services,
)
from tests.issued import issue_for

pytestmark = pytest.mark.timeout(180)


def beat(pod: str, status: str, role: str = "pod") -> Heartbeat:
    return Heartbeat(experiment="x", pod=pod, role=role, status=status)


def test_a_pod_is_waited_for_until_it_says_stopped_or_falls_silent() -> None:
    returning = Returning(since=0.0)
    returning.heard(beat("pod-1", "training sac"), now=1.0)
    returning.heard(beat("pod-2", "idle"), now=1.0)
    returning.heard(beat("updater-1", "running", role="updater"), now=1.0)  # no rounds
    assert returning.pending(2.0) == ["pod-1", "pod-2"]
    returning.heard(beat("pod-2", STOPPED), now=3.0)
    assert returning.pending(4.0) == ["pod-1"] and not returning.settled(4.0)
    returning.heard(beat("pod-1", "publishing"), now=10.0)  # beating on while it returns
    assert returning.pending(10.0 + RETURN_SILENT_S) == ["pod-1"]
    assert returning.pending(10.1 + RETURN_SILENT_S) == []  # silent: died, not waited for
    assert returning.settled(10.1 + RETURN_SILENT_S)


def test_no_pod_heard_yet_is_settled_only_once_every_live_pod_had_time_to_beat() -> None:
    returning = Returning(since=100.0)
    assert not returning.settled(100.0 + RETURN_HEAR_ALL_S - 0.1)
    assert returning.settled(100.0 + RETURN_HEAR_ALL_S)


class LogEvent(logging.Handler):
    """Sets ``seen`` when a record containing ``text`` is logged."""

    def __init__(self, text: str) -> None:
        super().__init__(logging.INFO)
        self.text = text
        self.seen = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.seen.set()


async def test_after_control_stop_the_updater_stores_a_pods_round_published_late(
    services: Services, caplog: pytest.LogCaptureFixture,  # noqa: F811
) -> None:
    # the late round is published only once the updater says it waits for the pod: an
    # updater that did not wait (one that ended 5 s after its queue emptied) never says so
    rig = services.rig
    exp = rig.experiment
    late = checkpoint(exp, ppo_state())
    issue_for(services.settings.store, late)
    waiting = LogEvent("waiting for 1 pod(s) to publish their last rounds: pod-late")
    caplog.set_level(logging.INFO, logger="broker.runtime.control")  # the line is INFO
    logging.getLogger("broker.runtime.control").addHandler(waiting)
    pod = ServiceContext(services.settings, "pod-late")
    returned = asyncio.Event()
    try:
        async with rig.transport.subscribe(["leaderboard.changed"]) as events:
            ctx, task = services.start(updater_service.main, "updater-late")
            pod.heartbeat(rig.transport, role="pod", status_fn=lambda: "training ppo",
                          interval=0.2, until=returned)
            await alive_until(ctx.listening.wait(), task)
            await rig.transport.publish_event("control.stop", Stop(experiment=exp,
                                                                    reason="budget spent"))
            await alive_until(waiting.seen.wait(), task)
            await rig.transport.publish("updater", late)  # the pod's shortened round
            changed = await alive_until(anext(events), task)
            assert isinstance(changed, LeaderboardChanged) and changed.best_id == late.id
            assert not task.done()  # still waiting: the pod has not said it is done
            returned.set()
            await pod.farewell(rig.transport, role="pod")
            assert await asyncio.wait_for(task, 60) == 0
    finally:
        logging.getLogger("broker.runtime.control").removeHandler(waiting)
        await pod.close()
    await ctx.close()
    with LeaderboardStore(services.settings.store) as store:
        assert [e.id for e in store.top(10)] == [late.id]


async def test_an_updater_stopped_by_a_signal_does_not_wait_for_the_pods(
    services: Services,  # noqa: F811
) -> None:
    # its pods train on: what they publish waits in the queue for the next updater
    rig = services.rig
    pod = ServiceContext(services.settings, "pod-busy")
    returned = asyncio.Event()
    ctx, task = services.start(updater_service.main, "updater-sig")
    try:
        pod.heartbeat(rig.transport, role="pod", status_fn=lambda: "training ppo",
                      interval=0.2, until=returned)
        await alive_until(ctx.listening.wait(), task)
        ctx.stop()  # SIGTERM: no control.stop
        code: Any = await asyncio.wait_for(task, RETURN_SILENT_S)  # waiting would be 120 s
        assert code == 0
    finally:
        returned.set()
        await pod.close()
        await ctx.close()
