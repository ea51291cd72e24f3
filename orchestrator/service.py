"""The orchestrator service (``podracer serve orchestrator``): scale pods, stop at target.

Every ``poll_s`` seconds it reads this node's load (``NodeProbe``: psutil, NVML), the
``generator`` queue's depth and consumers, and its scaler's pod count; the
``ScalingDecider`` (policy plus hysteresis) turns them into a target, which the scaler
applies (local processes, Docker Swarm replicas, in-process pods, or nothing when pods
are managed outside, e.g. ``docker compose up --scale pod=N``). It restarts crashed
local pods and announces every change on ``control.scale``.

It listens to ``leaderboard.changed`` for the best score and the env steps spent; when
the experiment's target score or total budget is reached it publishes ``control.stop``
(every service then drains and exits 0), stops its pods gracefully and exits 0.
SIGTERM stops its own pods gracefully without stopping the experiment.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from typing import Any

from broker.core.errors import BrokerError
from broker.core.schemas import LeaderboardChanged, Scale, Stop
from broker.core.settings import Settings
from broker.runtime.control import watch_stop
from broker.runtime.service import ServiceContext
from broker.transports.base import Transport
from broker.transports.connect import Connector
from orchestrator.clock import RunClock
from orchestrator.policy import QueueStats, ScalingDecider, ScalingPolicy, StopCondition
from orchestrator.probes import NodeProbe, Probe, machine_pods
from orchestrator.scalers import Scaler

log = logging.getLogger(__name__)

STOP_REMIND_S = 2.0
"""Seconds between repeated ``control.stop`` announcements after the decision."""
STOP_REMIND_FOR_S = 6.0
"""The orchestrator keeps announcing the stop at least this long before it exits."""


@dataclasses.dataclass
class Progress:
    """What the orchestrator knows of the experiment (from ``leaderboard.changed``)."""

    best_score: float | None = None
    checkpoints: int = 0
    env_steps: int = 0


def default_policy(settings: Settings, min_pods: int | None = None) -> ScalingPolicy:
    """The population size as the ceiling (``machine_pods`` when the experiment leaves it
    to the machine); enough CPU share per pod to fit it."""
    pods = settings.experiment.pods or machine_pods()
    cores = os.cpu_count() or 1
    return ScalingPolicy(min_pods=min(pods, min_pods if min_pods is not None else 1),
                         max_pods=pods, cpu_per_pod=min(1.0, cores / pods), up_polls=2,
                         down_polls=3, cpu_high=95.0, cpu_low=60.0)


async def follow_leaderboard(transport: Transport, progress: Progress,
                             changed: asyncio.Event | None = None) -> None:
    """Keep ``progress`` up to date from ``leaderboard.changed`` events (and set
    ``changed`` after each, so the stop condition is checked at once)."""
    async with transport.subscribe(["leaderboard.changed"]) as events:
        async for event in events:
            if isinstance(event, LeaderboardChanged):
                progress.best_score = event.best_score
                progress.checkpoints = event.checkpoints
                progress.env_steps = event.total_env_steps
                if changed is not None:
                    changed.set()


class Orchestrator:
    """One node's control loop (see the module doc)."""

    def __init__(self, ctx: ServiceContext[Settings], transport: Transport, scaler: Scaler,
                 probe: Probe, policy: ScalingPolicy, poll_s: float) -> None:
        self.ctx = ctx
        self.transport = transport
        self.scaler = scaler
        self.probe = probe
        self.decider = ScalingDecider(policy)
        self.policy = policy
        self.poll_s = poll_s
        self.stop_condition = StopCondition.from_experiment(ctx.settings.experiment)
        self.progress = Progress()
        self.clock = RunClock(ctx.settings.store, ctx.settings.experiment.name)
        """The run's elapsed time, kept across restarts of the orchestrator."""
        self.stop_reason: str | None = None
        self.changed = asyncio.Event()
        """Set by ``follow_leaderboard``: the next poll comes at once."""
        self.pods = 0
        """The scaler's pod count as of the last poll (and its target after a change):
        what the heartbeat reports, since asking the scaler may be a network call."""

    async def step(self, first: bool) -> None:
        """One poll: read, decide, scale, reap."""
        load = await asyncio.to_thread(self.probe.read)
        try:
            depth, consumers = await self.transport.queue_depth("generator")
            queue: QueueStats | None = QueueStats(depth, consumers)
        except BrokerError as exc:
            log.warning("orchestrator: queue depth unavailable: %s", exc)
            queue = None
        current = self.pods = await self.scaler.current()
        if first:
            # nothing is running yet: go straight to what the node can hold
            target, reason = self.policy.desired(load, current, None).pods, "start"
            changed = target != current
        else:
            decision = self.decider.decide(load, current, queue)
            target, reason, changed = decision.target, decision.reason, decision.changed
        if changed:
            log.info("%s: %d -> %d pods (%s)", load.node, current, target, reason)
            await self.scaler.scale_to(target)
            self.pods = target
            await self._announce(Scale(experiment=self.ctx.settings.experiment.name,
                                       node=load.node, pods=target), "control.scale")
        restarted = await self.scaler.reap()
        if restarted:
            log.warning("%s: restarted %d crashed pod(s)", load.node, restarted)

    async def _announce(self, msg: Scale | Stop, key: str) -> None:
        try:
            await self.transport.publish_event(key, msg)
        except BrokerError as exc:
            log.warning("%s not sent: %s", key, exc)

    async def remind_stop(self) -> None:
        """Announce ``control.stop`` again every ``STOP_REMIND_S``: an event reaches only
        subscribers that exist, and a pod still starting when the first one went out
        would otherwise train on forever."""
        while True:
            await asyncio.sleep(STOP_REMIND_S)
            await self._announce(Stop(experiment=self.ctx.settings.experiment.name,
                                      reason=self.stop_reason or "stopped"), "control.stop")

    async def run(self) -> None:
        """Poll until the stop condition holds or the service is stopped; the stop
        condition is also checked the moment the leaderboard changes."""
        first = True
        next_step = time.monotonic()
        while not self.ctx.stopping.is_set():
            elapsed = self.clock.elapsed()
            reason = self.stop_condition.check(self.progress.best_score, elapsed,
                                               self.progress.env_steps)
            if reason is not None:
                self.stop_reason = reason
                log.info("stopping the experiment: %s", reason)
                await self._announce(Stop(experiment=self.ctx.settings.experiment.name,
                                          reason=reason), "control.stop")
                return
            if time.monotonic() >= next_step:
                self.clock.save()
                await self.step(first)
                first = False
                next_step = time.monotonic() + self.poll_s
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(),
                                       max(0.0, next_step - time.monotonic()))


async def main(ctx: ServiceContext[Settings], scaler: Scaler, *, connect: Connector,
               probe: Probe | None = None, policy: ScalingPolicy | None = None,
               poll_s: float = 1.0, remind_for_s: float = STOP_REMIND_FOR_S) -> int:
    """Run the orchestrator with ``scaler``; stops its pods gracefully and exits 0.

    After a stop it keeps announcing it for ``remind_for_s`` seconds, for pods it does
    not own (0 when ``scaler`` owns every pod, as in embedded mode)."""
    settings = ctx.settings
    probe = probe or NodeProbe()
    policy = policy or default_policy(settings)
    async with connect(experiment=settings.experiment.name) as transport:
        orchestrator = Orchestrator(ctx, transport, scaler, probe, policy, poll_s)
        ctx.heartbeat(transport, role="orchestrator",
                      status_fn=lambda: f"{orchestrator.pods} pods")
        side: list[asyncio.Task[Any]] = [
            asyncio.create_task(watch_stop(ctx, transport)),
            asyncio.create_task(follow_leaderboard(transport, orchestrator.progress,
                                                   orchestrator.changed))]
        try:
            await orchestrator.run()
        finally:
            log.info("orchestrator: stopping %d pod(s)", orchestrator.pods)
            if orchestrator.stop_reason is not None:
                side.append(asyncio.create_task(orchestrator.remind_stop()))
                stop_at = time.monotonic()
            await scaler.close()
            if orchestrator.stop_reason is not None:
                # keep reminding a little while for pods this node does not own
                await asyncio.sleep(max(0.0, remind_for_s - (time.monotonic() - stop_at)))
            for task in side:
                task.cancel()
            await asyncio.gather(*side, return_exceptions=True)
            probe.close()
    return 0
