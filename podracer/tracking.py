"""Where a run's metrics and hyperparameters go: TensorBoard and MLflow.

The experiment's ``tracking`` (``podracer train --track``) names the trackers. The
``Monitor`` hands each one the same three things:

* a pod's metrics (``Metrics`` events), under the run of the round's **lineage**,
  stepped by the lineage's env steps: a round that continues its parent's weights
  continues its parent's run and steps, so a curve is one line of descent of one
  algorithm. A second child of the same parent branches into a run of its own (named
  ``<algorithm>/<root>-<round>``), so no run steps back;
* the leaderboard's best (``LeaderboardChanged``), run ``leaderboard``, stepped by the
  total env steps of the experiment;
* at the end, every checkpoint of the store with its hyperparameters and its score as
  the metric (TensorBoard's hparams plugin: run ``hparams/<algorithm>-<checkpoint>``;
  MLflow: one run per checkpoint, tagged ``podracer.kind=checkpoint``).

TensorBoard writes ``<out>/tb``; MLflow writes to ``MLFLOW_TRACKING_URI`` when set, else
``sqlite:///<out>/mlflow.db``, experiment named after Podracer's. A tracker whose
package is missing is left out with one line naming the install; the run needs none.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from broker.core.experiment import Experiment
from broker.core.extras import importable
from broker.core.schemas import Metrics
from leaderboard.store import Entry, short_id

log = logging.getLogger(__name__)

LEADERBOARD_RUN = "leaderboard"
_INSTALL = {"mlflow": "pip install 'podracer[mlflow]'"}


class Lineages:
    """Which run a round's metrics belong to, and the env steps its lineage had before it."""

    def __init__(self) -> None:
        self._run: dict[str, str] = {}
        self._offset: dict[str, int] = {}
        self._last: dict[str, int] = {}
        self._tip: dict[str, str] = {}
        """run -> the round that last continued it (a later child of another round branches)."""

    def place(self, event: Metrics) -> tuple[str, int] | None:
        """(run, step) of ``event``; None for metrics of no known round."""
        round_id = event.init_id
        if round_id is None:
            return None
        if round_id not in self._run:
            self._start(round_id, event.algorithm or "pod", event.parent_id)
        self._last[round_id] = max(self._last.get(round_id, 0), event.env_steps)
        return self._run[round_id], self._offset[round_id] + event.env_steps

    def _start(self, round_id: str, algorithm: str, parent_id: str | None) -> None:
        # an intermediate checkpoint <init>.<k> belongs to round <init>
        parent = parent_id.split(".")[0] if parent_id else None
        if parent in self._run:
            run = self._run[parent]
            offset = self._offset[parent] + self._last.get(parent, 0)
            if self._tip[run] != parent:  # the parent's run went on with a sibling
                run = f"{run}-{round_id[:8]}"
        else:  # a fresh lineage, or one whose earlier rounds this monitor never saw
            run, offset = f"{algorithm}/{(parent or round_id)[:8]}", 0
        self._run[round_id], self._offset[round_id], self._tip[run] = run, offset, round_id


def lineage_of(entries: Iterable[Entry]) -> dict[str, str]:
    """Checkpoint id -> the init id of its lineage's first round (following ``parent_id``)."""
    by_id = {e.id: e for e in entries}
    roots: dict[str, str] = {}

    def root(entry: Entry) -> str:
        seen: list[str] = []
        while entry.parent_id in by_id and entry.id not in roots and entry.id not in seen:
            seen.append(entry.id)
            entry = by_id[entry.parent_id]
        found = roots.get(entry.id, entry.init_id)
        for cid in [*seen, entry.id]:
            roots[cid] = found
        return found

    return {cid: root(e) for cid, e in by_id.items()}


def hparams_of(entry: Entry, lineage: str) -> dict[str, Any]:
    """What a checkpoint's hparams session records: its hyperparameters and its place."""
    values: dict[str, Any] = {k: v for k, v in sorted(entry.hparams.items()) if v is not None}
    values.update({"algorithm": entry.algorithm, "lineage": lineage[:8],
                   "generation": entry.generation})
    return values


class Tracker(Protocol):
    """One tracking backend (see the module doc)."""

    def scalars(self, run: str, values: Mapping[str, float], step: int) -> None:
        """Log ``values`` of ``run`` at env step ``step``."""

    def checkpoints(self, entries: list[Entry]) -> None:
        """Log every checkpoint's hyperparameters with its score as the metric."""

    def close(self) -> None:
        """Flush and release (idempotent)."""


class TensorBoardTracker:
    """Event files under ``root``: a directory (TensorBoard run) per lineage run."""

    def __init__(self, root: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.root = root
        self._writers: dict[str, Any] = {}
        self._make = SummaryWriter

    def _writer(self, run: str) -> Any:
        if run not in self._writers:
            self._writers[run] = self._make(str(self.root / run))
        return self._writers[run]

    def scalars(self, run: str, values: Mapping[str, float], step: int) -> None:
        """See ``Tracker``."""
        writer = self._writer(run)
        for key, value in values.items():
            writer.add_scalar(key, value, step)

    def checkpoints(self, entries: list[Entry]) -> None:
        """See ``Tracker``: one hparams session per checkpoint."""
        roots = lineage_of(entries)
        for entry in entries:
            run = f"hparams/{entry.algorithm}-{short_id(entry.id)}"
            writer = self._make(str(self.root / run))
            # run_name "." keeps the session in this run's own directory
            writer.add_hparams(hparams_of(entry, roots[entry.id]),
                               {"hparam/score": entry.score_mean,
                                "hparam/score_std": entry.score_std},
                               run_name=".", global_step=entry.env_steps)
            writer.close()

    def close(self) -> None:
        """See ``Tracker``."""
        for writer in self._writers.values():
            with contextlib.suppress(Exception):
                writer.close()
        self._writers.clear()


class MLflowTracker:
    """MLflow runs in one experiment: a run per lineage run and one per checkpoint."""

    def __init__(self, experiment: str, out: Path) -> None:
        from mlflow.tracking import MlflowClient

        # its store's "Creating initial MLflow database tables" lines are not the user's
        logging.getLogger("mlflow").setLevel(logging.WARNING)

        self.uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{out.resolve()}/mlflow.db"
        out.mkdir(parents=True, exist_ok=True)
        self.client = MlflowClient(tracking_uri=self.uri)
        found = self.client.get_experiment_by_name(experiment)
        self.experiment_id = (found.experiment_id if found is not None
                              else self.client.create_experiment(experiment))
        self._runs: dict[str, str] = {}

    def _run(self, run: str) -> str:
        if run not in self._runs:
            kind = "leaderboard" if run == LEADERBOARD_RUN else "lineage"
            self._runs[run] = self.client.create_run(
                self.experiment_id, run_name=run, tags={"podracer.kind": kind}).info.run_id
        return self._runs[run]

    def scalars(self, run: str, values: Mapping[str, float], step: int) -> None:
        """See ``Tracker``."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        # MLflow keys take letters, digits and _-./ and space: the pods' keys are such
        self.client.log_batch(self._run(run), metrics=[
            Metric(key, float(value), now, step) for key, value in values.items()])

    def checkpoints(self, entries: list[Entry]) -> None:
        """See ``Tracker``: a finished run per checkpoint, params and score."""
        from mlflow.entities import Metric, Param

        roots = lineage_of(entries)
        for entry in entries:
            run_id = self.client.create_run(
                self.experiment_id, run_name=f"{entry.algorithm}-{short_id(entry.id)}",
                start_time=int((entry.created - entry.wall_time) * 1000),
                tags={"podracer.kind": "checkpoint", "podracer.checkpoint": entry.id,
                      "podracer.parent": entry.parent_id or ""}).info.run_id
            params = hparams_of(entry, roots[entry.id])
            self.client.log_batch(run_id, params=[Param(k, str(v)) for k, v in params.items()],
                                  metrics=[Metric(name, value, int(entry.created * 1000),
                                                  entry.env_steps)
                                           for name, value in (("score", entry.score_mean),
                                                               ("score_std", entry.score_std))])
            self.client.set_terminated(run_id, end_time=int(entry.created * 1000))

    def close(self) -> None:
        """See ``Tracker``."""
        for run_id in self._runs.values():
            with contextlib.suppress(Exception):
                self.client.set_terminated(run_id)
        self._runs.clear()


def open_trackers(experiment: Experiment, out: Path | None) -> list[Tracker]:
    """The experiment's trackers writing under ``out`` (none without ``out``); a missing
    package leaves its tracker out with one line that names the install."""
    if out is None:
        return []
    trackers: list[Tracker] = []
    lacking = [name for name in experiment.tracking if not importable(name)]
    if "mlflow" in lacking:  # the monitor's line names the viz extra for TensorBoard
        print(f"podracer: no MLflow tracking: {_INSTALL['mlflow']} for it", flush=True)
    if "tensorboard" in experiment.tracking and "tensorboard" not in lacking:
        trackers.append(TensorBoardTracker(out / "tb"))
    if "mlflow" in experiment.tracking and "mlflow" not in lacking:
        trackers.append(MLflowTracker(experiment.name, out))
    return trackers
