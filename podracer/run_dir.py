"""Run-directory policy of ``podracer train``: what ``runs/<experiment>/`` holds and when.

``out`` receives the leaderboard store (SQLite + blobs), the experiment as asked
(``experiment.json``, what ``--resume`` reads back), the experiment this session's
services run (``session.json``, broker mode), and ``run.json``: one record per session,
when it started and ended, and how. A fresh run needs a directory that holds no run
yet; a resumed one, a directory that does (``check``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from broker.core.errors import ConfigError
from leaderboard.store import DB_NAME, LeaderboardStore
from podracer.outcome import NO_CHECKPOINT, stored_nothing

RUN_FILE = "run.json"
"""One record per session of a run: started, ended, state, stop reason."""
EXPERIMENT_FILE = "experiment.json"
"""The experiment as asked (``--resume`` reads it back)."""
SESSION_FILE = "session.json"
"""The experiment this session's services run: the asked one with the time left."""
INTERRUPTED = "interrupted by the user"
"""``Stop.reason`` when Ctrl-C (SIGINT) or SIGTERM ends a run."""


def has_run(out: Path) -> bool:
    """Whether ``out`` already holds a run (a store with checkpoints, or a session)."""
    if (out / RUN_FILE).is_file():
        return True
    if not (out / DB_NAME).is_file():
        return False
    with LeaderboardStore(out, create=False) as store:
        return store.count() > 0


def check(out: Path, resume: bool) -> None:
    """Make ``out`` ready for a session: it must hold a run to resume, or none to start
    (``ConfigError`` naming ``--resume`` and ``--fresh``)."""
    if resume and not (out / EXPERIMENT_FILE).is_file():
        raise ConfigError("--resume", f"{out} holds no run to resume",
                          "point it at the run directory of an earlier `podracer train` "
                          "(runs/<experiment>)")
    if not resume and has_run(out):
        raise ConfigError("--run-dir", f"{out} already holds a run",
                          f"continue it with `podracer train --resume {out}`, or start "
                          "over with --fresh (deletes it)")
    out.mkdir(parents=True, exist_ok=True)


def next_free(base: Path) -> Path:
    """``base``, or ``base-2``, ``base-3``...: the first of them that holds no run yet."""
    out, n = base, 1
    while has_run(out):
        n += 1
        out = base.with_name(f"{base.name}-{n}")
    return out


def run_number(run: Path, name: str) -> int | None:
    """1 for ``runs/<name>``, N for ``runs/<name>-N``, None for another directory."""
    if run.name == name:
        return 1
    stem, _, n = run.name.rpartition("-")
    return int(n) if stem == name and n.isdigit() and int(n) >= 2 else None


def run_dirs(runs: Path, name: str) -> list[Path]:
    """The run directories of experiment ``name`` under ``runs`` (``<name>``,
    ``<name>-2``...: those holding a run's experiment), oldest (lowest number) first."""
    found = [(n, p) for p in (runs.iterdir() if runs.is_dir() else ())
             if (n := run_number(p, name)) is not None and (p / EXPERIMENT_FILE).is_file()]
    return [p for _, p in sorted(found)]


def last_run(runs: Path, name: str) -> Path:
    """The newest run directory of ``name`` (highest number), for ``train --resume``."""
    found = run_dirs(runs, name)
    if not found:
        raise ConfigError("--resume", f"no run of {name!r} in {runs}",
                          "pass the run directory (--resume runs/<experiment>), or --name "
                          "with the experiment's name; `podracer ls` lists them")
    return found[-1]


def read_sessions(out: Path) -> list[dict[str, Any]]:
    """The session records of the run in ``out`` (``[]`` if it has none or they are
    unreadable)."""
    try:
        data = json.loads((out / RUN_FILE).read_text())
    except (OSError, ValueError):
        return []
    sessions = data.get("sessions") if isinstance(data, dict) else None
    return [s for s in sessions if isinstance(s, dict)] if isinstance(sessions, list) else []


def _write_sessions(out: Path, sessions: list[dict[str, Any]]) -> None:
    tmp = out / f".{RUN_FILE}.tmp"
    tmp.write_text(json.dumps({"sessions": sessions}, indent=2))
    os.replace(tmp, out / RUN_FILE)


class Sessions:
    """The session records of ``out``: this session's is written when it opens and again
    when it closes, after the earlier ones."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.earlier = read_sessions(out)
        self.record: dict[str, Any] = {}

    def open(self, broker: str) -> None:
        """Record that this session started (on ``broker``: ``embedded`` or a redacted URL)."""
        self.record = {"started": time.time(), "host": socket.gethostname(),
                       "pid": os.getpid(), "broker": broker}
        _write_sessions(self.out, [*self.earlier, self.record])

    def close(self, *, interrupted: bool, stop: str | None, exit_code: int) -> str:
        """Record how this session ended; its state (``interrupted``, ``finished`` or
        ``failed``)."""
        state = ("interrupted" if interrupted or stop in (None, INTERRUPTED)
                 else "finished" if exit_code == 0 else "failed")
        if exit_code == 0 and not interrupted and stored_nothing(self.out):
            state, exit_code = NO_CHECKPOINT, 1  # a run that trained nothing did not succeed
        self.record.update(ended=time.time(), state=state, stop=stop, exit_code=exit_code)
        _write_sessions(self.out, [*self.earlier, self.record])
        return state

    def first_started(self, default: float) -> float:
        """When the run's first session started (wall clock), ``default`` for a new run."""
        first = self.earlier[0].get("started") if self.earlier else None
        return float(first) if isinstance(first, int | float) else default


LOCK_FILE = ".train.lock"
"""Held (``flock``) by the process writing the run (a ``podracer train``, or a benchmark
that writes a directory of runs), with its pid and name inside: the kernel drops the lock
when that process ends however it ends, so a stale file never blocks."""

TRAIN = "`podracer train`"
"""Who holds a run directory, by default."""


@contextlib.contextmanager
def holding(out: Path, by: str = TRAIN, flag: str = "--out") -> Iterator[None]:
    """Hold ``out``'s lock for the block, as ``by`` (``ConfigError`` naming ``flag`` if a
    live process holds it)."""
    out.mkdir(parents=True, exist_ok=True)
    fd = os.open(out / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _live(out, fd, flag) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n{by}\n".encode())
        yield
    finally:
        os.close(fd)  # closing releases the lock


def refuse_if_live(out: Path, flag: str) -> None:
    """``ConfigError`` naming ``flag`` if a running process holds ``out``'s lock."""
    try:
        fd = os.open(out / LOCK_FILE, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _live(out, fd, flag) from None
    finally:
        os.close(fd)


def holder(out: Path) -> tuple[str, str]:
    """The pid and the name written in ``out``'s lock (``"?"`` for what is missing)."""
    try:
        return _holder((out / LOCK_FILE).read_text())
    except OSError:
        return "?", "?"


def delete(out: Path, flag: str) -> None:
    """Delete the run in ``out`` (``ConfigError`` naming ``flag`` if a running train
    holds it: a run still training is not deleted under it)."""
    refuse_if_live(out, flag)
    shutil.rmtree(out)


def _holder(text: str) -> tuple[str, str]:
    pid, _, by = text.strip().partition("\n")
    return pid.strip() or "?", by.strip() or TRAIN


def _live(out: Path, fd: int, flag: str) -> ConfigError:
    pid, by = _holder(os.pread(fd, 256, 0).decode(errors="replace"))
    return ConfigError(flag, f"{out} is being written by {by} (pid {pid}), still running",
                       "stop that one first (Ctrl-C), or write another directory"
                       + (f" with {flag}" if flag.startswith("--") else ""))
