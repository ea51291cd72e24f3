"""The run's elapsed time as the orchestrator counts it, kept across its restarts.

The time budget (``total_budget.seconds``) is counted by the orchestrator. Counted in
memory, a restarted orchestrator (a crash restarted by supervision, a container
rescheduled by Swarm, ``docker compose restart``) would start from zero and the run
would train on past its budget. So the orchestrator writes what it has counted to
``CLOCK_FILE`` in the run's store directory (shared by every service: the compose and
Swarm ``store`` volume, ``train``'s run directory) once per poll, and a new orchestrator
goes on from there. The time an orchestrator is down is not counted (like the time
between two sessions of a resumed run, see ``leaderboard.spent``).

``podracer train`` opens each session with ``reset``: a resumed session's budget is the
time left already (``podracer.resume``), so its clock starts at zero.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)

CLOCK_FILE = "orchestrator-clock.json"
"""``{"experiment": name, "elapsed": seconds}`` in the store directory."""


class RunClock:
    """Seconds the run has been going: what earlier orchestrators counted plus ours."""

    def __init__(self, store: Path, experiment: str) -> None:
        self.path = store / CLOCK_FILE
        self.experiment = experiment
        self.before = _read(self.path, experiment)
        """Seconds counted by earlier orchestrators of this run."""
        self.started = time.monotonic()
        if self.before:
            log.info("orchestrator: the run has been going %.0f s already (%s)",
                     self.before, self.path)

    def elapsed(self) -> float:
        """Seconds the run has been going, this orchestrator's included."""
        return self.before + time.monotonic() - self.started

    def save(self) -> None:
        """Write ``elapsed`` (atomically: a crash mid-write leaves the older value)."""
        tmp = self.path.with_name(f".{CLOCK_FILE}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps({"experiment": self.experiment,
                                       "elapsed": round(self.elapsed(), 3)}))
            os.replace(tmp, self.path)
        except OSError as exc:  # a store away for a moment: the next poll writes again
            log.warning("orchestrator: cannot write %s: %s", self.path, exc)


def _read(path: Path, experiment: str) -> float:
    """The seconds in ``path`` for ``experiment``; 0 when absent, another run's or not a
    finite non-negative number (said in one line)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return 0.0
    except (OSError, ValueError) as exc:
        log.warning("orchestrator: ignoring unreadable %s (%s); counting from 0", path, exc)
        return 0.0
    seconds = data.get("elapsed") if isinstance(data, dict) else None
    if not isinstance(data, dict) or data.get("experiment") != experiment:
        return 0.0
    if (isinstance(seconds, bool) or not isinstance(seconds, int | float)
            or not math.isfinite(seconds) or seconds < 0):
        log.warning("orchestrator: ignoring %s: elapsed %r is not a duration; counting "
                    "from 0", path, seconds)
        return 0.0
    return float(seconds)


def reset(store: Path) -> None:
    """Start the clock of ``store``'s run at zero (a new session of ``podracer train``)."""
    (store / CLOCK_FILE).unlink(missing_ok=True)
