"""The charts of a tournament, drawn from its leaderboard store, and a one-line summary.

``write_report`` (the end of ``podracer train``) and ``podracer report --store DIR`` (any
store, also while its run is going; it only reads the store) draw two PNGs:

* ``tournament.png``: every checkpoint as a dot where its round ended, coloured by
  algorithm; a thin edge from each parent's dot to its child's (the child continued the
  parent's weights: a lineage); each round's in-round evaluations drawn faint behind; the
  leaderboard's best as a black step line; the target score dashed.
* ``throughput.png``: env steps per second of the whole population, and the pods
  training at once, over time, both stacked by algorithm.

Times are seconds since the run started: ``started_wall``, else the start of the earliest
round. A round is the checkpoints of one initialization (``init_id``): a long round's
intermediate bests (``<init>.<k>``) each hold the steps and seconds since the one before,
and the round's own checkpoint (id ``init_id``) the rest, with the round's eval curve.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker.core.errors import ConfigError
from broker.core.extras import MissingExtra, require
from leaderboard.store import Entry, LeaderboardStore

PALETTE = {"ppo": "tab:blue", "sac": "tab:orange", "td3": "tab:green", "ddpg": "tab:purple",
           "dqn": "tab:brown"}
"""Podracer's algorithms keep their colour from chart to chart and run to run."""
_SPARE = ("tab:pink", "tab:olive", "tab:cyan", "tab:gray")
TARGET_COLOUR = "crimson"


@dataclasses.dataclass(frozen=True)
class Summary:
    """What the store holds at the end of a run."""

    checkpoints: int
    best_score: float | None
    best_id: str | None
    charts: tuple[Path, ...] = ()
    """The PNGs drawn (none without checkpoints or without the ``viz`` extra)."""


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
                           sum(e.env_steps for e in group), own.curve))
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


def best_so_far(entries: list[Entry], start: float) -> tuple[list[float], list[float]]:
    """The leaderboard's best as it rose: (seconds since ``start``, score) at each rise."""
    xs: list[float] = []
    ys: list[float] = []
    for entry in sorted(entries, key=lambda e: e.created):
        if not ys or entry.score_mean > ys[-1]:
            xs.append(entry.created - start)
            ys.append(entry.score_mean)
    return xs, ys


def best_entry(entries: list[Entry]) -> Entry:
    """The leaderboard's best (ties to the earlier created, as the store ranks)."""
    return max(entries, key=lambda e: (e.score_mean, -e.created))


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def pyplot() -> Any:
    """``matplotlib.pyplot`` drawing to files (Agg); ``MissingExtra`` names the extra."""
    matplotlib = require("matplotlib", extra="viz", purpose="the charts")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_tournament(entries: list[Entry], start: float, path: Path,
                    target: float | None = None) -> None:
    """Draw ``tournament.png`` (see the module doc) to ``path``."""
    plt = pyplot()
    from matplotlib.lines import Line2D

    colour = colours(sorted({e.algorithm for e in entries}))
    by_id = {e.id: e for e in entries}
    fig, ax = plt.subplots(figsize=(10, 5.6))
    handles: list[Any] = []
    curves = [r for r in rounds(entries) if len(r.curve) > 1]
    for r in curves:
        ax.plot([r.start - start + t for t, _, _ in r.curve], [s for _, s, _ in r.curve],
                color=colour[r.algorithm], lw=1.4, alpha=0.25, marker="o", ms=2.5, zorder=1)
    edges = [(by_id[e.parent_id], e) for e in entries if e.parent_id in by_id]
    for parent, child in edges:
        ax.plot([parent.created - start, child.created - start],
                [parent.score_mean, child.score_mean], color=colour[child.algorithm], lw=0.8,
                alpha=0.6, zorder=2)
    for algorithm, c in colour.items():
        mine = [e for e in entries if e.algorithm == algorithm]
        handles.append(ax.scatter([e.created - start for e in mine], [e.score_mean for e in mine],
                                  s=34, color=c, edgecolors="white", linewidths=0.7, zorder=4,
                                  label=f"{algorithm} ({_n(len(mine), 'checkpoint')})"))
    if edges:
        handles.append(Line2D([], [], color="0.45", lw=0.8, label="parent → child"))
    if curves:
        handles.append(Line2D([], [], color="0.45", lw=1.4, alpha=0.35, marker="o", ms=2.5,
                              label="evaluations within a round"))
    xs, ys = best_so_far(entries, start)
    horizon = max(end_of(entries) - start, 1e-3)
    handles += ax.step([*xs, horizon], [*ys, ys[-1]], where="post", color="black", lw=2,
                       alpha=0.85, zorder=3, label="leaderboard best")
    if target is not None:
        handles.append(ax.axhline(target, color=TARGET_COLOUR, ls="--", lw=1.2, zorder=0,
                                  label=f"target {target:g}"))
    best = best_entry(entries)
    ax.annotate(f"best {best.score_mean:.1f} ({best.algorithm} {best.id[:8]})",
                (best.created - start, best.score_mean), xytext=(-6, 6),
                textcoords="offset points", ha="right", va="bottom", fontsize=8)
    ax.margins(y=0.08)
    ax.set_xlim(0, horizon * 1.02)
    ax.set_xlabel("seconds since the run started (each dot: a checkpoint, where its round ended)")
    ax.set_ylabel("evaluation score (mean return)")
    ax.set_title(f"Podracer tournament on {entries[0].env}: {_n(len(entries), 'checkpoint')}, "
                 f"best {best.score_mean:.1f}")
    ax.grid(alpha=0.3)
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8,
              frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_throughput(entries: list[Entry], start: float, path: Path) -> None:
    """Draw ``throughput.png`` (see the module doc) to ``path``."""
    plt = pyplot()
    from matplotlib.ticker import EngFormatter, MaxNLocator

    algorithms = sorted({e.algorithm for e in entries})
    colour = colours(algorithms)
    end = end_of(entries)
    times, total, pods = throughput_series(entries, start, end=end)
    per = {a: throughput_series([e for e in entries if e.algorithm == a], start, end=end)
           for a in algorithms}
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(10, 5.6),
                                      gridspec_kw={"height_ratios": [2, 1]})
    fills = [colour[a] for a in algorithms]
    edges = [t - times[0] for t in times] + [times[-1] + times[0]]  # cells drawn flat

    def cells(values: list[float]) -> list[float]:
        return [*values, values[-1]]

    top.stackplot(edges, [cells(per[a][1]) for a in algorithms], colors=fills, alpha=0.85,
                  labels=algorithms, lw=0, step="post")
    mean = sum(e.env_steps for e in entries) / (end - start)
    top.axhline(mean, color="black", ls="--", lw=1,
                label=f"mean {EngFormatter(places=1, sep='')(mean)} steps/s")
    top.yaxis.set_major_formatter(EngFormatter(sep=""))
    top.set_ylabel("env steps / s")
    top.set_ylim(0, max(total) * 1.15 or 1.0)
    steps = EngFormatter(places=1, sep="")(sum(e.env_steps for e in entries))
    top.set_title(f"Podracer throughput on {entries[0].env}: {steps} env steps in "
                  f"{_n(len(rounds(entries)), 'round')}")
    top.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    bottom.stackplot(edges, [cells(per[a][2]) for a in algorithms], colors=fills, alpha=0.85,
                     lw=0, step="post")
    bottom.yaxis.set_major_locator(MaxNLocator(integer=True))
    bottom.set_ylim(0, max(pods) + 0.5)
    bottom.set_ylabel("pods training")
    bottom.set_xlabel("seconds since the run started")
    bottom.set_xlim(0, (end - start) * 1.02)
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw(entries: list[Entry], out: Path, start: float,
         target: float | None = None) -> list[Path]:
    """Write both charts of ``entries`` (not empty) into ``out``; return their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "tournament.png", out / "throughput.png"]
    plot_tournament(entries, start, paths[0], target)
    if end_of(entries) > start:
        plot_throughput(entries, start, paths[1])
    else:
        paths.pop()
    return paths


def summary_line(entries: list[Entry], start: float) -> str:
    """One line: checkpoints, rounds, span, best, and the mean env steps per second."""
    best = best_entry(entries)
    span = end_of(entries) - start
    steps = sum(e.env_steps for e in entries)
    rate = f"; {steps / span:,.0f} env steps/s on average" if span > 0 else ""
    return (f"{_n(len(entries), 'checkpoint')} from {_n(len(rounds(entries)), 'round')} "
            f"over {span:.0f}s; best {best.score_mean:.1f} ({best.algorithm} {best.id[:12]}){rate}")


def write_report(out: Path, started_wall: float, *, target: float | None = None) -> Summary:
    """Write ``out/tournament.png`` and ``out/throughput.png`` from ``out``'s store.

    ``started_wall`` (epoch seconds) is time zero of both charts; ``target`` is drawn as
    a dashed line. Returns what the store holds. Without matplotlib (the ``viz`` extra)
    the run still ends well: one line says how to get the charts, and
    ``podracer report`` draws them later from the same store.
    """
    with LeaderboardStore(out) as store:
        entries = store.entries()
        best = store.best()
    charts: list[Path] = []
    if entries:
        try:
            charts = draw(entries, out, started_wall, target)
        except MissingExtra as exc:
            print(f"podracer: no charts drawn: {exc}; then `podracer report --store {out}`",
                  flush=True)
    return Summary(len(entries), best.score_mean if best else None, best.id if best else None,
                   tuple(charts))


def cmd_report(args: argparse.Namespace) -> int:
    """Redraw the charts of a store (read-only); print their paths and a summary."""
    chosen = args.store or os.environ.get("PODRACER_STORE")
    if not chosen:
        raise ConfigError("--store", "no store given", "pass --store runs/<experiment>")
    root = Path(chosen)
    try:
        store = LeaderboardStore(root, create=False)
    except ConfigError as exc:
        raise ConfigError("--store", exc.problem,
                          "pass --store with the run directory of an experiment") from None
    with store:
        entries = store.entries()
    if not entries:
        print(f"{root}: no checkpoints yet")
        return 0
    start = run_start(entries)
    for path in draw(entries, Path(args.chart_dir) if args.chart_dir else root, start, args.target):
        print(path)
    print(summary_line(entries, start))
    return 0


def add_command(sub: Any, add_common: Callable[[argparse.ArgumentParser], None]) -> None:
    """Register ``report`` on ``sub``."""
    p = sub.add_parser("report", help="draw a store's tournament and throughput charts")
    p.add_argument("--store", help="run directory holding the store (env PODRACER_STORE; "
                   "required)")
    p.add_argument("--target", type=float,
                   help="draw this target score as a dashed line (default: none)")
    p.add_argument("--chart-dir", help="directory for the PNGs (default: the store's)")
    add_common(p)
    p.set_defaults(func=cmd_report)
