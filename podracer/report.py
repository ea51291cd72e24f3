"""After a run: the learning-curve PNG and a summary, read back from the store."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from leaderboard.store import Entry, LeaderboardStore

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Summary:
    """What the store holds at the end of a run."""

    checkpoints: int
    best_score: float | None
    best_id: str | None


def plot_learning_curve(entries: list[Entry], started_wall: float, path: Path) -> None:
    """Score vs wall time: each pod's checkpoints, and the leaderboard's best so far."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    by_pod: dict[str, list[Entry]] = {}
    for entry in entries:
        by_pod.setdefault(entry.pod, []).append(entry)
    for pod, items in sorted(by_pod.items()):
        xs = [e.stored - started_wall for e in items]
        ax.plot(xs, [e.score_mean for e in items], marker="o", ms=3, lw=0.8, alpha=0.6,
                label=pod)
    best_x: list[float] = []
    best_y: list[float] = []
    best = float("-inf")
    for entry in entries:
        if entry.score_mean > best:
            best = entry.score_mean
            best_x.append(entry.stored - started_wall)
            best_y.append(best)
    if best_x:
        ax.step(best_x, best_y, where="post", color="black", lw=2, label="leaderboard best")
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("evaluation score (mean return)")
    ax.set_title("Podracer tournament")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(out: Path, started_wall: float) -> Summary:
    """Write ``out/learning_curve.png`` from ``out``'s store; return a summary."""
    with LeaderboardStore(out) as store:
        entries = store.entries()
        best = store.best()
    if entries:
        plot_learning_curve(entries, started_wall, out / "learning_curve.png")
    return Summary(len(entries), best.score_mean if best else None, best.id if best else None)
