"""The tables of ``benchmarks.tournament``: one per task, then the raw per-run values."""

from __future__ import annotations

import dataclasses
import math
import statistics

from benchmarks.tournament_runs import TOURNAMENTS, RunResult, Task
from benchmarks.tournament_sb3 import SB3_METHODS

LONE = ("ppo", "sac", "td3")
RANDOM = tuple(f"{algo}-random" for algo in LONE)
METHODS = (*TOURNAMENTS, *LONE, *RANDOM, *SB3_METHODS, "best-of-4")
W = max(len(m) for m in METHODS)
"""Width of the method column."""


@dataclasses.dataclass(frozen=True)
class Row:
    """One (task, method) row: its metric over every run that did not fail."""

    method: str
    runs: list[RunResult]
    values: list[float]
    missed: int
    """Runs that did not reach the target (their value is the cap)."""

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values) if self.values else math.nan

    @property
    def std(self) -> float:
        return statistics.stdev(self.values) if len(self.values) > 1 else 0.0

    def cell(self) -> str:
        """``mean ± std`` (sample std), or the mean alone for one run."""
        if not self.values:
            return "n/a"
        return f"{self.mean:.1f}" + (f" ± {self.std:.1f}" if len(self.values) > 1 else "")


def _rows(task: Task, cap: float, results: list[RunResult]) -> dict[str, Row]:
    rows: dict[str, Row] = {}
    for method in METHODS:
        runs = [r for r in results if r.task == task.key and r.method == method]
        ok = [r for r in runs if not r.failed]
        if task.target is not None:
            values = [cap if r.time_to_target is None else r.time_to_target for r in ok]
            missed = sum(r.time_to_target is None for r in ok)
        else:
            values, missed = [r.score for r in ok if r.score is not None], 0
        if runs:
            rows[method] = Row(method, runs, values, missed)
    return rows


def ratio(a: float, b: float | None) -> str:
    """``a / b`` to two decimals, ``-`` when ``b`` is missing, zero or either is NaN."""
    return "-" if b is None or b == 0 or math.isnan(a) or math.isnan(b) else f"{a / b:.2f}"


def time_cell(row: Row, cap: float) -> str:
    """A time-to-target cell: ``> cap`` when every run missed, ``>= mean`` when some did."""
    if not row.values:
        return "n/a"
    if row.missed == len(row.values):
        return f"> {cap:g}"
    return (">= " if row.missed else "") + row.cell()


def _pendulum_table(task: Task, cap: float, rows: dict[str, Row]) -> list[str]:
    lone = [r for m, r in rows.items() if m in LONE and r.values]
    best = min(lone, key=lambda r: r.mean, default=None)
    sb3 = rows.get("sb3-ppo")
    sb3_mean = sb3.mean if sb3 is not None and sb3.values else None
    lines = [f"{'method':{W}} {'seconds to target':>18} {'n':>3} {'reached':>7} "
             f"{'confirm':>8} {'/ best lone':>11} {'/ sb3-ppo':>10} {'train() s':>9}",
             f"(best tuned lone agent: {best.method if best else 'none run'})"]
    for method, row in rows.items():
        confirms = [r.confirm for r in row.runs if r.confirm is not None]
        confirm = f"{statistics.fmean(confirms):.0f}" if confirms else "-"
        walls = [r.wall for r in row.runs if method in TOURNAMENTS and not r.failed]
        wall = f"{statistics.fmean(walls):.1f}" if walls else ""
        lines.append(f"{method:{W}} {time_cell(row, cap):>18} {len(row.values):>3} "
                     f"{len(row.values) - row.missed:>3}/{len(row.values):<3} {confirm:>8} "
                     f"{ratio(row.mean, best.mean if best else None):>11} "
                     f"{ratio(row.mean, sb3_mean):>10} {wall:>9}")
    return lines


def _score_table(rows: dict[str, Row]) -> list[str]:
    lone = [r for m, r in rows.items() if m in LONE and r.values]
    best = best_lone(rows)
    # the std reference needs 2+ runs: the best lone row that has them
    spread = max((r for r in lone if len(r.values) > 1), key=lambda r: r.mean, default=None)
    randoms = [r for m, r in rows.items() if m in RANDOM and r.values]
    lines = [f"{'method':{W}} {'score (mean ± std)':>20} {'n':>3} {'/ best lone':>11} "
             f"{'beats all random':>16} {'std / lone std':>14}",
             f"(best tuned lone agent: {best.method if best else 'none run'}; std reference: "
             f"{spread.method if spread else 'none with 2+ runs'}; "
             f"random rows run: {', '.join(r.method for r in randoms) or 'none'})"]
    for method, row in rows.items():
        cell = row.cell()
        beats = ("-" if not randoms or not row.values or method in RANDOM
                 else "yes" if all(row.mean > r.mean for r in randoms) else "no")
        std_ratio = ratio(row.std, spread.std if spread else None)
        lines.append(f"{method:{W}} {cell:>20} {len(row.values):>3} "
                     f"{ratio(row.mean, best.mean if best else None):>11} {beats:>16} "
                     f"{std_ratio if len(row.values) > 1 else '-':>14}")
    return lines


def _raw(task: Task, rows: dict[str, Row]) -> list[str]:
    lines = []
    for method, row in rows.items():
        cells = []
        for r in row.runs:
            name = f"s{r.seed}" + (f"d{r.draw}" if r.draw is not None else "")
            if r.failed:
                value = "failed"
            elif task.target is not None:
                value = ("miss" if r.time_to_target is None
                         else f"{r.time_to_target:.1f}s/{r.confirm:.0f}")
                value += f" ({r.refuted} refuted)" if r.refuted else ""
            else:
                value = f"{r.score:.1f}" if r.score is not None else "n/a"
            cells.append(f"{name} {value}")
        lines.append(f"  {method:{W}} " + ", ".join(cells))
    return lines


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def pool_line(method: str, r: RunResult) -> str:
    """One tournament run's share of training data from the experience pool: the best
    checkpoint's lineage, every member, and per algorithm (each a mean over checkpoints)."""
    head = f"pool share of training data, {method} s{r.seed}: "
    if r.pool_share_all is None:  # a run recorded before checkpoints carried it
        return head + "not recorded"
    algos = ", ".join(f"{a} {v:.2f}" for a, v in sorted(r.pool_share.items()))
    return (head + f"best lineage ({r.algorithm or '-'}) {_share(r.pool_share_best)}, "
            f"all members {_share(r.pool_share_all)} ({algos})")


def kept_line(method: str, r: RunResult) -> str:
    """Who held one tournament run's kept pod: when it was first kept, and each
    algorithm's seconds of kept rounds, most first."""
    head = f"kept pod, {method} s{r.seed}: "
    if r.kept is None:
        return head + "not recorded"
    if r.kept_from is None:
        return head + "never kept"
    held = sorted(r.kept.items(), key=lambda item: (-item[1], item[0]))
    return head + f"from {r.kept_from:.0f} s, " + ", ".join(f"{a} {s:.0f} s" for a, s in held)


def _run_lines(rows: dict[str, Row]) -> list[str]:
    """Per tournament run, the pool's share of training data (``pool_line``), then who
    held the kept pod (``kept_line``)."""
    return [line(method, r) for line in (pool_line, kept_line) for method in TOURNAMENTS
            if method in rows for r in rows[method].runs if not r.failed]


def best_lone(rows: dict[str, Row]) -> Row | None:
    """The lone row with the best mean score (``None``: no lone row has a score)."""
    return max((r for m, r in rows.items() if m in LONE and r.values),
               key=lambda r: r.mean, default=None)


def training_lines(rows: dict[str, Row]) -> list[str]:
    """Per tournament run, the training behind its best checkpoint: the env steps its
    lineage collected and the seconds of its rounds, against the best lone row's mean
    env steps (a score task's comparison: how much of the lone pod's training the
    tournament gave the lineage it ends with)."""
    lone = best_lone(rows)
    steps = [r.env_steps for r in lone.runs if not r.failed] if lone is not None else []
    reference = statistics.fmean(steps) if steps else None
    lines = []
    for method in TOURNAMENTS:
        for r in rows[method].runs if method in rows else []:
            if r.failed or r.best_steps is None or r.best_seconds is None:
                continue
            against = ("" if lone is None or not reference else
                       f" ({ratio(r.best_steps, reference)}x the {lone.method} row's mean "
                       f"{reference:,.0f})")
            lines.append(f"training behind the best checkpoint, {method} s{r.seed}: "
                         f"{r.best_steps:,} env steps in {r.best_seconds:.0f} s of rounds"
                         + against)
    return lines


def answer_lines(rows: dict[str, Row]) -> list[str]:
    """Per row, how often the run's answer was an ensemble of its top
    (``leaderboard.answer``) and what the best checkpoint alone scored on the same
    episodes: the rows' scores are their answers', and this is what each would have
    scored without the ensemble."""
    lines = []
    for method, row in rows.items():
        runs = [r for r in row.runs if not r.failed and r.single_score is not None]
        if not runs:
            continue
        alone = Row(method, runs, [r.single_score for r in runs if r.single_score is not None],
                    0)
        ensembles = sum(r.answer.startswith("ensemble") for r in runs)
        lines.append(f"the run's answer, {method}: an ensemble in {ensembles} of {len(runs)} "
                     f"run(s); the best checkpoint alone {alone.cell()} ("
                     + ", ".join(f"s{r.seed} {r.single_score:.1f}" for r in runs) + ")")
    return lines


def speed_line(rows: dict[str, Row]) -> str | None:
    """The machine's speed, read off the lone rows: env steps per second of training,
    a mean over runs (``None``: no lone row ran). Tables of different days compare
    only at similar speeds (this 2-core machine has measured 2x apart)."""
    cells = []
    for method, row in rows.items():
        rates = [r.env_steps / r.wall for r in row.runs
                 if method in LONE and not r.failed and r.wall > 0 and r.env_steps]
        if rates:
            cells.append(f"{method} {statistics.fmean(rates):,.0f}")
    if not cells:
        return None
    return "env steps per second of the lone rows (this machine's speed): " + ", ".join(cells)


def report(tasks: list[Task], budgets: dict[str, float], results: list[RunResult]) -> str:
    """The tables of every task, then the raw per-run values."""
    out: list[str] = []
    for task in tasks:
        cap = budgets[task.key]
        rows = _rows(task, cap, results)
        if task.target is not None:
            out.append(f"\n== {task.key} ({task.env}): wall seconds to {task.target:g}, "
                       f"cap {cap:g} s (a claim counts once the updater's measurement holds it; "
                       f"confirm: 10-episode re-evaluation) ==")
            out += _pendulum_table(task, cap, rows)
        else:
            out.append(f"\n== {task.key} ({task.env}): 10-episode deterministic score "
                       f"after {cap:g} s ==")
            out += _score_table(rows)
        speed = speed_line(rows)
        out += [speed] if speed else []
        out += _run_lines(rows)
        out += training_lines(rows) + answer_lines(rows) if task.target is None else []
        out.append("per run (time to target s/confirm, claims refuted before it):"
                   if task.target is not None else "per run (score):")
        out += _raw(task, rows)
    return "\n".join(out)
