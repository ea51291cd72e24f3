"""Scaling policy and stop condition: convergence, no flapping, limits; pure logic.

The node is simulated: its CPU load is a background load plus ``per_pod`` cores for each
pod the decider chose, so a decision feeds back into the next reading as on a real node.
"""

from __future__ import annotations

import random

import pytest

from broker.core.errors import ConfigError
from broker.core.experiment import parse_experiment
from orchestrator.policy import QueueStats, ScalingDecider, ScalingPolicy, StopCondition
from orchestrator.probes import GpuLoad, NodeLoad

POLICY = ScalingPolicy(min_pods=0, max_pods=16, cpu_per_pod=1.0, cpu_low=50, cpu_high=85)


def reading(background: float, pods: int, cores: int = 16, per_pod: float = 1.0,
            noise: float = 0.0, mem: float = 40.0, gpus: int = 0) -> NodeLoad:
    cpu = min(100.0, max(0.0, 100.0 * (background + pods * per_pod) / cores + noise))
    return NodeLoad("n", cpu, cores, mem, [GpuLoad(i, 50.0, 1, 8) for i in range(gpus)])


def run(decider: ScalingDecider, pods: int, polls: int, background: float,
        **kw: float) -> list[int]:
    """Poll ``polls`` times, applying every target; the pod count after each poll."""
    history = []
    for _ in range(polls):
        pods = decider.decide(reading(background, pods, **kw), pods).target  # type: ignore[arg-type]
        history.append(pods)
    return history


def test_converges_within_two_polls_after_a_load_change() -> None:
    decider = ScalingDecider(POLICY)
    # Idle node (2 cores busy): grow to land mid-band, (67.5% of 16 = 10.8) - 2 = 8 pods.
    assert run(decider, 0, 6, background=2.0) == [0, 8, 8, 8, 8, 8]
    # Inject load: 6 background cores -> 87.5% > 85%: shed to 10.8 - 6 = 4 pods.
    assert run(decider, 8, 6, background=6.0) == [8, 4, 4, 4, 4, 4]
    # Load leaves again: back up within two polls.
    assert run(decider, 4, 4, background=0.5) == [4, 10, 10, 10]


def test_noise_inside_the_band_never_flaps() -> None:
    decider = ScalingDecider(POLICY)
    rng = random.Random(0)
    pods, changes = 8, 0
    for _ in range(200):
        decision = decider.decide(reading(2.0, pods, noise=rng.uniform(-10, 10)), pods)
        changes += decision.changed
        pods = decision.target
    assert changes == 0 and pods == 8


def test_single_poll_spikes_never_flap() -> None:
    decider = ScalingDecider(POLICY)
    pods, targets = 8, set()
    for i in range(100):
        spike = 30.0 if i % 2 else -55.0  # alternately above high and below low watermark
        decision = decider.decide(reading(2.0, pods, noise=spike), pods)
        pods = decision.target
        targets.add(pods)
    assert targets == {8}


def test_scale_down_without_overload_is_slower() -> None:
    decider = ScalingDecider(ScalingPolicy(max_pods=16, down_polls=3))
    smaller = ScalingDecider(ScalingPolicy(max_pods=4, down_polls=3))
    # max_pods drops below the running count: not an overload, so down_polls (3) apply.
    assert [smaller.decide(reading(2.0, 8), 8).target for _ in range(3)] == [8, 8, 4]
    assert decider.decide(reading(2.0, 8), 8).target == 8


def test_min_and_max_are_respected() -> None:
    capped = ScalingDecider(ScalingPolicy(min_pods=2, max_pods=5))
    assert run(capped, 0, 3, background=0.0) == [0, 5, 5]
    floored = ScalingDecider(ScalingPolicy(min_pods=2, max_pods=5))
    assert run(floored, 5, 4, background=15.0) == [5, 2, 2, 2]  # overloaded, yet min_pods


def test_gpu_capacity_and_memory_pressure() -> None:
    policy = ScalingPolicy(max_pods=16, pods_per_gpu=2)
    assert policy.desired(reading(0.0, 0, gpus=3), 0).pods == 6
    assert policy.desired(reading(0.0, 0, gpus=0, cores=2), 0).pods == 1  # 2 cores: 67.5% fits 1
    squeezed = policy.desired(reading(0.0, 4, mem=95.0), 4)
    assert squeezed.pods == 3 and squeezed.overloaded and "memory" in squeezed.reason


def test_queue_caps_growth() -> None:
    policy = ScalingPolicy(max_pods=16, queue_target=2.0)
    idle = reading(0.0, 2)
    assert policy.desired(idle, 2, QueueStats(depth=0, consumers=2)).pods == 2
    assert policy.desired(idle, 2, QueueStats(depth=5, consumers=2)).pods == 5  # 2 + ceil(5/2)
    assert policy.desired(idle, 2, None).pods == 10


def test_up_margin_scales_at_once() -> None:
    decider = ScalingDecider(ScalingPolicy(max_pods=16, up_margin=4))
    decision = decider.decide(reading(0.0, 0), 0)
    assert decision.changed and decision.target == 10


def test_policy_validation() -> None:
    with pytest.raises(ConfigError, match="max_pods"):
        ScalingPolicy(min_pods=4, max_pods=2)
    with pytest.raises(ConfigError, match="cpu_low"):
        ScalingPolicy(cpu_low=90, cpu_high=80)
    with pytest.raises(ConfigError, match="cpu_per_pod"):
        ScalingPolicy(cpu_per_pod=0)


def test_stop_condition() -> None:
    stop = StopCondition(target_score=-200.0, max_seconds=60.0, max_env_steps=1000)
    assert stop.check(None, 0.0, 0) is None
    assert stop.check(-250.0, 59.0, 999) is None
    assert "target score reached" in (stop.check(-200.0, 1.0, 0) or "")
    assert "time budget" in (stop.check(-300.0, 60.0, 0) or "")
    assert "env-step budget" in (stop.check(-300.0, 1.0, 1000) or "")
    assert StopCondition().check(1e9, 1e9, 10**12) is None
    exp = parse_experiment({"name": "t", "env": "e", "algos": {"ppo": 1},
                            "round_budget": {"steps": 10}, "target_score": 5.0,
                            "total_budget": {"seconds": 30}})
    assert StopCondition.from_experiment(exp) == StopCondition(5.0, 30.0, None)
