"""The charts of a tournament, drawn from its leaderboard store, and a one-line summary.

``write_report`` (the end of ``podracer train``) and ``podracer report --store DIR`` (any
store, also while its run is going; it only reads the store) draw two PNGs
(``podracer.charts``):

* ``tournament.png``: the checkpoints over seconds since the run started, and the same
  over the env steps the run had spent, with each lineage's edges, the in-round
  evaluations, the leaderboard's best with its evaluation spread, and the target;
* ``throughput.png``: each algorithm's env steps per second in a panel of its own, and
  the whole pods training at once, stacked by algorithm.

Times are seconds since the run started: ``started_wall``, else the start of the earliest
round (``podracer.chart_data``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker.core.errors import ConfigError
from broker.core.extras import MissingExtra
from leaderboard.answer import Answer, answer_of, current
from leaderboard.store import Entry, LeaderboardStore, short_id
from podracer.chart_data import (  # noqa: F401  (re-exported: the report's data helpers)
    PALETTE,
    Round,
    best_entry,
    best_so_far,
    colours,
    end_of,
    plural,
    pyplot,
    rounds,
    run_start,
    throughput_series,
)
from podracer.charts import plot_throughput, plot_tournament


@dataclasses.dataclass(frozen=True)
class Summary:
    """What the store holds at the end of a run."""

    checkpoints: int
    best_score: float | None
    """The run's answer's score (``leaderboard.answer``): its best checkpoint's, or the
    ensemble's that measured better."""
    best_id: str | None
    charts: tuple[Path, ...] = ()
    """The PNGs drawn (none without checkpoints or without the ``viz`` extra)."""
    answer: Answer | None = None
    """The run's answer (None while the store is empty)."""


def draw(entries: list[Entry], out: Path, start: float,
         target: float | None = None, answer: Answer | None = None) -> list[Path]:
    """Write both charts of ``entries`` (not empty) into ``out``; return their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "tournament.png", out / "throughput.png"]
    plot_tournament(entries, start, paths[0], target, answer)
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
    return (f"{plural(len(entries), 'checkpoint')} from {plural(len(rounds(entries)), 'round')} "
            f"over {span:.0f}s; best {best.score_mean:.1f} ({best.algorithm} "
            f"{short_id(best.id)}){rate}")


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
        chosen = answer_of(store)
    charts: list[Path] = []
    if entries:
        try:
            charts = draw(entries, out, started_wall, target, chosen)
        except MissingExtra as exc:
            print(f"podracer: no charts drawn: {exc}; then `podracer report --store {out}`",
                  flush=True)
    return Summary(len(entries), chosen.score_mean if chosen else None,
                   best.id if best else None, tuple(charts), chosen)


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
        answer = current(store)
    if not entries:
        print(f"{root}: no checkpoints yet")
        return 0
    start = run_start(entries)
    for path in draw(entries, Path(args.chart_dir) if args.chart_dir else root, start,
                     args.target, answer):
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
