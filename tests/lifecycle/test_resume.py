"""An experiment's whole life on RabbitMQ: interrupted halfway, resumed, finished clean.

``podracer train --broker`` runs every service as its own process (one pod). The test
interrupts it halfway through its time budget, once with SIGINT to ``train`` (Ctrl-C)
and once with SIGKILL to its whole process group (a killed terminal), then resumes it
with ``podracer train --resume`` and reads what the store and the broker show.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pika
import pika.exceptions
import pytest

from leaderboard.store import Entry, LeaderboardStore, spent

BUDGET_S = 24.0
ROUND_S = 4.0
EXPERIMENT = f"""
env = "torch/Pendulum-v1"
pods = 1
eval_episodes = 8
[algos]
ppo = 1
[round_budget]
seconds = {ROUND_S}
[total_budget]
seconds = {BUDGET_S}
"""
WORK_QUEUES = ("generator", "updater")
QUEUES = (*WORK_QUEUES, "generator.dead", "updater.dead")


def _train(args: list[str], amqp_url: str) -> subprocess.Popen[str]:
    # a session of its own: SIGKILL of the group reaches train and every service
    return subprocess.Popen([sys.executable, "-m", "podracer", "train", *args, "--quiet",
                             "--threads", "1", "--broker", amqp_url],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _stored(out: Path) -> int:
    if not (out / "leaderboard.sqlite").is_file():
        return 0
    with LeaderboardStore(out) as store:
        return store.count()


def _wait_for_checkpoints(out: Path, n: int, proc: subprocess.Popen[str],
                          timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while _stored(out) < n:
        assert proc.poll() is None, f"train ended: {proc.stdout.read() if proc.stdout else ''}"
        assert time.monotonic() < deadline, f"fewer than {n} checkpoints in {timeout:.0f} s"
        time.sleep(0.2)


def _queues(amqp_url: str, experiment: str) -> dict[str, int]:
    """Queue -> ready messages, for the experiment's queues that exist."""
    found = {}
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        for queue in QUEUES:
            channel = connection.channel()
            try:
                ok = channel.queue_declare(f"podracer.{experiment}.{queue}", passive=True)
            except pika.exceptions.ChannelClosedByBroker:
                continue
            found[queue] = ok.method.message_count
            channel.close()
    finally:
        connection.close()
    return found


def _snapshot(out: Path) -> tuple[set[str], Entry, int]:
    with LeaderboardStore(out) as store:
        entries = store.entries()
        best = store.best()
    assert best is not None
    return {e.id for e in entries}, best, max(e.generation for e in entries)


def _was_measured_again(out: Path, before: Entry) -> bool:
    with LeaderboardStore(out) as store:
        now = store.get(before.id)
    return now is not None and now.reevaluated and now.score_mean < before.score_mean


def _logs(out: Path) -> str:
    return "\n".join(f"== {p.name}\n{p.read_text()}" for p in sorted((out / "logs").glob("*.log")))


def _ps() -> str:
    """The podracer processes still running (a pod leads its own session)."""
    ps = subprocess.run(["ps", "-eo", "pid,ppid,pgid,etimes,args"], capture_output=True,
                        text=True, timeout=30)
    return "\n".join(line for line in ps.stdout.splitlines() if "podracer" in line)


def _sessions(out: Path) -> list[dict[str, object]]:
    sessions = json.loads((out / "run.json").read_text())["sessions"]
    assert isinstance(sessions, list)
    return sessions


@pytest.mark.rabbitmq
@pytest.mark.timeout(420)
@pytest.mark.parametrize("how", ["sigint", "sigkill"])
def test_interrupted_run_resumes_to_one_continuous_run(
        how: str, amqp_url: str, experiment: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    exp_file = tmp_path / "exp.toml"
    exp_file.write_text(f'name = "{experiment}"\n' + EXPERIMENT)
    first = _train([str(exp_file), "--run-dir", str(out)], amqp_url)
    try:
        _wait_for_checkpoints(out, 3, first)  # about half the budget: rounds left to resume
        if how == "sigint":
            first.send_signal(signal.SIGINT)
        else:
            os.killpg(first.pid, signal.SIGKILL)
        output, _ = first.communicate(timeout=150)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    before_ids, before, before_generation = _snapshot(out)
    if how == "sigint":
        assert first.returncode == 0, output[-3000:]
        assert "--resume" in output
        assert _sessions(out)[-1]["state"] == "interrupted"
        # a stop leaves no work waiting: the generator drained, train cleaned up
        assert all(_queues(amqp_url, experiment).get(q, 0) == 0 for q in WORK_QUEUES)
    else:
        assert "ended" not in _sessions(out)[-1]  # nobody lived to write it
    ls = subprocess.run([sys.executable, "-m", "podracer", "ls", "--runs", str(tmp_path)],
                        capture_output=True, text=True, timeout=60)
    assert ls.returncode == 0 and "interrupted" in ls.stdout, ls.stdout + ls.stderr

    # the same command again refuses to mix two runs
    again = subprocess.run([sys.executable, "-m", "podracer", "train", str(exp_file),
                            "--run-dir", str(out), "--broker", amqp_url, "--quiet"],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "--resume" in again.stderr and "--fresh" in again.stderr

    second = _train(["--resume", str(out)], amqp_url)
    try:
        output, _ = second.communicate(timeout=240)
    except subprocess.TimeoutExpired as exc:  # what each service was doing when it hung
        os.killpg(second.pid, signal.SIGKILL)
        pytest.fail(f"the resumed run did not end in 240 s: {exc.output!r}\n"
                    f"{_ps()}\n{_logs(out)[-12000:]}")
    finally:
        if second.poll() is None:
            os.killpg(second.pid, signal.SIGKILL)
    logs = _logs(out)
    assert second.returncode == 0, output[-3000:] + logs[-4000:]
    assert "resuming" in output and "time budget spent" in output

    after_ids, after, after_generation = _snapshot(out)
    assert before_ids < after_ids  # nothing lost, more added
    with LeaderboardStore(out) as store:
        entries = store.entries()
        done = spent(store)
        # one continuous run: no round twice, lineages carried on across the restart
        finals = [e.init_id for e in entries if e.id == e.init_id]
        assert len(finals) == len(set(finals))
        resumed = [e for e in entries if e.id not in before_ids]
        assert any(e.parent_id in before_ids for e in resumed), "no lineage was continued"
        for entry in resumed:
            if entry.parent_id is not None:
                parent = store.get(entry.parent_id)
                assert parent is not None and entry.generation == parent.generation + 1
    assert after_generation > before_generation
    # the best falls only by the final measurement of the top (``leaderboard.updater``):
    # the entry that led before the restart is kept, at its score or measured again
    assert after.score_mean >= before.score_mean or _was_measured_again(out, before)
    # the budget spent in total: the asked one, within one round (plus a start-up)
    assert BUDGET_S - 2 * ROUND_S <= done.seconds <= BUDGET_S + 2 * ROUND_S, done
    sessions = _sessions(out)
    print(f"{how}: {len(before_ids)} checkpoints before, {len(after_ids)} after; best "
          f"{before.score_mean:.1f} -> {after.score_mean:.1f}; generation {before_generation} -> "
          f"{after_generation}; spent {done.seconds:.1f} s of {BUDGET_S:.0f} s")
    assert len(sessions) == 2 and sessions[-1]["state"] == "finished"
    # a clean end: every queue of the experiment is gone (they were all empty)
    assert _queues(amqp_url, experiment) == {}, logs[-3000:]
