"""``podracer train``: a whole tournament in one command.

``train`` is the sequence of a session; each step has its module:

1. the run directory (``podracer.run_dir``): ``runs/<experiment>/`` must hold a run to
   resume, or none to start; it receives the leaderboard store (SQLite + blobs), the
   resolved experiment (``experiment.json``), ``run.json`` (one record per session:
   when it started and ended, and how), TensorBoard event files, the charts and the
   logs;
2. resume accounting (``podracer.resume``, ``docs/tutorials/lifecycle.md``): what the
   run has spent, whether it is over already, the time budget left;
3. mode dispatch (``podracer.modes``): the services as tasks of this process on
   ``memory://`` (the default), or as OS processes on RabbitMQ (``--broker``), with
   the broker prepared before and cleaned up after;
4. the report: charts and the summary line.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

from agents.base import AlgorithmRegistry
from broker.core.schemas import Budget
from broker.core.settings import Settings, env_threads_applied, write_experiment
from broker.transports.base import redact
from leaderboard.selection import SelectionRegistry
from orchestrator import clock as run_clock
from orchestrator.probes import machine_pods
from podracer import console, modes, run_dir
from podracer import resume as resuming
from podracer.modes import DEFAULT_QUEUE_EXPIRY_S
from podracer.monitor import Monitor
from podracer.outcome import NO_CHECKPOINT, charts_text
from podracer.report import Summary, write_report
from podracer.resume import already_done, time_left
from podracer.run_dir import EXPERIMENT_FILE, has_run, read_sessions

__all__ = ["DEFAULT_QUEUE_EXPIRY_S", "EXPERIMENT_FILE", "TrainResult", "already_done",
           "fit_to_machine", "has_run", "read_sessions", "time_left", "train"]


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """How a training run ended."""

    exit_code: int
    best_score: float | None
    checkpoints: int
    seconds: float
    stop_reason: str | None


def fit_to_machine(settings: Settings) -> Settings:
    """``settings`` with the population and threads the machine decides: pods from
    ``machine_pods`` unless the experiment sets them, one torch thread per pod unless
    ``--threads`` says otherwise, and the node's CPUs shared among the pods as the
    threads that step each env's copies unless ``--env-threads`` says otherwise.

    One torch thread, because a second one adds almost nothing to an RL round (see
    ``machine_pods``), and an OpenMP pool wider than the free cores spins: with another
    process busy, a 2-thread PPO pod on 2 cores ran 14x slower than a 1-thread one.
    Env threads shared, because a pod stepping MuJoCo on every CPU takes them from the
    pod beside it: on HalfCheetah-v5 (2 cores, 2 pods) a SAC pod beside PPO's 2-thread
    env stepping made 1134-1491 env steps/s and 2053 beside SAC's; with one env thread
    per pod the tournament scored 6986 ± 96 against 6532 ± 555 (``benchmarks.tournament``,
    row ``tournament-envthreads1``, 3 seeds). A lone pod keeps every CPU."""
    exp = settings.experiment
    if not exp.pods:
        exp = dataclasses.replace(exp, pods=machine_pods())
    env_threads = settings.env_threads or max(1, len(os.sched_getaffinity(0)) // exp.pods)
    return dataclasses.replace(settings, experiment=exp, torch_threads=settings.torch_threads or 1,
                               env_threads=env_threads)


def _budget_text(budget: Budget) -> str:
    parts = ([console.duration(budget.seconds)] if budget.seconds is not None else []) + (
        [f"{budget.steps:,} env steps"] if budget.steps is not None else [])
    return " or ".join(parts)


def train(settings: Settings, out: Path, *, progress: bool = True,
          registry: AlgorithmRegistry | None = None,
          strategies: SelectionRegistry | None = None, resume: bool = False,
          queue_expiry_s: float = DEFAULT_QUEUE_EXPIRY_S) -> TrainResult:
    """Run a tournament to its stop condition; write ``out`` (see the module doc).

    ``resume`` carries on the run in ``out``; without it, ``out`` must not hold a run
    yet (``ConfigError`` naming ``--resume`` and ``--fresh``). ``registry`` and
    ``strategies`` are the algorithms and selection strategies of the embedded
    services (default: Podracer's own); broker mode's services build theirs."""
    # 1. the run directory, held for the session: `--fresh` or a second train on it
    # refuses while this one lives
    run_dir.check(out, resume)
    with run_dir.holding(out):
        return _train(settings, out, progress=progress, registry=registry,
                      strategies=strategies, resume=resume, queue_expiry_s=queue_expiry_s)


def _train(settings: Settings, out: Path, *, progress: bool,
           registry: AlgorithmRegistry | None, strategies: SelectionRegistry | None,
           resume: bool, queue_expiry_s: float) -> TrainResult:
    settings = dataclasses.replace(fit_to_machine(settings), store=out)
    exp = settings.experiment
    embedded = settings.broker.startswith("memory")
    # 2. what the run has spent
    done = resuming.spent_in(out) if resume else None
    if done is not None:
        finished = already_done(exp, done)
        if finished is not None:
            print(f"podracer: {out} is finished already ({finished}); nothing to resume. "
                  "Give a larger --budget or --target-score to go on.", flush=True)
            best = done.best.score_mean if done.best else None
            return TrainResult(0, best, done.checkpoints, 0.0, finished)
        print(f"podracer: {resuming.describe(exp, done)}", flush=True)
    write_experiment(exp, out / EXPERIMENT_FILE)
    # 3. the mode: the broker is checked and prepared before the session is recorded
    if not embedded:
        modes.prepare_broker(settings.broker, exp.name, resume, queue_expiry_s)
    wiring = modes.embedded_wiring(registry, strategies) if embedded else None
    session_settings = dataclasses.replace(
        settings, experiment=time_left(exp, done) if done is not None else exp)
    where = "embedded" if embedded else redact(settings.broker)
    print(f"podracer: training {', '.join(exp.algos)} on {exp.env} with "
          f"{console.plural(exp.pods, 'pod')} ({where}); "
          f"{console.plural(settings.torch_threads or 1, 'torch thread')} and "
          f"{console.plural(settings.env_threads or 1, 'env thread')} per pod; rounds of "
          f"{_budget_text(exp.round_budget)}; budget {console.budget(exp.total_budget)}; "
          f"{console.target(exp)}; writing {out}", flush=True)
    sessions = run_dir.Sessions(out)
    sessions.open(where)
    run_clock.reset(out)  # this session's budget is what is left: its clock starts at 0
    monitor = Monitor(exp, out, echo=progress)
    if done is not None:
        resuming.continue_monitor(monitor, done)
    session = modes.Session()
    started = time.monotonic()
    code = 1
    try:
        with env_threads_applied(session_settings):
            code = modes.run_session(session_settings, monitor, out, session, wiring)
    finally:
        monitor.close()
        state = sessions.close(interrupted=session.interrupted, stop=monitor.stop_reason,
                               exit_code=code)
        if state == NO_CHECKPOINT:
            code = 1
    # 4. the report
    return _report(out, sessions, monitor, code, state, started)


def _ensemble_text(summary: Summary) -> str:
    """`` (an ensemble of 3 (...), measured above the best checkpoint alone)`` when the
    run's answer is one (``leaderboard.answer``), else nothing."""
    if summary.answer is None or not summary.answer.ensemble:
        return ""
    return f" ({summary.answer.describe()}, measured above the best checkpoint alone)"


def _report(out: Path, sessions: run_dir.Sessions, monitor: Monitor, code: int, state: str,
            started: float) -> TrainResult:
    """Charts of the whole run (from its first session on) and the summary line."""
    seconds = time.monotonic() - started
    summary = write_report(out, started_wall=sessions.first_started(monitor.started_wall),
                           target=monitor.experiment.target_score)
    result = TrainResult(code, summary.best_score, summary.checkpoints, seconds,
                         monitor.stop_reason)
    ended = "FAILED" if code else "interrupted" if state == "interrupted" else "done"
    print(f"podracer: {ended} after {console.duration(seconds)}: "
          f"{console.plural(result.checkpoints, 'checkpoint')}, best "
          f"{console.score(result.best_score)}{_ensemble_text(summary)}, "
          f"{resuming.spent_in(out).env_steps:,} env steps; "
          f"stop: {result.stop_reason or state}; {charts_text(summary.charts)}"
          + (f"; go on with `podracer train --resume {out}`" if state == "interrupted" else ""),
          flush=True)
    return result
