"""What a resume reads from the store, and embedded mode's resume end to end."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from broker.core.errors import ConfigError
from broker.core.experiment import TotalBudget
from broker.core.schemas import Checkpoint
from broker.core.settings import default_experiment
from leaderboard.store import LeaderboardStore, spent
from podracer.train import already_done, has_run, time_left

pytestmark = pytest.mark.timeout(60)


def _checkpoint(i: int, created: float, seconds: float, score: float,
                parent: str | None = None, generation: int = 0) -> Checkpoint:
    return Checkpoint(id=f"c{i}", experiment="e", init_id=f"c{i}", pod="pod-1",
                      algorithm="ppo", env="torch/Pendulum-v1", hparams={"lr": 3e-4},
                      state={"w": torch.ones(4)}, score_mean=score, score_std=0.0,
                      env_steps=1000, wall_time=seconds, created=created,
                      parent_id=parent, generation=generation)


def test_spent_counts_training_time_not_the_gap_between_sessions(tmp_path: Path) -> None:
    with LeaderboardStore(tmp_path) as store:
        assert spent(store).seconds == 0 and spent(store).best is None
        # session 1: two pods, overlapping rounds over [0, 12]; session 2 after a
        # 1000 s gap: one round of 5 s
        for cp in (_checkpoint(1, 110.0, 10.0, -300.0), _checkpoint(2, 112.0, 8.0, -250.0),
                   _checkpoint(3, 1117.0, 5.0, -200.0, parent="c2", generation=1)):
            store.insert(cp)
        done = spent(store)
    assert done.seconds == pytest.approx(17.0)
    assert done.checkpoints == 3 and done.env_steps == 3000 and done.generation == 1
    assert done.best is not None and done.best.id == "c3"
    assert done.started == pytest.approx(100.0) and done.last == pytest.approx(1117.0)


def test_time_left_and_already_done(tmp_path: Path) -> None:
    exp = default_experiment("torch/Pendulum-v1").with_overrides(
        total_budget={"seconds": 60.0, "env_steps": 10_000}, target_score=-150.0)
    with LeaderboardStore(tmp_path) as store:
        store.insert(_checkpoint(1, 120.0, 20.0, -300.0))
        done = spent(store)
    assert already_done(exp, done) is None
    left = time_left(exp, done)
    assert left.total_budget == TotalBudget(seconds=40.0, env_steps=10_000)
    assert left.round_budget == exp.round_budget  # rounds keep the asked length
    assert "target" in (already_done(dataclasses.replace(exp, target_score=-400.0), done) or "")
    steps = exp.with_overrides(total_budget={"env_steps": 1000})
    assert "env-step budget" in (already_done(steps, done) or "")


def test_has_run(tmp_path: Path) -> None:
    assert not has_run(tmp_path / "nothing")
    with LeaderboardStore(tmp_path / "empty"):
        pass
    assert not has_run(tmp_path / "empty")  # a store without checkpoints is no run yet
    (tmp_path / "sessions").mkdir()
    (tmp_path / "sessions" / "run.json").write_text(json.dumps({"sessions": []}))
    assert has_run(tmp_path / "sessions")


def test_resume_needs_a_run_and_no_conflicting_flags(tmp_path: Path) -> None:
    from podracer.cli import main

    assert main(["train", "--resume", str(tmp_path / "none")]) == 2
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "experiment.json").write_text("{}")
    with pytest.raises(ConfigError, match="--fresh"):
        from podracer.cli import _resume_args, build_parser

        _resume_args(build_parser().parse_args(["train", "--resume", str(tmp_path / "run"),
                                                "--fresh"]))


@pytest.mark.timeout(240)
def test_embedded_run_resumes_its_lineages(tmp_path: Path) -> None:
    out = tmp_path / "run"
    base = [sys.executable, "-m", "podracer", "train", "--quiet", "--threads", "1"]
    first = subprocess.run([*base, "--env", "torch/Pendulum-v1", "--algos", "ppo",
                            "--pods", "1", "--budget", "12s", "--round-budget", "6s",
                            "--run-dir", str(out), "--name", "lc-embedded"],
                           capture_output=True, text=True, timeout=200)
    assert first.returncode == 0, first.stdout + first.stderr
    with LeaderboardStore(out) as store:
        before = {e.id: e for e in store.entries()}
    second = subprocess.run([*base, "--resume", str(out), "--budget", "24s"],
                            capture_output=True, text=True, timeout=200)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "resuming lc-embedded" in second.stdout
    with LeaderboardStore(out) as store:
        entries = store.entries()
        done = spent(store)
    new = [e for e in entries if e.id not in before]
    assert new and any(e.parent_id in before for e in new)
    assert max(e.generation for e in new) > max(e.generation for e in before.values())
    assert 24.0 - 6.0 <= done.seconds <= 24.0 + 6.0, done.seconds  # within one round
    sessions = json.loads((out / "run.json").read_text())["sessions"]
    assert [s["state"] for s in sessions] == ["finished", "finished"]
