"""A tournament on a 3-node RabbitMQ cluster survives losing the generator queue's leader
and a network partition.

Every service is an OS process (``reliability_cluster.Cluster``) given the URL that
lists all three nodes. While an updater, a generator and pods train torch Pendulum,
the test, for each cycle of the plan:

1. finds the node that leads the ``generator`` quorum queue and SIGKILLs its Erlang VM;
   waits until a checkpoint is stored with that node down, restarts it
   (``.ci/rabbitmq-cluster.sh start``) and waits until it is back in the cluster and
   both quorum queues have 3 online members again;
2. cuts one node off from the other two (``cluster_nodes.Nodes.partition``: the node
   leading the generator queue then, so the queue must elect a new leader), waits
   until a checkpoint is stored during the partition, heals it and waits for the
   cluster to be whole again.

Then ``control.stop`` ends the run and the ledger of ``tests/reliability`` must balance:
every initialization the generator published is stored, back in its queue or
dead-lettered with a reason; every checkpoint a pod saw confirmed is stored; no
leaderboard row is duplicated; every service is alive at the end and exits 0; and work
went on after every fault. The totals are printed and written to ``<tmp>/ledger.json``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.core.errors import ConfigError
from broker.core.settings import default_experiment
from broker.transports.sync_client import SyncClient
from tests.cluster.cluster_nodes import Nodes, delete_experiment, name, wait_for
from tests.reliability.reliability_cluster import Cluster
from tests.reliability.reliability_ledger import build_ledger

ENV = "torch/Pendulum-v1"


@dataclasses.dataclass(frozen=True)
class Plan:
    """How hard to shake the cluster."""

    pods: int
    cycles: int
    """Rounds of (kill the generator queue's leader, partition a node)."""
    round_s: float
    progress_s: float = 120.0
    """Longest wait for a stored checkpoint after a fault."""


SHORT = Plan(pods=2, cycles=1, round_s=3.0)
LONG = Plan(pods=3, cycles=4, round_s=4.0)


@dataclasses.dataclass
class Faults:
    """What the test did to the cluster, and what fell over by itself."""

    leader_kills: int = 0
    partitions: int = 0
    stored_with_node_down: int = 0
    stored_during_partition: int = 0
    stored_after_heal: int = 0
    phase_s: dict[str, float] = dataclasses.field(default_factory=dict)
    """Seconds each phase took (for the report, not asserted)."""
    killed_nodes: list[str] = dataclasses.field(default_factory=list)
    partitioned_nodes: list[str] = dataclasses.field(default_factory=list)
    crashes: list[str] = dataclasses.field(default_factory=list)


@contextlib.contextmanager
def _phase(faults: Faults, label: str) -> Iterator[None]:
    started = time.monotonic()
    try:
        yield
    finally:
        key = f"{label}_{len([k for k in faults.phase_s if k.startswith(label)]) + 1}"
        faults.phase_s[key] = round(time.monotonic() - started, 1)
        print(f"{_stamp()[:19]} {key}: {faults.phase_s[key]} s", flush=True)


def _stamp(at: float | None = None) -> str:
    """``at`` (default: now) as the services' log lines start (``%Y-%m-%d %H:%M:%S,mmm``:
    string order is time order)."""
    now = time.time() if at is None else at
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f",{int(now % 1 * 1000):03d}"


def _stored_since(cluster: Cluster, stamp: str) -> int:
    """``stored`` lines the updaters logged after ``stamp``."""
    return sum(1 for line in cluster.all_logs("updater").splitlines()
               if "stored " in line and line[:23] > stamp)


def _wait_progress(cluster: Cluster, faults: Faults, stamp: str, plan: Plan,
                   what: str) -> int:
    """Wait for a checkpoint stored since ``stamp`` while watching for crashes."""

    def progressed() -> int:
        _supervise(cluster, faults)
        return _stored_since(cluster, stamp)

    return int(wait_for(progressed, plan.progress_s, f"a checkpoint stored {what}"))


def _supervise(cluster: Cluster, faults: Faults) -> None:
    """Note (and restart) services that exited by themselves: each one fails the test."""
    for proc in cluster.crashed():
        note = f"{proc.name} exit {proc.popen.returncode}: " + " | ".join(
            proc.text().strip().splitlines()[-3:])[-400:]
        if note not in faults.crashes:
            faults.crashes.append(note)
            proc.killed = True  # handled: not reported again
            cluster.start(proc.role)


def _warnings(log: str, most: int = 40) -> str:
    """The WARNING and ERROR lines of a service's log (the last ``most``)."""
    lines = [line for line in log.splitlines() if " WARNING " in line or " ERROR " in line]
    return "\n".join(lines[-most:])


def _depth(client: SyncClient, queue: str) -> tuple[int, int]:
    """``(messages, consumers)`` of ``queue``; zeros while no service declared it yet."""
    try:
        stats = client.queue_stats(queue)
    except ConfigError:
        return 0, 0
    return stats.messages, stats.consumers


def _start_services(cluster: Cluster, client: SyncClient, plan: Plan) -> None:
    cluster.start("updater")
    cluster.start("generator")
    # ready: the updater consumes and the generator has stocked its queue
    wait_for(lambda: _depth(client, "updater")[1] >= 1, 120, "the updater to consume")
    wait_for(lambda: _depth(client, "generator")[0] >= 1, 120, "initializations")
    for _ in range(plan.pods):
        cluster.start("pod")
    wait_for(lambda: "stored " in cluster.all_logs("updater"), 150, "a first stored checkpoint")


def _kill_leader(cluster: Cluster, nodes: Nodes, queues: list[str], faults: Faults,
                 plan: Plan) -> None:
    victim = nodes.leader(queues[0])
    with _phase(faults, "kill"):
        stamp = _stamp(nodes.kill(victim, queues[0]))
    faults.leader_kills += 1
    faults.killed_nodes.append(name(victim))
    with _phase(faults, "progress_node_down"):
        faults.stored_with_node_down += _wait_progress(cluster, faults, stamp, plan,
                                                       f"with {name(victim)} down")
    with _phase(faults, "restart_node"):
        nodes.start()
        nodes.wait_healthy(queues)


def _partition_one(cluster: Cluster, nodes: Nodes, queues: list[str], faults: Faults,
                   plan: Plan) -> None:
    victim = nodes.leader(queues[0])
    with _phase(faults, "partition"):
        stamp = _stamp(nodes.partition(victim, queues[0]))
    faults.partitions += 1
    faults.partitioned_nodes.append(name(victim))
    assert nodes.connected_peers(victim) == set(), f"{name(victim)} still reaches its peers"
    with _phase(faults, "progress_partitioned"):
        faults.stored_during_partition += _wait_progress(
            cluster, faults, stamp, plan, f"while {name(victim)} is cut off")
    with _phase(faults, "heal"):
        nodes.heal(victim)
        healed = _stamp()
        nodes.wait_healthy(queues)
    with _phase(faults, "progress_healed"):
        faults.stored_after_heal += _wait_progress(cluster, faults, healed, plan,
                                                   "after the partition healed")


def _run(nodes: Nodes, experiment: str, tmp_path: Path, plan: Plan) -> None:
    url = nodes.url
    exp = default_experiment(ENV).with_overrides(
        name=experiment, algos={"ppo": 1, "sac": 1, "td3": 1}, pods=plan.pods,
        # the default 16 episodes: a would-be best is re-measured by the updater, and a
        # 4-episode claim of Pendulum ran 3.4 measured stds above the measurement once
        # (refused as a false claim, the round counted as lost)
        round_budget={"seconds": plan.round_s}, eval_episodes=16, device="cpu")
    cluster = Cluster(url, exp, tmp_path, random.Random(7))
    queues = [f"podracer.{experiment}.generator", f"podracer.{experiment}.updater"]
    faults = Faults()
    try:
        with _phase(faults, "start"), SyncClient(url, experiment) as client:
            _start_services(cluster, client, plan)
        nodes.wait_healthy(queues)
        for _ in range(plan.cycles):
            _kill_leader(cluster, nodes, queues, faults, plan)
            _partition_one(cluster, nodes, queues, faults, plan)
        _supervise(cluster, faults)
        dead = [p.name for p in cluster.procs if not p.killed and not p.alive()]
        with _phase(faults, "stop"):
            codes = cluster.stop_all("cluster test over")
    finally:
        cluster.terminate_all()
    live = next(n for n in (1, 2, 3) if nodes.booted(n))
    ledger = build_ledger(nodes.node_url(live), experiment, cluster.store,
                          cluster.all_logs("generator"), cluster.all_logs("pod"))
    delete_experiment(nodes.node_url(live), experiment)
    ledger.faults = {k: v for k, v in dataclasses.asdict(faults).items()
                     if not isinstance(v, list) or k.endswith("_nodes")}
    ledger.faults["service_crashes"] = len(faults.crashes)
    ledger.faults["services_at_stop"] = len(codes)
    totals = ledger.totals()
    ledger.write(tmp_path / "ledger.json")
    print(f"\ncluster ledger ({tmp_path / 'ledger.json'}):\n{json.dumps(totals, indent=2)}")

    assert not dead, f"services died before the stop: {dead}"
    assert not faults.crashes, faults.crashes
    failing = {n: code for n, code in codes.items() if code != 0}
    assert not failing, f"services did not exit 0 after control.stop: {failing}\n" + "\n".join(
        f"--- {p.name}: its warnings\n{_warnings(p.text())}\n--- {p.name}: its end\n"
        f"{p.text()[-1500:]}" for p in cluster.procs if p.name in failing)
    assert len(codes) == 2 + plan.pods, f"not every service was alive at the stop: {codes}"
    assert faults.leader_kills == faults.partitions == plan.cycles
    assert ledger.queued and ledger.rows > 0
    assert not ledger.vanished, f"initializations vanished: {sorted(ledger.vanished)}"
    assert not ledger.lost_checkpoints, f"confirmed but lost: {sorted(ledger.lost_checkpoints)}"
    assert ledger.rows == ledger.unique_rows == ledger.unique_init_ids, "duplicate rows"
    assert not ledger.in_queue["updater.dead"], "checkpoints were dead-lettered"


@pytest.mark.rabbitmq
@pytest.mark.timeout(330)
def test_tournament_survives_leader_kill_and_partition(
        rabbit_cluster: Nodes, experiment: str, tmp_path: Path) -> None:
    _run(rabbit_cluster, experiment, tmp_path, SHORT)


@pytest.mark.rabbitmq
@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_tournament_survives_leader_kills_and_partitions_long(
        rabbit_cluster: Nodes, experiment: str, tmp_path: Path) -> None:
    _run(rabbit_cluster, experiment, tmp_path, LONG)
