"""Resume accounting of ``podracer train --resume``: what a run has spent, what is left.

A resumed run carries on from its store: the planner derives lineages and generations
from it; the time budget left is the asked one minus ``leaderboard.store.spent`` (the
env-step budget and the target are checked against the store's totals and best
anyway); the progress view, TensorBoard and the charts continue on the first session's
time axis (``continue_monitor``). A round that was waiting or in flight when the run
died is re-issued (the generator purges what it did not issue itself); a checkpoint a
pod had published but the updater had not stored is stored now. Replay rows
(``agents.pod.continuity.ReplayCache``) lived in the dead processes: a resumed lineage
continues from its stored weights, optimizer state and hyperparameters with an empty
replay buffer (unless ``checkpoint_replay``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from broker.core.experiment import Experiment, TotalBudget
from leaderboard.store import LeaderboardStore, Spent, spent
from orchestrator.policy import StopCondition
from podracer import console
from podracer.monitor import Monitor


def spent_in(out: Path) -> Spent:
    """What the run in ``out`` has spent so far (from its store)."""
    with LeaderboardStore(out) as store:
        return spent(store)


def already_done(experiment: Experiment, done: Spent) -> str | None:
    """Why a run that has spent ``done`` is over already (None: it can go on)."""
    return StopCondition.from_experiment(experiment).check(
        done.best.score_mean if done.best else None, done.seconds, done.env_steps)


def time_left(experiment: Experiment, done: Spent) -> Experiment:
    """``experiment`` with the time budget reduced by what ``done`` spent (the env-step
    budget and the target are checked against the store's totals anyway)."""
    total = experiment.total_budget
    if total.seconds is None:
        return experiment
    left = TotalBudget(seconds=max(1.0, total.seconds - done.seconds), env_steps=total.env_steps)
    return dataclasses.replace(experiment, total_budget=left)


def describe(experiment: Experiment, done: Spent) -> str:
    """The line that says what a resumed run carries on from."""
    return (f"resuming {experiment.name}: {console.plural(done.checkpoints, 'checkpoint')}, "
            f"generation {done.generation}, best "
            f"{console.score(done.best.score_mean if done.best else None)}, "
            f"{console.duration(done.seconds)} and {done.env_steps:,} env steps spent")


def continue_monitor(monitor: Monitor, done: Spent) -> None:
    """One time axis and the stored best, from the first session on."""
    monitor.started -= done.seconds
    monitor.best_score = done.best.score_mean if done.best else None
    monitor.checkpoints, monitor.total_env_steps = done.checkpoints, done.env_steps
