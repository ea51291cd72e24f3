"""Live view of a running experiment from its events: the progress view and TensorBoard.

``Monitor.follow(transport)`` subscribes to every event of the experiment and keeps
the best score, the top 3, the pods alive (a heartbeat in the last ``ALIVE_S``
seconds), their throughput, and the stop reason. On a terminal it shows one live
panel (``rich``), redrawn in place; elsewhere (a pipe, a CI log, or without the ``viz``
extra) it prints one progress line every ``PRINT_S`` seconds. It writes TensorBoard
scalars (``leaderboard/best`` over total env steps and wall time; each pod's metrics
over its env steps). Without the ``viz`` extra, one line says what is left out and how
to get it; the run itself needs none of it.
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
from podracer import console

log = logging.getLogger(__name__)

ALIVE_S = 15.0
PRINT_S = 2.0


class Monitor:
    """Aggregates events; see the module doc."""

    def __init__(self, experiment: Experiment, tb_dir: Path | None, echo: bool = True,
                 live: bool | None = None) -> None:
        """``echo``: show progress at all; ``live``: as a redrawn panel (default: when
        stdout is a terminal)."""
        self.experiment = experiment
        self.echo = echo
        self.top: list[tuple[str, float]] = []
        self._live: Any = None
        panel = echo and (sys.stdout.isatty() if live is None else live)
        lacking = [what for module, what, wanted in (
            ("rich", "live panel (progress comes as lines)", panel),
            ("tensorboard", "TensorBoard files", tb_dir is not None))
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
        self._pod_steps: dict[str, int] = {}
        self._last_print = 0.0
        self._writer: Any = None
        if tb_dir is not None and importable("tensorboard"):
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(str(tb_dir))
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
            if self._writer is not None:
                step = self._pod_steps.get(event.pod, 0) + 1
                self._pod_steps[event.pod] = step
                for key, value in event.values.items():
                    self._writer.add_scalar(f"pods/{event.pod}/{key}", value, step)
        elif isinstance(event, LeaderboardChanged):
            self.best_score = event.best_score
            self.top = list(event.top[:3])
            self.checkpoints = event.checkpoints
            self.total_env_steps = event.total_env_steps
            if self._writer is not None:
                self._writer.add_scalar("leaderboard/best", event.best_score,
                                        event.total_env_steps)
                self._writer.add_scalar("leaderboard/best_vs_seconds", event.best_score,
                                        int(now - self.started))
        elif isinstance(event, Stop):
            self.stop_reason = event.reason
        if self._live is not None:
            self._live.update(self.panel())
        elif self.echo and now - self._last_print >= PRINT_S:
            self._last_print = now
            print(self.line(), flush=True)

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
        """Stop the live panel and flush TensorBoard files (idempotent)."""
        if self._live is not None:
            self._live.update(self.panel())
            self._live.stop()
            self._live = None
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
            self._writer = None
