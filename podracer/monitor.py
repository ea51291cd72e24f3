"""Live view of a running experiment from its events: the progress view and TensorBoard.

``Monitor.follow(transport)`` subscribes to every event of the experiment and keeps
the best score, the top 3, the pods alive (a heartbeat in the last ``ALIVE_S``
seconds), their throughput, and the stop reason. On a terminal it shows one live
panel (``rich``), redrawn in place; elsewhere (a pipe, a CI log, or without the ``viz``
extra) it prints one progress line every ``PRINT_S`` seconds. It feeds the experiment's
trackers (``podracer.tracking``: TensorBoard, MLflow): the pods' metrics per lineage over
its env steps, the leaderboard's best over total env steps, and on ``close`` every
stored checkpoint's hyperparameters with its score. Without the ``viz`` extra, one line
says what is left out and how to get it; the run itself needs none of it.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from pathlib import Path
from typing import Any

from broker.core.experiment import Experiment
from broker.core.extras import importable
from broker.core.schemas import Heartbeat, LeaderboardChanged, Message, Metrics, Stop
from broker.transports.base import Transport
from leaderboard.store import DB_NAME, LeaderboardStore
from podracer import console
from podracer.tracking import LEADERBOARD_RUN, Lineages, Tracker, open_trackers

log = logging.getLogger(__name__)

ALIVE_S = 15.0
PRINT_S = 2.0


class Monitor:
    """Aggregates events; see the module doc."""

    def __init__(self, experiment: Experiment, out: Path | None, echo: bool = True,
                 live: bool | None = None) -> None:
        """``out``: the run directory the trackers write in and whose store ``close``
        reads (None: no tracking); ``echo``: show progress at all; ``live``: as a
        redrawn panel (default: when stdout is a terminal)."""
        self.experiment = experiment
        self.echo = echo
        self.top: list[tuple[str, float]] = []
        self._live: Any = None
        panel = echo and (sys.stdout.isatty() if live is None else live)
        lacking = [what for module, what, wanted in (
            ("rich", "live panel (progress comes as lines)", panel),
            ("tensorboard", "TensorBoard files",
             out is not None and "tensorboard" in experiment.tracking))
            if wanted and not importable(module)]
        if lacking:
            print(f"podracer: without the viz extra, no {' and no '.join(lacking)}; "
                  "pip install 'podracer[viz]' for them", flush=True)
        self.started = time.monotonic()
        self.started_wall = time.time()
        self.best_score: float | None = None
        self.checkpoints = 0
        self.total_env_steps = 0
        self.stop_reason: str | None = None
        self._beats: dict[str, tuple[float, str, str]] = {}
        self._speed: dict[str, tuple[float, float]] = {}
        self._last_print = 0.0
        self.out = out
        self.lineages = Lineages()
        self.trackers: list[Tracker] = open_trackers(experiment, out)
        if panel and importable("rich"):
            from rich.live import Live

            self._live = Live(self.panel(), refresh_per_second=2, transient=False)
            self._live.start()

    def pods_alive(self) -> int:
        """Pods that sent a heartbeat in the last ``ALIVE_S`` seconds."""
        now = time.monotonic()
        return sum(1 for seen, role, _ in self._beats.values()
                   if role == "pod" and now - seen < ALIVE_S)

    def env_steps_per_s(self) -> float:
        """Summed recent throughput of the training pods."""
        now = time.monotonic()
        return sum(rate for seen, rate in self._speed.values() if now - seen < 2 * PRINT_S + 3)

    def observe(self, event: Message) -> None:
        """Fold one event into the view."""
        now = time.monotonic()
        if isinstance(event, Heartbeat):
            self._beats[event.pod] = (now, event.role, event.status)
        elif isinstance(event, Metrics):
            rate = event.values.get("perf/env_steps_per_s")
            if rate is not None:
                self._speed[event.pod] = (now, rate)
            placed = self.lineages.place(event) if self.trackers else None
            if placed is not None:
                run, step = placed
                self._track(run, {**event.values, "pod/env_steps": event.env_steps}, step)
        elif isinstance(event, LeaderboardChanged):
            self.best_score = event.best_score
            self.top = list(event.top[:3])
            self.checkpoints = event.checkpoints
            self.total_env_steps = event.total_env_steps
            if self.trackers:
                self._track(LEADERBOARD_RUN, {"best": event.best_score,
                                              "checkpoints": event.checkpoints,
                                              "seconds": now - self.started},
                            event.total_env_steps)
        elif isinstance(event, Stop):
            self.stop_reason = event.reason
        if self._live is not None:
            self._live.update(self.panel())
        elif self.echo and now - self._last_print >= PRINT_S:
            self._last_print = now
            print(self.line(), flush=True)

    def _track(self, run: str, values: dict[str, float], step: int) -> None:
        for tracker in list(self.trackers):
            try:
                tracker.scalars(run, values, step)
            except Exception as exc:  # tracking is a view: it never fails the run
                log.warning("%s stopped: %s", type(tracker).__name__, exc)
                self.trackers.remove(tracker)
                with contextlib.suppress(Exception):
                    tracker.close()

    def panel(self) -> Any:
        """The live panel: elapsed, best and target, checkpoints, pods, env-steps/s, top 3."""
        from rich.panel import Panel
        from rich.table import Table

        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold")
        table.add_column()
        elapsed = time.monotonic() - self.started
        target = self.experiment.target_score
        remaining = console.left(self.experiment, elapsed, self.total_env_steps)
        table.add_row("elapsed", console.duration(elapsed)
                      + (f"  ({remaining}; budget {console.budget(self.experiment.total_budget)})"
                         if remaining else ""))
        table.add_row("best", console.score(self.best_score)
                      + ("" if target is None else f"  (target {target:g})"))
        table.add_row("checkpoints", f"{self.checkpoints:,}")
        table.add_row("pods", f"{self.pods_alive()}")
        table.add_row("env steps", f"{self.total_env_steps:,} "
                      f"({self.env_steps_per_s():,.0f}/s)")
        for rank, (checkpoint, score) in enumerate(self.top, 1):
            table.add_row(f"top {rank}", f"{console.score(score)}  {checkpoint[:8]}")
        return Panel(table, title=f"podracer: {self.experiment.name} on {self.experiment.env}",
                     expand=False)

    def line(self) -> str:
        """The progress line: elapsed, what is left, best, checkpoints, pods, env steps."""
        elapsed = time.monotonic() - self.started
        target = self.experiment.target_score
        remaining = console.left(self.experiment, elapsed, self.total_env_steps)
        return (f"[{console.duration(elapsed)}{f', {remaining}' if remaining else ''}] "
                f"best {console.score(self.best_score)}"
                f"{'' if target is None else f' (target {target:g})'} | "
                f"{console.plural(self.checkpoints, 'checkpoint')} | "
                f"{console.plural(self.pods_alive(), 'pod')} | "
                f"{self.total_env_steps:,} env steps, {self.env_steps_per_s():,.0f}/s")

    async def follow(self, transport: Transport) -> None:
        """Observe every event of the experiment until cancelled."""
        async with transport.subscribe(["#"]) as events:
            async for event in events:
                self.observe(event)

    def close(self) -> None:
        """Stop the live panel; give the trackers every stored checkpoint; close them
        (idempotent)."""
        if self._live is not None:
            self._live.update(self.panel())
            self._live.stop()
            self._live = None
        trackers, self.trackers = self.trackers, []
        entries = self._stored() if trackers else []
        for tracker in trackers:
            try:
                if entries:
                    tracker.checkpoints(entries)
            except Exception as exc:  # tracking is a view: it never fails the run
                log.warning("%s: checkpoints not tracked: %s", type(tracker).__name__, exc)
            finally:
                with contextlib.suppress(Exception):
                    tracker.close()

    def _stored(self) -> list[Any]:
        if self.out is None or not (self.out / DB_NAME).exists():
            return []
        with LeaderboardStore(self.out, create=False) as store:
            return store.entries()
