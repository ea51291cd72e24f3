"""``podracer ls``, ``clean`` and ``dead-letters``: experiments over their whole life.

* ``ls`` lists every experiment of a runs directory (and, with ``--broker``, every one
  the broker holds queues of) with its state: *running* (its ``train`` process is
  alive on this host, or its ``updater`` queue has a consumer), *finished* (the last
  session ended at its target or budget), *interrupted* (Ctrl-C, or the process died:
  ``podracer train --resume`` carries on), or *failed*.
* ``clean <exp>`` deletes the experiment's queues, exchanges and expiry policy
  (messages included), and with ``--delete-run`` its run directory (after a confirmation,
  or ``--yes``). It refuses while the experiment runs.
* ``dead-letters <exp>`` lists dead letters (id, kind, reason, age) without consuming
  them; ``--requeue ID`` / ``--all`` sends them back to their work queue, ``--purge``
  empties the dead-letter queue.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker.core.errors import BrokerError, ConfigError
from broker.core.topology import WORK_QUEUES, check_experiment
from podracer.inspect_cli import add_json, format_table
from podracer.run_dir import run_number

DEFAULT_RUNS = "runs"


def _broker(args: argparse.Namespace, required: bool) -> str | None:
    broker: str | None = args.broker or os.environ.get("PODRACER_BROKER")
    if broker and broker.startswith("memory"):
        broker = None
    if required and not broker:
        raise ConfigError("--broker", f"`podracer {args.command}` needs a RabbitMQ broker",
                          "pass --broker amqp://user:pass@host:5672/ or set PODRACER_BROKER")
    return broker


def _quiet() -> None:
    from podracer.status_cli import _quiet_client_logs

    _quiet_client_logs()


# ------------------------------------------------------------------ ls


@dataclasses.dataclass
class Row:
    """One run directory (or an experiment only the broker knows) as ``ls`` shows it;
    ``None``: unknown (``-`` in the table, ``null`` in ``--json``)."""

    name: str
    state: str = "-"
    env: str | None = None
    algos: list[str] | None = None
    best: float | None = None
    checkpoints: int | None = None
    wall_s: float | None = None
    dead_letters: int | None = None
    run_dir: str | None = None

    def cells(self) -> tuple[str, ...]:
        """The table row."""
        return (self.name, self.state, self.env or "-",
                ",".join(self.algos) if self.algos else "-",
                "-" if self.best is None else f"{self.best:.1f}",
                "-" if self.checkpoints is None else str(self.checkpoints),
                "-" if self.wall_s is None else _duration(self.wall_s),
                "-" if self.dead_letters is None else str(self.dead_letters),
                self.run_dir or "-")


def _pid_alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_state(run: Path) -> str:
    """``running``, ``finished``, ``interrupted`` or ``failed`` from ``run/run.json``."""
    import socket

    from podracer.train import read_sessions

    sessions = read_sessions(run)
    if not sessions:
        return "interrupted"  # a store without session records: nothing says it ended
    last = sessions[-1]
    if "ended" not in last:
        same_host = last.get("host") == socket.gethostname()
        return "running" if same_host and _pid_alive(last.get("pid")) else "interrupted"
    return str(last.get("state") or "interrupted")


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return (f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600
            else f"{seconds // 60}m{seconds % 60:02d}s")


def _run_row(run: Path) -> Row | None:
    from broker.core.settings import read_experiment
    from leaderboard.store import DB_NAME, LeaderboardStore, spent
    from podracer.train import EXPERIMENT_FILE

    if not (run / EXPERIMENT_FILE).is_file():
        return None
    try:
        exp = read_experiment(run / EXPERIMENT_FILE)
    except ConfigError:
        return None
    row = Row(exp.name, state=run_state(run), env=exp.env, algos=list(exp.algos),
              run_dir=str(run))
    if (run / DB_NAME).is_file():
        with LeaderboardStore(run, create=False) as store:
            done = spent(store)
        row.best = None if done.best is None else done.best.score_mean
        row.checkpoints, row.wall_s = done.checkpoints, done.seconds
    return row


def experiment_rows(runs: Path, broker: str | None,
                    management: str | None = None) -> list[Row]:
    """The rows of ``ls``: one per run directory under ``runs`` (``runs/x`` and
    ``runs/x-2`` are two rows), joined with the broker's queues: an experiment's queues
    belong to its newest run directory."""
    rows: list[Row] = []
    if runs.is_dir():
        for run in sorted(p for p in runs.iterdir() if p.is_dir()):
            row = _run_row(run)
            if row is not None:
                rows.append(row)
    rows.sort(key=lambda r: (r.name, run_number(Path(r.run_dir or ""), r.name) or 0))
    newest = {r.name: r for r in rows}  # sorted oldest first: the last one wins
    if broker:
        from broker.runtime.lifecycle import BrokerAdmin, Management, experiments_on

        # the management API knows which experiments exist; AMQP says how many messages
        # now (the API's counts lag by its stats interval)
        for name in experiments_on(Management.of(broker, management)):
            with BrokerAdmin(broker, name) as admin:
                queues = admin.queues()
                busy = admin.running()
            if name not in newest:
                newest[name] = Row(name, state="queues only")
                rows.append(newest[name])
            row = newest[name]
            row.dead_letters = sum(q.messages for q in queues if q.name.endswith(".dead"))
            if busy is not None:
                row.state = "running"
    return sorted(rows, key=lambda r: (r.name, run_number(Path(r.run_dir or ""), r.name) or 0))


def cmd_ls(args: argparse.Namespace) -> int:
    """Every experiment with its state, env, algorithms, best, checkpoints, wall time
    and dead letters."""
    _quiet()
    broker = _broker(args, required=False)
    rows = experiment_rows(Path(args.runs), broker, args.management)
    if args.json:
        from podracer.json_out import emit

        emit({"runs": args.runs, "rows": [dataclasses.asdict(r) for r in rows]})
        return 0
    if not rows:
        print(f"no experiments in {args.runs}" + (" or on the broker" if broker else ""))
        return 0
    head = ("experiment", "state", "env", "algos", "best", "checkpoints", "wall",
            "dead letters", "run dir")
    print(format_table(head, [r.cells() for r in rows]))
    return 0


# ------------------------------------------------------------------ clean


def _confirm(question: str, yes: bool) -> bool:
    if yes:
        return True
    if not sys.stdin.isatty():
        raise ConfigError("--yes", "deleting a run directory needs a confirmation",
                          "add --yes to confirm without a terminal")
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def cmd_clean(args: argparse.Namespace) -> int:
    """Delete an experiment's queues, exchanges and expiry policy (and ``--delete-run``)."""
    from broker.runtime.lifecycle import BrokerAdmin, Management

    _quiet()
    name = check_experiment(args.name)
    broker = _broker(args, required=not args.delete_run)
    run = Path(args.runs) / name
    if args.delete_run and run_state(run) == "running":
        raise ConfigError("experiment", f"{name} is running (its train process is alive)",
                          "stop it first (Ctrl-C), then clean")
    if broker:
        with BrokerAdmin(broker, name) as admin:
            busy = admin.running()
            if busy is not None:
                raise ConfigError("experiment", f"{name} is running: {busy.name} has "
                                  f"{busy.consumers} consumer(s)", "stop it first")
            deleted = admin.delete_all()
        try:
            Management.of(broker, args.management).clear_expiry(name)
        except BrokerError as exc:
            print(f"podracer: expiry policy not removed: {exc}", file=sys.stderr)
        print(f"deleted {len(deleted)} queue(s) of {name}" +
              "".join(f"\n  {q}" for q in deleted))
    if args.delete_run:
        if not run.is_dir():
            print(f"no run directory {run}")
        elif _confirm(f"delete {run} (store, charts, logs)?", args.yes):
            shutil.rmtree(run)
            print(f"deleted {run}")
        else:
            print(f"kept {run}")
    return 0


# ------------------------------------------------------------------ dead-letters


def cmd_dead_letters(args: argparse.Namespace) -> int:
    """List, requeue or purge an experiment's dead letters."""
    from broker.runtime.lifecycle import BrokerAdmin

    _quiet()
    name = check_experiment(args.name)
    broker = _broker(args, required=True)
    assert broker is not None
    queues = [args.queue] if args.queue else list(WORK_QUEUES)
    if args.all and args.requeue:
        raise ConfigError("--all", "give either --requeue ID or --all", "not both")
    if args.purge and (args.all or args.requeue):
        raise ConfigError("--purge", "cannot be combined with --requeue/--all", "choose one")
    with BrokerAdmin(broker, name) as admin:
        if not admin.queues():
            raise ConfigError("experiment", f"no queues of {name!r} on the broker",
                              "check the name (podracer ls --broker ...)")
        for queue in queues:
            dead = admin.topology.dead(queue)
            if args.purge:
                print(f"{dead}: purged {admin.purge_dead(queue)} dead letter(s)")
            elif args.all or args.requeue:
                ids = None if args.all else set(args.requeue)
                moved = admin.requeue(queue, ids)
                print(f"{dead}: {moved} dead letter(s) sent back to {queue}")
            else:
                _print_letters(dead, admin.dead_letters(queue, args.limit))
    return 0


def _print_letters(dead: str, letters: list[Any]) -> None:
    now = time.time()
    print(f"{dead}: {len(letters)} dead letter(s)")
    if letters:
        rows = [(letter.id or "?", letter.kind or "?",
                 "-" if letter.at is None else _duration(max(0.0, now - letter.at)),
                 letter.service or "broker", letter.reason) for letter in letters]
        print(format_table(("id", "kind", "age", "refused by", "reason"), rows))


# ------------------------------------------------------------------ registration


def add_commands(sub: Any, add_common: Callable[[argparse.ArgumentParser], None]) -> None:
    """Register ``ls``, ``clean`` and ``dead-letters`` on ``sub``."""
    p = sub.add_parser("ls", help="every run directory with its state, best score, dead letters")
    p.add_argument("--runs", default=DEFAULT_RUNS, help="runs directory (default runs)")
    add_json(p)
    p.add_argument("--management", help="management API base URL "
                   "(default http://<broker host>:15672)")
    add_common(p)
    p.set_defaults(func=cmd_ls)

    p = sub.add_parser("clean", help="delete an experiment's queues (and --delete-run its run)")
    p.add_argument("name", metavar="EXPERIMENT")
    p.add_argument("--delete-run", action="store_true",
                   help="also delete the run directory runs/<experiment>")
    p.add_argument("--runs", default=DEFAULT_RUNS, help="runs directory (default runs)")
    p.add_argument("--yes", action="store_true", help="do not ask before deleting the store")
    p.add_argument("--management", help="management API base URL "
                   "(default http://<broker host>:15672)")
    add_common(p)
    p.set_defaults(func=cmd_clean)

    p = sub.add_parser("dead-letters", help="list, requeue or purge an experiment's "
                       "dead letters")
    p.add_argument("name", metavar="EXPERIMENT")
    p.add_argument("--queue", choices=WORK_QUEUES,
                   help="only this queue's dead letters (default: all)")
    p.add_argument("--requeue", action="append", metavar="ID",
                   help="send this dead letter back to its work queue (repeatable; "
                        "default: list only)")
    p.add_argument("--all", action="store_true", help="send every dead letter back")
    p.add_argument("--purge", action="store_true", help="empty the dead-letter queue")
    p.add_argument("--limit", type=int, default=100, help="rows to list (default 100)")
    add_common(p)
    p.set_defaults(func=cmd_dead_letters)
