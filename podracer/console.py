"""How ``podracer train`` writes quantities on the console: one precision per quantity,
counts with their plural, the budget and what is left of it.

Scores get one decimal everywhere on the console (the leaderboard table keeps two, with
the standard deviation); durations one decimal under a minute, then ``4m05s``; env steps
with thousands separators.
"""

from __future__ import annotations

from broker.core.experiment import Experiment, TotalBudget


def plural(count: int, noun: str) -> str:
    """``1 pod``, ``3 pods``, ``0 checkpoints``."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def score(value: float | None) -> str:
    """A score as the console shows it (``-`` when there is none yet)."""
    return "-" if value is None else f"{value:.1f}"


def duration(seconds: float) -> str:
    """``9.4 s``, ``4m05s``, ``1h02m``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def budget(total: TotalBudget) -> str:
    """The total budget: ``5m00s``, ``200,000 env steps``, both, or ``none``."""
    parts = ([duration(total.seconds)] if total.seconds is not None else []) + (
        [f"{total.env_steps:,} env steps"] if total.env_steps is not None else [])
    return " or ".join(parts) or "none"


def left(experiment: Experiment, elapsed: float, env_steps: int) -> str:
    """What is left of the budget, whichever runs out first (``""`` without a budget)."""
    total = experiment.total_budget
    parts = []
    if total.seconds is not None:
        parts.append(f"{duration(max(0.0, total.seconds - elapsed))} left")
    if total.env_steps is not None:
        parts.append(f"{max(0, total.env_steps - env_steps):,} env steps left")
    return " or ".join(parts)


def target(experiment: Experiment) -> str:
    """``target -200`` or ``no target``."""
    value = experiment.target_score
    return "no target" if value is None else f"target {value:g}"
