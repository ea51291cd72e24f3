"""Fault injection: a tournament on RabbitMQ survives SIGKILLs and a broker restart.

Every service is an OS process the test drives itself (``reliability_cluster``):
an updater, a generator and a few pods train torch Pendulum while the test

* SIGKILLs a pod (preferably one in the middle of a round) every few seconds and
  starts a replacement, at least 10 times;
* SIGKILLs the updater once and the generator once, and restarts each;
* restarts the RabbitMQ app once (``rabbitmqctl stop_app`` / ``start_app``; the
  durable quorum queues survive it);
* plays the supervisor: a service that exits by itself with an error is restarted
  (allowed only around the broker restart, where exiting for a restart is the
  designed fallback) and counted.

Then ``control.stop`` ends the run, every live service must exit 0, and the ledger
must balance: each initialization the generator published is stored, back in the
``generator`` queue or dead-lettered with a reason; every checkpoint a pod saw
confirmed is stored (or still pending); no leaderboard row is duplicated.
The totals are printed and written to ``<tmp>/ledger.json``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.core.settings import default_experiment
from tests.reliability.reliability_cluster import Cluster, Proc, broker_guard, restart_broker
from tests.reliability.reliability_ledger import build_ledger

log = logging.getLogger(__name__)

ENV = "torch/Pendulum-v1"
CRASH_WINDOW_S = 45.0
"""Seconds after a broker restart within which a service may exit to be restarted."""


@dataclasses.dataclass(frozen=True)
class Plan:
    """How hard to shake the cluster."""

    pods: int
    kills: int
    interval_s: float
    round_s: float
    settle_s: float
    bounce_broker: bool = True


SHORT = Plan(pods=3, kills=10, interval_s=7.0, round_s=3.0, settle_s=12.0)
LONG = Plan(pods=4, kills=40, interval_s=6.0, round_s=4.0, settle_s=20.0)


@dataclasses.dataclass
class Faults:
    """What the test did to the cluster, and what fell over by itself."""

    pod_kills: int = 0
    pod_kills_mid_round: int = 0
    updater_restarts: int = 0
    generator_restarts: int = 0
    broker_restarts: int = 0
    broker_down_s: float = 0.0
    crashes: list[str] = dataclasses.field(default_factory=list)
    crashes_outside_window: list[str] = dataclasses.field(default_factory=list)
    broker_back_at: str = ""
    """Wall-clock time (log format) the broker accepted connections again."""


def _wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def _supervise(cluster: Cluster, faults: Faults, handled: set[str],
               broker_restarted_at: float | None) -> None:
    """Restart services that exited by themselves; note whether that was excusable."""
    for proc in cluster.crashed():
        if proc.name in handled:
            continue
        handled.add(proc.name)
        tail = " | ".join(proc.text().strip().splitlines()[-3:])
        note = f"{proc.name} exit {proc.popen.returncode}: {tail[-400:]}"
        faults.crashes.append(note)
        near_restart = (broker_restarted_at is not None
                        and time.monotonic() - broker_restarted_at < CRASH_WINDOW_S)
        if not near_restart:
            faults.crashes_outside_window.append(note)
        cluster.start(proc.role)


def _kill_and_restart(cluster: Cluster, proc: Proc) -> None:
    cluster.kill(proc)
    cluster.start(proc.role)


def _shake(cluster: Cluster, url: str, plan: Plan) -> Faults:
    """Start the cluster and inject the faults of ``plan``."""
    faults = Faults()
    handled: set[str] = set()
    broker_at: float | None = None
    cluster.start("updater")
    cluster.start("generator")
    time.sleep(1.0)  # subscribed to control.stop before anyone could publish it
    for _ in range(plan.pods):
        cluster.start("pod")
    _wait_for(lambda: "stored " in cluster.all_logs("updater"), 150, "a first stored checkpoint")
    kill_updater, kill_generator, bounce = (plan.kills * 3 // 10, plan.kills // 2,
                                            plan.kills * 7 // 10)
    for i in range(plan.kills):
        time.sleep(plan.interval_s)
        _supervise(cluster, faults, handled, broker_at)
        victim = cluster.victim_pod()
        if victim is not None:
            faults.pod_kills_mid_round += victim.mid_round()
            _kill_and_restart(cluster, victim)
            faults.pod_kills += 1
        if i == kill_updater:
            _kill_and_restart(cluster, cluster.live("updater")[0])
            faults.updater_restarts += 1
        if i == kill_generator:
            _kill_and_restart(cluster, cluster.live("generator")[0])
            faults.generator_restarts += 1
        if i == bounce and plan.bounce_broker:
            faults.broker_down_s = restart_broker(url)
            faults.broker_restarts += 1
            broker_at = time.monotonic()
            faults.broker_back_at = time.strftime("%Y-%m-%d %H:%M:%S")
    time.sleep(plan.settle_s)
    _supervise(cluster, faults, handled, broker_at)
    return faults


def _run(url: str, experiment: str, tmp_path: Path, plan: Plan) -> None:
    exp = default_experiment(ENV).with_overrides(
        name=experiment, algos={"ppo": 1, "sac": 1, "td3": 1}, pods=plan.pods,
        # the default 16 episodes: a would-be best is re-measured by the updater, and a
        # 4-episode claim of Pendulum ran 3.4 measured stds above the measurement once
        # (refused as a false claim, the round counted as lost)
        round_budget={"seconds": plan.round_s}, eval_episodes=16, device="cpu")
    cluster = Cluster(url, exp, tmp_path, random.Random(7))
    with broker_guard(url):
        try:
            faults = _shake(cluster, url, plan)
            codes = cluster.stop_all("fault test over")
        finally:
            cluster.terminate_all()
    ledger = build_ledger(url, experiment, cluster.store, cluster.all_logs("generator"),
                          cluster.all_logs("pod"))
    ledger.faults = {k: v for k, v in dataclasses.asdict(faults).items()
                     if not isinstance(v, list)}
    ledger.faults["service_crashes"] = len(faults.crashes)
    ledger.faults["control_stop_publishes"] = cluster.stop_events
    totals = ledger.totals()
    ledger.write(tmp_path / "ledger.json")
    print(f"\nfault ledger ({tmp_path / 'ledger.json'}):\n{json.dumps(totals, indent=2)}")
    for note in faults.crashes:
        print(f"crash: {note}")

    failing = {name: code for name, code in codes.items() if code != 0}
    assert not failing, f"services did not exit 0 after control.stop: {failing}\n" + "\n".join(
        f"--- {p.name}\n{p.text()[-1500:]}" for p in cluster.procs if p.name in failing)
    assert faults.pod_kills >= plan.kills
    assert faults.pod_kills_mid_round >= plan.kills // 2, "kills rarely hit a running round"
    assert faults.updater_restarts == faults.generator_restarts == 1
    assert faults.broker_restarts == int(plan.bounce_broker)
    assert not faults.crashes_outside_window, faults.crashes_outside_window
    assert ledger.queued and ledger.rows > 0
    assert not ledger.vanished, f"initializations vanished: {sorted(ledger.vanished)}"
    assert not ledger.lost_checkpoints, f"confirmed but lost: {sorted(ledger.lost_checkpoints)}"
    assert ledger.rows == ledger.unique_rows == ledger.unique_init_ids, "duplicate rows"
    assert not ledger.in_queue["updater.dead"], "checkpoints were dead-lettered"
    # work went on after the broker came back: consumers and publishers recovered
    after = faults.broker_back_at
    assert _lines_after(cluster.all_logs("updater"), "stored ", after), "no store after restart"
    assert _lines_after(cluster.all_logs("pod"), " published", after), "no round after restart"


def _lines_after(text: str, needle: str, stamp: str) -> list[str]:
    """Log lines containing ``needle`` stamped after ``stamp`` (all of them if empty)."""
    # log lines start with "YYYY-mm-dd HH:MM:SS,mmm": string order is time order
    return [line for line in text.splitlines() if needle in line and line[:19] > stamp]


@pytest.mark.rabbitmq
@pytest.mark.timeout(330)
def test_tournament_survives_kills_and_a_broker_restart(
        amqp_url: str, experiment: str, tmp_path: Path) -> None:
    _run(amqp_url, experiment, tmp_path, SHORT)


@pytest.mark.rabbitmq
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_tournament_survives_many_kills_long(
        amqp_url: str, experiment: str, tmp_path: Path) -> None:
    _run(amqp_url, experiment, tmp_path, LONG)
