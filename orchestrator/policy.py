"""How many pods a node should run, and when the whole experiment stops: pure logic.

``ScalingPolicy.desired`` maps one reading (node load, generator queue, current pods) to
the pod count the node could run now. ``ScalingDecider`` adds hysteresis so noise does
not make the pool flap: it moves up only after ``up_polls`` consecutive readings agree
(at once when the gap reaches ``up_margin``), down after ``down_polls`` (``up_polls``
when the node is overloaded, since protecting the node is urgent). Over a streak it
applies the most cautious of the counts it saw (the smallest when growing, the largest
when shrinking), so a single spike within a streak cannot overshoot.

CPU model: every pod is assumed to use ``cpu_per_pod`` cores; the rest of the measured
load belongs to others. Outside the ``[cpu_low, cpu_high]`` band the count is set so
that the node lands in the middle of the band; inside it the count holds.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from broker.core.errors import ConfigError
from orchestrator.probes import NodeLoad

if TYPE_CHECKING:
    from broker.core.experiment import Experiment


@dataclasses.dataclass(frozen=True)
class QueueStats:
    """The generator queue as the broker reports it."""

    depth: int
    """Ready (not yet delivered) initializations."""
    consumers: int
    """Pods consuming from it (reported in reasons; with prefetch 1 every consumer already
    holds one initialization, so only ``depth`` measures unmet demand)."""


@dataclasses.dataclass(frozen=True)
class Desired:
    """What the policy would run on a node now, and why."""

    pods: int
    reason: str
    overloaded: bool = False


@dataclasses.dataclass(frozen=True)
class ScalingPolicy:
    """Limits and watermarks for one node's pod count (CPU in percent of the machine)."""

    min_pods: int = 0
    """Never fewer pods on the node (even when overloaded)."""
    max_pods: int = 8
    """Never more pods on the node."""
    pods_per_gpu: int = 1
    """On a node with GPUs, capacity is GPUs x this."""
    cpu_per_pod: float = 1.0
    """Cores one pod is expected to use; a CPU-only node's capacity is cores / this."""
    cpu_low: float = 50.0
    """Below this CPU percent the node may take more pods."""
    cpu_high: float = 85.0
    """Above this CPU percent the node sheds pods."""
    mem_high: float = 90.0
    """Above this memory percent the node sheds one pod per decision."""
    queue_target: float = 1.0
    """Waiting initializations that justify one more pod; an empty queue means no growth."""
    up_polls: int = 2
    """Consecutive readings that must want more pods before growing."""
    down_polls: int = 3
    """Consecutive readings that must want fewer pods before shrinking (not overloaded)."""
    up_margin: int | None = None
    """Grow at once when the wanted count exceeds the current by this much (None: never)."""

    def __post_init__(self) -> None:
        if self.min_pods < 0:
            raise ConfigError("min_pods", f"must be >= 0, got {self.min_pods}")
        if self.max_pods < max(self.min_pods, 1):
            raise ConfigError("max_pods", f"must be >= max(min_pods, 1), got {self.max_pods}")
        if self.pods_per_gpu < 1:
            raise ConfigError("pods_per_gpu", f"must be >= 1, got {self.pods_per_gpu}")
        if not self.cpu_per_pod > 0:
            raise ConfigError("cpu_per_pod", f"must be > 0, got {self.cpu_per_pod}")
        if not 0 < self.cpu_low < self.cpu_high <= 100:
            raise ConfigError("cpu_low", "need 0 < cpu_low < cpu_high <= 100",
                              f"got {self.cpu_low} and {self.cpu_high}")
        if not 0 < self.mem_high <= 100:
            raise ConfigError("mem_high", f"must be in (0, 100], got {self.mem_high}")
        if not self.queue_target > 0:
            raise ConfigError("queue_target", f"must be > 0, got {self.queue_target}")
        if self.up_polls < 1 or self.down_polls < 1:
            raise ConfigError("up_polls", "up_polls and down_polls must be >= 1")
        if self.up_margin is not None and self.up_margin < 1:
            raise ConfigError("up_margin", f"must be >= 1 or None, got {self.up_margin}")

    def capacity(self, load: NodeLoad) -> int:
        """Pods the node's hardware holds: by GPUs when it has any, else by cores."""
        if load.gpus:
            return len(load.gpus) * self.pods_per_gpu
        return int(load.cpu_count // self.cpu_per_pod)

    def _cpu_fit(self, load: NodeLoad, current: int) -> tuple[int, str]:
        if self.cpu_low <= load.cpu_percent <= self.cpu_high:
            return current, f"cpu {load.cpu_percent:.0f}% within watermarks"
        used = load.cpu_percent / 100.0 * load.cpu_count
        others = max(0.0, used - current * self.cpu_per_pod)
        middle = (self.cpu_low + self.cpu_high) / 200.0 * load.cpu_count
        fit = max(0, math.floor((middle - others) / self.cpu_per_pod))
        if load.cpu_percent > self.cpu_high:
            return min(fit, current), f"cpu {load.cpu_percent:.0f}% above {self.cpu_high:g}%"
        # Below the band pods may be using less than cpu_per_pod: never shrink for that.
        return max(fit, current), f"cpu {load.cpu_percent:.0f}% below {self.cpu_low:g}%"

    def desired(self, load: NodeLoad, current: int, queue: QueueStats | None = None) -> Desired:
        """The pod count this reading asks for (clamped to ``[min_pods, max_pods]``)."""
        if current < 0:
            raise ConfigError("current", f"must be >= 0, got {current}")
        pods, reason = self._cpu_fit(load, current)
        overloaded = load.cpu_percent > self.cpu_high
        if load.mem_percent > self.mem_high:
            pods, reason = min(pods, current - 1), f"memory {load.mem_percent:.0f}% high"
            overloaded = True
        capacity = self.capacity(load)
        if pods > capacity:
            pods, reason = capacity, f"capacity {capacity} pods"
        if queue is not None:
            demand = current + math.ceil(max(queue.depth, 0) / self.queue_target)
            if pods > demand:
                pods, reason = demand, (f"{queue.depth} initializations waiting for "
                                        f"{queue.consumers} pods")
        if pods < self.min_pods:
            pods, reason = self.min_pods, f"min_pods {self.min_pods}"
        elif pods > self.max_pods:
            pods, reason = self.max_pods, f"max_pods {self.max_pods}"
        return Desired(pods, reason, overloaded)


@dataclasses.dataclass(frozen=True)
class Decision:
    """The decider's answer for one node and one poll."""

    node: str
    target: int
    """Pods the node should run now (equal to the current count while holding)."""
    desired: int
    """What this reading alone asked for."""
    reason: str
    changed: bool


@dataclasses.dataclass
class _Streak:
    direction: int = 0
    polls: int = 0
    bound: int = 0


class ScalingDecider:
    """``ScalingPolicy`` plus hysteresis: one streak per node, no I/O."""

    def __init__(self, policy: ScalingPolicy) -> None:
        """Decide with ``policy``."""
        self.policy = policy
        self._streaks: dict[str, _Streak] = {}

    def decide(self, load: NodeLoad, current: int, queue: QueueStats | None = None) -> Decision:
        """Feed one reading of ``load.node``; the target may differ from ``current``."""
        want = self.policy.desired(load, current, queue)
        streak = self._streaks.setdefault(load.node, _Streak())
        if want.pods == current:
            self._streaks[load.node] = _Streak()
            return Decision(load.node, current, want.pods, f"hold: {want.reason}", False)
        direction = 1 if want.pods > current else -1
        if streak.direction != direction:
            streak = self._streaks[load.node] = _Streak(direction, 0, want.pods)
        streak.polls += 1
        pick = min if direction > 0 else max
        streak.bound = pick(streak.bound, want.pods)
        if direction > 0:
            needed = self.policy.up_polls
            margin = self.policy.up_margin
            if margin is not None and want.pods - current >= margin:
                needed, streak.bound = 1, want.pods
        else:
            needed = self.policy.up_polls if want.overloaded else self.policy.down_polls
        if streak.polls < needed:
            return Decision(load.node, current, want.pods,
                            f"pending {streak.polls}/{needed}: {want.reason}", False)
        self._streaks[load.node] = _Streak()
        return Decision(load.node, streak.bound, want.pods, want.reason, True)

    def forget(self, node: str) -> None:
        """Drop the streak of a node that left the cluster."""
        self._streaks.pop(node, None)


@dataclasses.dataclass(frozen=True)
class StopCondition:
    """When the experiment is over: target score reached or total budget spent."""

    target_score: float | None = None
    max_seconds: float | None = None
    max_env_steps: int | None = None

    @classmethod
    def from_experiment(cls, experiment: Experiment) -> StopCondition:
        """The experiment's ``target_score`` and ``total_budget``."""
        return cls(target_score=experiment.target_score,
                   max_seconds=experiment.total_budget.seconds,
                   max_env_steps=experiment.total_budget.env_steps)

    def check(self, best_score: float | None, elapsed: float, env_steps: int) -> str | None:
        """The reason to stop (for ``Stop.reason``), or ``None`` to go on."""
        if self.target_score is not None and best_score is not None and (
                best_score >= self.target_score):
            return f"target score reached: {best_score:.6g} >= {self.target_score:.6g}"
        if self.max_seconds is not None and elapsed >= self.max_seconds:
            return f"time budget spent: {elapsed:.0f} s >= {self.max_seconds:.0f} s"
        if self.max_env_steps is not None and env_steps >= self.max_env_steps:
            return f"env-step budget spent: {env_steps} >= {self.max_env_steps}"
        return None
