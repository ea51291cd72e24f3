"""``train --fresh`` never deletes a run that is still training (issue 22, item 6): the
running train holds the run directory's lock; ``--fresh`` names it and exits 2."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker.core.errors import ConfigError
from podracer.run_dir import LOCK_FILE, RUN_FILE, delete, has_run, holder, holding, refuse_if_live

pytestmark = pytest.mark.timeout(150)


def _podracer(cwd: Path, *args: str, **kw: object) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen([sys.executable, "-m", "podracer", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(condition: object, deadline_s: float, what: str) -> None:
    end = time.monotonic() + deadline_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_fresh_refuses_a_run_still_training(tmp_path: Path) -> None:
    out = tmp_path / "runs" / "live"
    train = ["train", "--env", "torch/Pendulum-v1", "--pods", "1", "--quiet", "--run-dir",
             str(out)]
    running = _podracer(tmp_path, *train, "--budget", "5m")
    try:
        _wait_for(lambda: has_run(out) and (out / LOCK_FILE).is_file()
                  and holder(out) == (str(running.pid), "`podracer train`"),
                  90, "the first train to record its session")
        before = sorted(p.name for p in out.iterdir())
        fresh = _podracer(tmp_path, *train, "--budget", "3s", "--fresh")
        stdout, stderr = fresh.communicate(timeout=90)
        assert fresh.returncode == 2, stdout + stderr
        assert "still running" in stderr and f"pid {running.pid}" in stderr
        assert "deleted the earlier run" not in stdout
        assert running.poll() is None, "the running train was disturbed"
        assert (out / RUN_FILE).is_file()
        assert set(before) <= {p.name for p in out.iterdir()}
    finally:
        running.send_signal(signal.SIGINT)
        running.communicate(timeout=60)
    refuse_if_live(out, "--fresh")  # the lock went with the process: no stale refusal


def test_delete_refuses_a_held_run_and_deletes_a_released_one(tmp_path: Path) -> None:
    """What ``--fresh`` and the benchmarks delete a run with: not while a train holds it
    (two benchmark invocations on one runs/ directory once trained into one store)."""
    out = tmp_path / "run"
    with holding(out):
        (out / "leaderboard.sqlite").write_text("the live run's store")
        with pytest.raises(ConfigError, match="still running"):
            delete(out, "out")
        assert (out / "leaderboard.sqlite").is_file()
    delete(out, "out")
    assert not out.exists()


def test_a_benchmark_holding_its_directory_is_named_in_the_refusal(tmp_path: Path) -> None:
    """Two invocations of one benchmark on one runs/ directory: the second is refused,
    naming the first (they once both wrote its results.json)."""
    by = "`python -m benchmarks.tournament`"
    with holding(tmp_path, by=by, flag="working directory"):
        with pytest.raises(ConfigError, match=r"benchmarks\.tournament` \(pid \d+\), "
                           "still running") as refused, \
                holding(tmp_path, by=by, flag="working directory"):
            pass
        assert refused.value.field == "working directory"
    with holding(tmp_path):  # released when the first ended
        assert holder(tmp_path) == (str(os.getpid()), "`podracer train`")
