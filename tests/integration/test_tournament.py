"""A whole tournament on torch Pendulum, end to end, on RabbitMQ and in memory.

On RabbitMQ every service is its own OS process: ``podracer train --broker`` starts the
updater, generator and orchestrator as ``podracer serve <role>`` processes, and the
orchestrator starts three pod processes. The test then reads what they left behind:
the leaderboard store, the broker's queues and every process's log.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pika
import pika.exceptions
import pytest

from broker.core.topology import Topology
from leaderboard.store import Entry, LeaderboardStore

TARGET = -400.0
# Short rounds (40k env steps or 4 s, whichever comes first) so that no single fresh
# round reaches the target: it takes several generations of PBT to get there.
EXPERIMENT = f"""
env = "torch/Pendulum-v1"
pods = 3
target_score = {TARGET}
explore_p = 0.1
eval_episodes = 16
[algos]
ppo = 1
sac = 1
td3 = 1
[round_budget]
steps = 40_000
seconds = 4
[total_budget]
seconds = 300
[selection]
name = "tournament"
size = 2
"""
ARGS = ["--threads", "1", "--quiet"]


def _experiment_file(tmp_path: Path, name: str) -> Path:
    path = tmp_path / "experiment.toml"
    path.write_text(f'name = "{name}"\n' + EXPERIMENT)
    return path


def _check_store(out: Path) -> list[Entry]:
    """The invariants every finished tournament's store must hold."""
    with LeaderboardStore(out) as store:
        entries = store.entries()
        ids = {e.id for e in entries}
        # no duplicates: one row per checkpoint, and one round's own row per
        # initialization (a long round adds intermediate bests <init>.<k> before it)
        assert len(ids) == len(entries) == store.count()
        finals = [e for e in entries if e.id == e.init_id]
        assert len({e.init_id for e in finals}) == len(finals)
        assert all(e.id.startswith(e.init_id + ".") for e in entries if e.id != e.init_id)
        # children point to their parents, one generation further
        children = [e for e in entries if e.parent_id is not None]
        for child in children:
            parent = store.get(child.parent_id or "")
            assert parent is not None, f"{child.id} points to a missing parent"
            assert child.generation == parent.generation + 1
            assert child.algorithm == parent.algorithm
            assert store.lineage(child.id)[-1].parent_id is None
        # the best improved over the rounds and reached the target
        best_so_far = []
        best = float("-inf")
        for entry in entries:
            best = max(best, entry.score_mean)
            best_so_far.append(best)
        assert best >= TARGET
        assert best > best_so_far[0], "the leaderboard's best never improved"
        assert children, "no pod ever trained from a leaderboard entry"
        for entry in entries:  # the blob of every row is there and verifies
            assert store.load_state(entry)
    assert (out / "tournament.png").stat().st_size > 0
    assert (out / "throughput.png").stat().st_size > 0
    return entries


@pytest.mark.rabbitmq
@pytest.mark.timeout(420)
def test_tournament_on_rabbitmq_in_separate_processes(
        amqp_url: str, experiment: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    env = {**os.environ, "PODRACER_LOG_LEVEL": "INFO"}
    proc = subprocess.run(
        [sys.executable, "-m", "podracer", "train", str(_experiment_file(tmp_path, experiment)),
         *ARGS, "--broker", amqp_url, "--run-dir", str(out)],
        env=env, capture_output=True, text=True, timeout=400)
    logs = out / "logs"
    all_logs = "\n".join(p.read_text() for p in sorted(logs.glob("*.log")))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + all_logs[-5000:]
    assert "target score reached" in proc.stdout

    entries = _check_store(out)
    stored = {e.id for e in entries}
    # every checkpoint a pod published is in the store
    published = set(re.findall(r"round (\w+) published", all_logs))
    pod_logs = sorted(logs.glob("pod-*.log"))
    assert len(pod_logs) >= 3, "the orchestrator started fewer than 3 pod processes"
    short = {s[:8] for s in stored}
    assert published, "no pod published a checkpoint"
    assert published <= short, f"published but not stored: {published - short}"
    # every process stopped with exit code 0: services (returncode above) and pods
    orchestrator_log = (logs / "orchestrator.log").read_text()
    assert "crashed" not in orchestrator_log
    assert set(re.findall(r"stopped \(exit (-?\d+)\)", orchestrator_log)) <= {"0"}
    for pod_log in pod_logs:
        assert re.search(r"stopped after \d+ rounds", pod_log.read_text()), pod_log.name
    # nothing left behind: a clean end deletes every queue that is empty and unused
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        for queue in Topology(experiment).queues:
            channel = connection.channel()
            with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="NOT_FOUND"):
                channel.queue_declare(queue, passive=True)
    finally:
        connection.close()


@pytest.mark.timeout(420)
def test_tournament_in_memory_mode(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "podracer", "train",
         str(_experiment_file(tmp_path, "memtournament")), *ARGS, "--run-dir", str(out)],
        capture_output=True, text=True, timeout=400)
    log = (out / "logs" / "train.log").read_text()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + log[-5000:]
    assert "target score reached" in proc.stdout
    # the console keeps the progress view; the services' lines go to the run's logs
    assert " INFO " not in proc.stderr
    _check_store(out)
    published = set(re.findall(r"round (\w+) published", log))
    with LeaderboardStore(out) as store:
        short = {e.id[:8] for e in store.entries()}
    assert published and published <= short
    assert len(set(re.findall(r"(pod-\d+): stopped after \d+ rounds", log))) >= 3
