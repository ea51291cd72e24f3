"""What the charts are drawn from: the rounds of a store's checkpoints, their throughput
and pods over time, the leaderboard's best, and the colours of the algorithms.

A round is the checkpoints of one initialization (``init_id``): a long round's
intermediate bests (``<init>.<k>``) each hold the steps and seconds since the one before,
and the round's own checkpoint (id ``init_id``) the rest, with the round's eval curve.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from broker.core.extras import require
from leaderboard.store import Entry

PALETTE = {"ppo": "tab:blue", "sac": "tab:orange", "td3": "tab:green", "ddpg": "tab:purple",
           "dqn": "tab:brown"}
"""Podracer's algorithms keep their colour from chart to chart and run to run."""
_SPARE = ("tab:pink", "tab:olive", "tab:cyan", "tab:gray")
TARGET_COLOUR = "crimson"
ANSWER_COLOUR = "gold"
"""The run's answer, when it is an ensemble (``leaderboard.answer``)."""


def env_label(env: str) -> str:
    """``env`` as a chart's title names it: without its query, and an env named by a path
    (a stock env's data file) by the file alone (a stock env's windows and costs ran 300
    characters past both edges of the figure); a registered name as it is."""
    path = env.partition("?")[0]
    kind, _, rest = path.partition("/")
    return f"{kind}/{rest.rsplit('/', 1)[-1]}" if "/" in rest else path


@dataclasses.dataclass(frozen=True)
class Round:
    """One round of training: the checkpoints of one initialization, as one time span."""

    init_id: str
    algorithm: str
    start: float
    """Epoch seconds: the end less the seconds of all its checkpoints."""
    end: float
    """Epoch seconds: when its last checkpoint was made."""
    env_steps: int
    curve: list[tuple[float, float, int]]
    """(seconds since ``start``, eval mean, env steps) of its in-round evaluations."""
    pod: str
    """The pod that trained it."""


def rounds(entries: list[Entry]) -> list[Round]:
    """The rounds of ``entries``, earliest start first."""
    groups: dict[str, list[Entry]] = {}
    for entry in entries:
        groups.setdefault(entry.init_id, []).append(entry)
    found = []
    for init_id, group in groups.items():
        end = max(e.created for e in group)
        own = next((e for e in group if e.id == init_id), group[-1])
        found.append(Round(init_id, own.algorithm, end - sum(e.wall_time for e in group), end,
                           sum(e.env_steps for e in group), own.curve, own.pod))
    return sorted(found, key=lambda r: r.start)


def run_start(entries: list[Entry]) -> float:
    """When the run started, as the store tells it: the start of its earliest round."""
    return min(r.start for r in rounds(entries))


def end_of(entries: list[Entry]) -> float:
    """When the last round of ``entries`` ended (epoch seconds)."""
    return max(r.end for r in rounds(entries))


def throughput_series(entries: list[Entry], start: float, points: int = 200,
                      end: float | None = None) -> tuple[list[float], list[float], list[float]]:
    """Env steps per second and pods (rounds training at once) on ``points`` equal cells.

    The cells cover ``start`` to ``end`` (epoch seconds; default: the last round's end). A
    round contributes ``env_steps / seconds`` over its span; each value is the mean over
    its cell, so the steps add up however the rounds fall on the grid. Returns (cell
    centres in seconds since ``start``, steps per second, pods); empty lists when the
    cells would have no width.
    """
    spans = [r for r in rounds(entries) if r.end > r.start]
    stop = max((r.end for r in spans), default=start) if end is None else end
    width = (stop - start) / points
    times: list[float] = []
    rates: list[float] = []
    pods: list[float] = []
    if width <= 0:
        return times, rates, pods
    for i in range(points):
        lo, hi = start + i * width, start + (i + 1) * width
        steps = running = 0.0
        for r in spans:
            overlap = min(hi, r.end) - max(lo, r.start)
            if overlap > 0:
                steps += r.env_steps * overlap / (r.end - r.start)
                running += overlap
        times.append((i + 0.5) * width)
        rates.append(steps / width)
        pods.append(running / width)
    return times, rates, pods


def colours(algorithms: list[str]) -> dict[str, str]:
    """A distinct colour for each algorithm."""
    others = [a for a in algorithms if a not in PALETTE]
    return {a: PALETTE.get(a) or _SPARE[others.index(a) % len(_SPARE)] for a in algorithms}


def best_rises(entries: list[Entry]) -> list[Entry]:
    """The checkpoints that raised the leaderboard's best, in the order they came."""
    rises: list[Entry] = []
    for entry in sorted(entries, key=lambda e: e.created):
        if not rises or entry.score_mean > rises[-1].score_mean:
            rises.append(entry)
    return rises


def best_so_far(entries: list[Entry], start: float) -> tuple[list[float], list[float]]:
    """The leaderboard's best as it rose: (seconds since ``start``, score) at each rise."""
    rises = best_rises(entries)
    return [e.created - start for e in rises], [e.score_mean for e in rises]


def spend_at(entries: list[Entry]) -> Callable[[float], float]:
    """The env steps the run had spent at a moment (epoch seconds): every checkpoint's
    steps, those of one still training then by the share of its span run so far (a
    round collects at a steady rate, near enough), so a round that ends while a long one
    runs beside it sits where the run was, not where the stored checkpoints were."""
    end = np.array([e.created for e in entries], dtype=np.float64)
    length = np.array([max(e.wall_time, 1e-9) for e in entries], dtype=np.float64)
    steps = np.array([e.env_steps for e in entries], dtype=np.float64)

    def at(moment: float) -> float:
        return float(steps @ np.clip((moment - end + length) / length, 0.0, 1.0))
    return at


def steps_so_far(entries: list[Entry]) -> dict[str, float]:
    """Checkpoint id -> the run's spend when it came (``spend_at``): the x of the charts'
    env-steps view."""
    at = spend_at(entries)
    return {e.id: at(e.created) for e in entries}


def pods_series(entries: list[Entry], start: float, end: float,
                points: int = 200) -> tuple[list[float], dict[str, list[int]]]:
    """Whole pods training at once, per algorithm, on ``points`` equal cells from ``start``
    to ``end``: the cell centres (seconds since ``start``) and, per algorithm, its pods at
    the moment of each cell when the most pods trained, each pod under the algorithm of
    its round then. (Each algorithm's own most in a cell, stacked, counted twice a pod
    that switched algorithm inside the cell: a 2-pod stock run showed 3 pods at three
    hand-overs.) A pod counts once at a moment, should two of its rounds touch there."""
    spans = [r for r in rounds(entries) if r.end > r.start]
    width = (end - start) / points
    if width <= 0:
        return [], {}
    times: list[float] = []
    per: dict[str, list[int]] = {a: [] for a in sorted({r.algorithm for r in spans})}
    for i in range(points):
        lo, hi = start + i * width, start + (i + 1) * width
        # the count only rises where a round starts, so the cell's most is at one of these
        marks = [lo] + [r.start for r in spans if lo < r.start < hi]
        busiest = max(({r.pod: r.algorithm for r in spans if r.start <= m < r.end and r.end > lo}
                       for m in marks), key=len)  # spans are in start order: the later wins
        for algorithm, counts in per.items():
            counts.append(sum(1 for a in busiest.values() if a == algorithm))
        times.append((i + 0.5) * width)
    return times, per


def best_entry(entries: list[Entry]) -> Entry:
    """The leaderboard's best (ties to the earlier created, as the store ranks)."""
    return max(entries, key=lambda e: (e.score_mean, -e.created))


def plural(count: int, noun: str) -> str:
    """``1 round``, ``2 rounds``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def pyplot() -> Any:
    """``matplotlib.pyplot`` drawing to files (Agg); ``MissingExtra`` names the extra."""
    matplotlib = require("matplotlib", extra="viz", purpose="the charts")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


