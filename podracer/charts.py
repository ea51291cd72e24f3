"""The two PNGs of a tournament (``podracer.report`` says when they are drawn).

* ``tournament.png``, two panels with one legend: every checkpoint as a dot coloured by
  algorithm, over the seconds since the run started (where its round ended) and over the
  env steps the run had spent when it came (rounds still training then counted by the
  share of their span run so far: ``chart_data.spend_at``); a thin edge from each parent
  to its child (a lineage); each round's in-round evaluations faint behind; the
  leaderboard's best as a black step line in a band, with error bars, of its evaluation's
  standard deviation (the spread of the episodes that scored it); the target dashed; a
  gold star at the run's end when its answer is an ensemble of its top
  (``leaderboard.answer``). Legend samples carry the series' colours.
* ``throughput.png``: one small panel per algorithm with its env steps per second on a
  scale of its own (PPO's 170k steps/s would flatten SAC's 3k on a shared one), and one
  of the pods training at once, whole pods, stacked by algorithm.

``tournament_figure`` and ``throughput_figure`` return the figure (tests read its axes);
``plot_*`` write it to a file.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from leaderboard.answer import Answer
from leaderboard.store import Entry, short_id
from podracer.chart_data import (
    ANSWER_COLOUR,
    TARGET_COLOUR,
    best_entry,
    best_rises,
    colours,
    end_of,
    env_label,
    plural,
    pods_series,
    pyplot,
    rounds,
    spend_at,
    steps_so_far,
    throughput_series,
)

Where = Callable[[Entry], float]
"""The x of a checkpoint in one panel."""


def _lineages(ax: Any, entries: list[Entry], x: Where, colour: dict[str, str],
              curve_x: Callable[[Any, float, int], float | None]) -> tuple[bool, bool]:
    """In-round curves and parent edges; returns whether there were any of each."""
    by_id = {e.id: e for e in entries}
    curves = [r for r in rounds(entries) if len(r.curve) > 1]
    for r in curves:
        points = [(curve_x(r, t, steps), s) for t, s, steps in r.curve]
        ax.plot([px for px, _ in points if px is not None],
                [s for px, s in points if px is not None], color=colour[r.algorithm], lw=1.4,
                alpha=0.25, marker="o", ms=2.5, zorder=1)
    edges = [(by_id[e.parent_id], e) for e in entries if e.parent_id in by_id]
    for parent, child in edges:
        ax.plot([x(parent), x(child)], [parent.score_mean, child.score_mean],
                color=colour[child.algorithm], lw=0.8, alpha=0.6, zorder=2)
    return bool(curves), bool(edges)


def _best(ax: Any, entries: list[Entry], x: Where, horizon: float) -> Any:
    """The leaderboard's best as a step line in its ± evaluation-std band."""
    rises = best_rises(entries)
    xs = [x(e) for e in rises] + [horizon]
    mean = [e.score_mean for e in rises] + [rises[-1].score_mean]
    std = [e.score_std for e in rises] + [rises[-1].score_std]
    ax.fill_between(xs, [m - s for m, s in zip(mean, std, strict=True)],
                    [m + s for m, s in zip(mean, std, strict=True)], step="post",
                    color="black", alpha=0.12, lw=0, zorder=0)
    # each rise's own spread as an error bar: the last one's band has no width
    ax.errorbar(xs[:-1], mean[:-1], yerr=std[:-1], fmt="none", ecolor="black", elinewidth=1,
                capsize=3, alpha=0.7, zorder=3)
    return ax.step(xs, mean, where="post", color="black", lw=2, alpha=0.85, zorder=3)[0]


def tournament_figure(entries: list[Entry], start: float, target: float | None = None,
                      answer: Answer | None = None) -> Any:
    """The figure of ``tournament.png`` (see the module doc); an ``answer`` that is an
    ensemble (``leaderboard.answer``) is a star at the run's right edge."""
    plt = pyplot()
    from matplotlib.legend_handler import HandlerTuple
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import EngFormatter

    colour = colours(sorted({e.algorithm for e in entries}))
    spent = steps_so_far(entries)
    at = spend_at(entries)
    fig, (by_time, by_steps) = plt.subplots(2, 1, sharey=True, figsize=(10, 8.4))

    def steps_curve(r: Any, t: float, _steps: int) -> float | None:
        return at(r.start + t)  # where the run was when the round evaluated

    views: list[tuple[Any, Where, Callable[[Any, float, int], float | None], float]] = [
        (by_time, lambda e: e.created - start, lambda r, t, _s: r.start - start + t,
         max(end_of(entries) - start, 1e-3)),
        (by_steps, lambda e: spent[e.id], steps_curve, max(spent.values()))]
    best = best_entry(entries)
    ensemble = answer if answer is not None and answer.ensemble else None
    for ax, x, curve_x, horizon in views:
        has_curves, has_edges = _lineages(ax, entries, x, colour, curve_x)
        dots = {a: ax.scatter([x(e) for e in entries if e.algorithm == a],
                              [e.score_mean for e in entries if e.algorithm == a], s=34,
                              color=c, edgecolors="white", linewidths=0.7, zorder=4)
                for a, c in colour.items()}
        line = _best(ax, entries, x, horizon)
        if ensemble is not None:
            ax.scatter([horizon], [ensemble.score_mean], marker="*", s=190,
                       color=ANSWER_COLOUR, edgecolors="black", linewidths=0.6, zorder=6,
                       clip_on=False)
        if target is not None:
            ax.axhline(target, color=TARGET_COLOUR, ls="--", lw=1.2, zorder=0)
        left = x(best) < horizon / 2  # the label on the side with room, off the y ticks
        ax.annotate(f"best {best.score_mean:.1f} ± {best.score_std:.1f} ({best.algorithm} "
                    f"{short_id(best.id, 8)})", (x(best), best.score_mean),
                    xytext=(6 if left else -6, 6),
                    textcoords="offset points", ha="left" if left else "right", va="bottom",
                    fontsize=8)
        ax.set_xlim(0, horizon * 1.02)
        ax.margins(y=0.08)
        ax.grid(alpha=0.3)
        ax.set_ylabel("evaluation score (mean return)")
    by_time.set_xlabel("seconds since the run started (each dot: a checkpoint, where its "
                       "round ended)")
    by_steps.set_xlabel("env steps the run had spent when the checkpoint came")
    by_steps.xaxis.set_major_formatter(EngFormatter(sep=""))
    by_time.set_title(f"Podracer tournament on {env_label(entries[0].env)}: "
                      f"{plural(len(entries), 'checkpoint')}, best {best.score_mean:.1f}"
                      + ("" if ensemble is None else f"\nthe run's answer {ensemble.score_mean:.1f}"
                         f" (an ensemble of {len(ensemble.members)})"))
    every = tuple(colour.values())
    handles: list[Any] = [dots[a] for a in colour]
    labels = [f"{a} ({plural(sum(e.algorithm == a for e in entries), 'checkpoint')})"
              for a in colour]
    if has_edges:  # samples in each algorithm's colour, as the edges are drawn
        handles.append(tuple(Line2D([], [], color=c, lw=1.2) for c in every))
        labels.append("parent → child")
    if has_curves:
        handles.append(tuple(Line2D([], [], color=c, lw=1.4, alpha=0.45, marker="o", ms=2.5)
                             for c in every))
        labels.append("evaluations within a round")
    handles.append((Patch(color="black", alpha=0.12, lw=0), line))
    labels.append("leaderboard best ± std of its eval episodes")
    if ensemble is not None:
        handles.append(Line2D([], [], marker="*", ls="", ms=12, color=ANSWER_COLOUR,
                              markeredgecolor="black", markeredgewidth=0.6))
        labels.append(f"the run's answer: the ensemble of its top {len(ensemble.members)}\n"
                      f"{ensemble.score_mean:.1f} ± {ensemble.score_std:.1f} over "
                      f"{ensemble.episodes} fresh episodes")
    if target is not None:
        handles.append(Line2D([], [], color=TARGET_COLOUR, ls="--", lw=1.2))
        labels.append(f"target {target:g}")
    by_time.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8,
                   frameon=False, handler_map={tuple: HandlerTuple(ndivide=None, pad=0)})
    fig.tight_layout()
    return fig


def throughput_figure(entries: list[Entry], start: float) -> Any:
    """The figure of ``throughput.png`` (see the module doc)."""
    plt = pyplot()
    from matplotlib.ticker import EngFormatter, MaxNLocator

    algorithms = sorted({e.algorithm for e in entries})
    colour = colours(algorithms)
    end = end_of(entries)
    fig, axes = plt.subplots(len(algorithms) + 1, 1, sharex=True,
                             figsize=(10, 1.7 * len(algorithms) + 3.2),
                             gridspec_kw={"height_ratios": [1.0] * len(algorithms) + [1.1]})
    rate_axes, pods_ax = axes[:-1], axes[-1]
    eng = EngFormatter(places=1, sep="")

    def fmt(n: float) -> str:  # 180.2k steps, 119 steps/s: no "0.0 env steps"
        return eng(n) if n >= 1000 else f"{n:.0f}"

    for ax, a in zip(rate_axes, algorithms, strict=True):
        mine = [e for e in entries if e.algorithm == a]
        times, rates, _ = throughput_series(mine, start, end=end)
        width = times[0] * 2
        edges = [t - width / 2 for t in times] + [times[-1] + width / 2]  # cells drawn flat
        ax.fill_between(edges, [*rates, rates[-1]], step="post", color=colour[a], alpha=0.85,
                        lw=0)
        busy = sum(r.end - r.start for r in rounds(mine))
        steps = sum(e.env_steps for e in mine)
        ax.set_ylim(0, max(rates) * 1.2 or 10.0)  # no steps: whole ticks, not "800m"
        ax.yaxis.set_major_formatter(EngFormatter(sep=""))
        ax.yaxis.set_major_locator(MaxNLocator(3))
        ax.set_ylabel(f"{a}\nsteps/s")
        ax.set_title(f"{a}: {fmt(steps)} env steps, {fmt(steps / busy if busy else 0)} "
                     "steps/s per training pod", loc="left", fontsize=8, pad=3)
    total = sum(e.env_steps for e in entries)
    # two lines: on one, even a short env's title ran past both edges of the figure
    fig.suptitle(f"Podracer throughput on {env_label(entries[0].env)}: {fmt(total)} env steps "
                 f"in {plural(len(rounds(entries)), 'round')} "
                 f"({fmt(total / (end - start))} steps/s on average)\n"
                 "each algorithm on its own scale", fontsize=10)
    times, by_algorithm = pods_series(entries, start, end)
    per = [by_algorithm.get(a, [0] * len(times)) for a in algorithms]
    width = times[0] * 2
    edges = [t - width / 2 for t in times] + [times[-1] + width / 2]
    pods_ax.stackplot(edges, [[*p, p[-1]] for p in per], colors=[colour[a] for a in algorithms],
                      labels=algorithms, alpha=0.85, lw=0, step="post")
    top = max(sum(column) for column in zip(*per, strict=True))
    pods_ax.yaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    pods_ax.set_ylim(0, top + 0.5)
    pods_ax.set_ylabel("pods training")
    pods_ax.set_xlabel("seconds since the run started")
    pods_ax.set_xlim(0, (end - start) * 1.02)
    pods_ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _save(fig: Any, path: Path) -> None:
    fig.savefig(path, dpi=110)
    pyplot().close(fig)


def plot_tournament(entries: list[Entry], start: float, path: Path,
                    target: float | None = None, answer: Answer | None = None) -> None:
    """Draw ``tournament.png`` (see the module doc) to ``path``."""
    _save(tournament_figure(entries, start, target, answer), path)


def plot_throughput(entries: list[Entry], start: float, path: Path) -> None:
    """Draw ``throughput.png`` (see the module doc) to ``path``."""
    _save(throughput_figure(entries, start), path)
