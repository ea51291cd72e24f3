"""The ``podracer`` command line: train, serve, status, leaderboard, export, evaluate."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from broker.core.auth import secret_from_env
from broker.core.errors import ConfigError, ConnectionClosed, PodracerError
from broker.core.experiment import apply_overrides, parse_experiment
from broker.core.settings import (
    DEFAULT_ENV,
    Settings,
    configure_logging,
    default_experiment_data,
    log_to_file,
    read_experiment_data,
    settings_from_env,
)
from orchestrator.scalers import SCALERS
from podracer import renames
from podracer.cli_parser import PodracerParser, finish, unreachable, version
from podracer.roles import ROLES
from podracer.status_cli import _quiet_client_logs
from podracer.units import parse_budget, parse_duration

log = logging.getLogger(__name__)
def checked_experiment(data: dict[str, Any]) -> Any:
    """Parse TOML-shaped ``data`` and check it against the registries, once: how both
    ``train`` and ``serve`` read their experiment."""
    from agents.registry import default_registry
    from leaderboard.checks import experiment_check
    from leaderboard.selection import default_strategies

    return parse_experiment(data, check=experiment_check(default_registry(),
                                                         default_strategies()))


def _experiment_from_args(args: argparse.Namespace) -> Any:
    source = args.experiment_file or args.experiment
    data = (read_experiment_data(source) if source
            else default_experiment_data(args.env or DEFAULT_ENV))
    changes: dict[str, Any] = {"env": args.env, "pods": args.pods,
                               "target_score": args.target_score, "seed": args.seed,
                               "name": args.name,
                               "reproducible": True if args.reproducible else None}
    if args.budget:
        budget = parse_budget(args.budget)
        changes["total_budget"] = budget
    if args.round_budget:
        rb = parse_budget(args.round_budget, "--round-budget")
        changes["round_budget"] = ({"seconds": rb["seconds"]} if "seconds" in rb
                                   else {"steps": rb["env_steps"]})
    if args.track is not None:
        # one flag for the experiment's `tracking` list; "none" turns every tracker off
        from broker.core.experiment import TRACKERS

        chosen = [t.strip() for t in args.track.split(",") if t.strip() not in ("", "none")]
        unknown = [t for t in chosen if t not in TRACKERS]
        if unknown:
            raise ConfigError("--track", f"unknown tracker {unknown[0]!r}",
                              f"use {', '.join(TRACKERS)} (comma-separated) or none")
        changes["tracking"] = chosen
    data = apply_overrides(data, changes)
    if args.algos:
        names = [a.strip() for a in args.algos.split(",") if a.strip()]
        if not names:
            raise ConfigError("--algos", "no algorithm given", "e.g. --algos ppo,sac,td3")
        weights: dict[str, float] = {}
        for item in names:
            name, _, weight = item.partition(":")
            try:
                weights[name] = float(weight) if weight else 1.0
            except ValueError:
                raise ConfigError("--algos", f"bad weight in {item!r}",
                                  "e.g. ppo:2,sac:1") from None
        # the mix replaces the file's; settings of algorithms left out go with them
        data["algos"] = weights
        for key in ("num_envs", "hparams"):
            if isinstance(data.get(key), dict):
                data[key] = {k: v for k, v in data[key].items() if k in weights}
    return checked_experiment(data)


def _with_spaces(experiment: Any) -> Any:
    """``experiment`` with its env's spaces recorded (one env copy built here, where the
    run starts) so that the updater checks checkpoints without the simulator; left
    unrecorded when that copy cannot be built here (the updater reads them itself)."""
    if experiment.spaces is not None:
        return experiment
    from envs.spaces import read_spaces

    try:
        spaces = read_spaces(experiment.env, **experiment.env_kwargs)
    except Exception as exc:
        logging.getLogger(__name__).debug("spaces of %s not recorded: %s", experiment.env, exc)
        return experiment
    return dataclasses.replace(experiment, spaces=spaces)


def _resume_args(args: argparse.Namespace) -> Path:
    """``--resume [DIR]``: the experiment comes from ``DIR/experiment.json``; without DIR
    from the newest run directory of the experiment (``--name``, else the default name
    of ``--env``): ``runs/<name>-N`` with the highest N."""
    from podracer.run_dir import last_run
    from podracer.train import EXPERIMENT_FILE

    if args.resume:
        out = Path(args.resume)
    else:
        name = args.name or default_experiment_data(args.env or DEFAULT_ENV)["name"]
        out = last_run(Path("runs"), name)
    if args.fresh:
        raise ConfigError("--fresh", "cannot be combined with --resume",
                          "--resume continues a run, --fresh deletes it; choose one")
    if args.experiment_file or args.experiment or args.run_dir:
        raise ConfigError("--resume", "the run directory already holds its experiment",
                          "drop the experiment file and --run-dir; flags like --budget or "
                          "--target-score still apply")
    if not (out / EXPERIMENT_FILE).is_file():
        raise ConfigError("--resume", f"{out} holds no run to resume",
                          "point it at the run directory of an earlier `podracer train` "
                          "(runs/<experiment>)")
    args.experiment = str(out / EXPERIMENT_FILE)
    # stdout of --print-config is the TOML alone
    print(f"podracer: resuming the run in {out}", flush=True,
          file=sys.stderr if args.print_config else sys.stdout)
    return out


def cmd_train(args: argparse.Namespace) -> int:
    """Run a tournament (embedded by default, separate processes with --broker)."""
    from podracer.run_dir import next_free
    from podracer.train import DEFAULT_QUEUE_EXPIRY_S, has_run, train

    resume_dir = _resume_args(args) if args.resume is not None else None
    if args.print_config:
        from podracer.config_toml import print_config

        return print_config(args, _experiment_from_args(args))
    experiment = _with_spaces(_experiment_from_args(args))
    if resume_dir is not None and args.name and args.name != experiment.name:
        raise ConfigError("--name", f"the run in {resume_dir} is {experiment.name!r}",
                          "a resumed run keeps its name; drop --name")
    settings = settings_from_env(experiment=experiment, broker=args.broker,
                                 device=args.device, torch_threads=args.threads,
                                 env_threads=args.env_threads)
    from podracer.preflight import checked

    # before anything is written: a broken set-up is one line and exit code 2
    ready = checked(settings, explicit_algos=bool(args.algos or args.experiment_file
                                                  or args.experiment), dry_run=args.dry_run)
    if ready is None:
        return 0
    settings = ready
    out = resume_dir or (Path(args.run_dir) if args.run_dir else Path("runs") / experiment.name)
    if not (resume_dir or args.run_dir or args.fresh):
        # a repeated command starts a new run beside the earlier ones (as SB3 and CleanRL
        # users expect); an explicit --out holding a run still stops (run_dir.check)
        base, out = out, next_free(out)
        if out != base:
            print(f"podracer: {base} holds an earlier run (`podracer train --resume --name "
                  f"{experiment.name}` continues the newest); this run writes {out}",
                  flush=True)
    expiry = (parse_duration(args.queue_expiry, "--queue-expiry") if args.queue_expiry
              else DEFAULT_QUEUE_EXPIRY_S)
    if args.fresh and has_run(out):
        from podracer import run_dir

        run_dir.delete(out, "--fresh")  # refused while a train still writes it
        print(f"podracer: --fresh: deleted the earlier run in {out}", flush=True)
    log_to_file(out / "logs" / "train.log", logging.INFO if args.verbose else logging.WARNING)
    result = train(settings, out, progress=not args.quiet, resume=resume_dir is not None,
                   queue_expiry_s=expiry)
    return result.exit_code


def _serve_settings(args: argparse.Namespace, role: str) -> Settings:
    # parsed and checked once, like ``train``'s: a bad algorithm fails here, not when
    # the generator first plans it
    source = args.experiment or os.environ.get("PODRACER_EXPERIMENT_FILE")
    experiment = checked_experiment(read_experiment_data(source) if source
                                    else default_experiment_data())
    settings = settings_from_env(experiment=experiment, broker=args.broker, store=args.store,
                                 device=args.device, name=args.instance)
    if settings.broker.startswith("memory"):
        raise ConfigError("--broker", f"`serve {role}` needs a real broker",
                          "pass --broker amqp://user:pass@host:5672/ (or PODRACER_BROKER); "
                          "for everything in one process use `podracer train`")
    return settings


def cmd_serve(args: argparse.Namespace) -> int:
    """Run one service until control.stop or SIGTERM."""
    code = _serve(args)
    # the service has stopped cleanly; a late SIGTERM must not turn exit 0 into -15
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return code


def _serve(args: argparse.Namespace) -> int:
    from broker.runtime.supervise import run_supervised  # a crash restarts the service
    from broker.runtime.users import pod_name
    from broker.transports.connect import connector
    from podracer.preflight import checked
    from podracer.roles import Wiring, service

    ready = checked(_serve_settings(args, args.role), explicit_algos=True,
                    dry_run=args.dry_run, must_end=False)
    if ready is None:
        return 0
    settings = ready
    name = settings.instance_name(args.role)
    if args.role == "pod":  # a pod's own user may send heartbeats under its name only
        name = pod_name(settings.broker, settings.experiment.name, settings.name) or name
    secret = secret_from_env()
    if secret is None and not args.insecure:
        raise ConfigError("PODRACER_SECRET_FILE", f"`serve {args.role}` has no secret to "
                          "authenticate messages with",
                          "set PODRACER_SECRET_FILE (or PODRACER_SECRET) to the "
                          "experiment's secret; --insecure only where nobody untrusted can "
                          "reach the broker")
    if secret is None:
        log.warning("running --insecure: messages are neither signed nor checked")
    # what services share is built here, once; which of it each takes: podracer.roles
    wiring = Wiring(connector(settings.broker, secret=secret, insecure=args.insecure))
    options: dict[str, Any] = {}
    if args.role == "updater":
        options = {"reevaluate": args.reevaluate}
    elif args.role == "orchestrator":
        from orchestrator.scalers import build_scaler
        from orchestrator.service import default_policy

        options = {"scaler": build_scaler(args.scaler, settings, log_dir=args.log_dir),
                   "policy": default_policy(settings, min_pods=args.min_pods),
                   "poll_s": args.poll}
    return run_supervised(service(args.role, wiring, **options), settings, name=name)


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--broker", help="amqp://user:pass@host:5672/ (env PODRACER_BROKER; "
                   "default: none, `train` then runs in one process)")
    p.add_argument("--device", help="cpu, cuda, cuda:N (env PODRACER_DEVICE; default: "
                   "the experiment's device, auto = CUDA when available)")
    p.add_argument("--log-level", default=None, help="DEBUG, INFO, WARNING (default: INFO)")


def _add_dry_run(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dry-run", action="store_true",
                   help="check the env, algorithms, device and budget; run nothing")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``podracer``."""
    parser = PodracerParser(prog="podracer", description=__doc__)
    parser.add_argument("--version", action="version", version=f"podracer {version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train a population (all services in one go)")
    p.add_argument("experiment_file", nargs="?", help="experiment TOML (same as --experiment)")
    p.add_argument("--experiment", help="experiment TOML file (default: none, flags and "
                   "Podracer's defaults)")
    p.add_argument("--env", help=f"env name (default: the file's, else {DEFAULT_ENV})")
    p.add_argument("--algos", help="algorithm mix, e.g. ppo,sac,td3 or ppo:2,sac:1 "
                   "(default: the file's, else ppo,sac,td3 less those that cannot act on "
                   "the env)")
    p.add_argument("--pods", type=int, help="population size (default: the file's, else "
                   "0 = from the machine: one per GPU, else one per CPU core)")
    p.add_argument("--target-score", type=float,
                   help="stop when the best score reaches this (default: the file's, else none)")
    p.add_argument("--budget", help="total budget: seconds (300s, 5m) or env steps (2M) "
                   "(default: the file's; without a file 30m)")
    p.add_argument("--round-budget", help="one round: seconds (15s) or env steps (50k) "
                   "(default: the file's, else total seconds / 15 within 10s..120s)")
    p.add_argument("--seed", type=int, help="seed of the generator and so of every pod "
                   "(default: the file's, else 0)")
    p.add_argument("--reproducible", action="store_true",
                   help="same seed, same leaderboard: one pod, step budgets, decisions by "
                        "env steps, seeded evaluations (default: off)")
    p.add_argument("--name", help="experiment name: namespace of queues and the run dir "
                   "(default: the file's, else from the env)")
    p.add_argument("--run-dir", help="run directory (default: runs/<experiment>, or "
                   "runs/<experiment>-N when that holds an earlier run)")
    p.add_argument("--threads", type=int, help="torch threads per pod process "
                   "(env PODRACER_TORCH_THREADS; default: 1)")
    p.add_argument("--env-threads", type=int, help="threads that step one pod's MuJoCo env "
                   "copies (env PODRACER_ENV_THREADS; default: the CPUs shared among the "
                   "pods, at least 1)")
    p.add_argument("--resume", metavar="RUN_DIR", nargs="?", const="",
                   help="carry on an interrupted run: RUN_DIR, or without it the last run "
                        "directory of the experiment (runs/<experiment>[-N]) (default: off)")
    p.add_argument("--print-config", action="store_true",
                   help="print the complete experiment (flags and file merged, every "
                        "default filled) as TOML and exit")
    p.add_argument("--fresh", action="store_true",
                   help="delete the run already in the run directory and start over")
    p.add_argument("--queue-expiry", metavar="DURATION",
                   help="broker mode: an unused work queue is deleted after this long "
                        "(default: 1d; a killed run must be resumed before)")
    p.add_argument("--track", metavar="TRACKERS",
                   help="where metrics and hyperparameters go: tensorboard, mlflow, "
                        "tensorboard,mlflow or none (default: the experiment's `tracking`, "
                        "tensorboard)")
    p.add_argument("--quiet", action="store_true", help="no progress view")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="service log lines on the console too (always in <out>/logs/)")
    _add_common(p)
    _add_dry_run(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("serve", help="run one service (needs --broker)")
    p.add_argument("role", choices=list(ROLES))
    p.add_argument("--experiment", help="experiment file (env PODRACER_EXPERIMENT_FILE; "
                   "default: Podracer's default experiment)")
    p.add_argument("--store", help="shared store directory (env PODRACER_STORE; "
                   "default: runs/<experiment>)")
    p.add_argument("--instance", help="instance name (env PODRACER_POD, default: "
                   "<role>-<host>-<pid>; a pod logged in as its own user: that user)")
    p.add_argument("--reevaluate", action="store_true",
                   help="updater: re-evaluate checkpoints instead of trusting pods")
    p.add_argument("--scaler", default=None, choices=SCALERS,
                   help="orchestrator: how pods are run (env PODRACER_SCALER, default: local)")
    p.add_argument("--min-pods", type=int, default=None,
                   help="orchestrator: floor of pods (default: 1)")
    p.add_argument("--poll", type=float, default=1.0, help="orchestrator: seconds per poll")
    p.add_argument("--log-dir", help="orchestrator: directory for local pods' logs "
                   "(default: none, pods log to the console)")
    p.add_argument("--insecure", action="store_true",
                   help="run without the experiment's secret (PODRACER_SECRET_FILE): "
                        "messages neither signed nor checked")
    _add_common(p)
    _add_dry_run(p)
    p.set_defaults(func=cmd_serve)

    from podracer import (
        backtest,
        inspect_cli,
        layers,
        lifecycle_cli,
        report,
        status_cli,
        users_cli,
    )

    status_cli.add_command(sub, _add_common)
    lifecycle_cli.add_commands(sub, _add_common)
    inspect_cli.add_commands(sub, _add_common)
    layers.add_command(sub, _add_common)
    report.add_command(sub, _add_common)
    backtest.add_command(sub, _add_common)
    users_cli.add_command(sub, _add_common)
    renames.add_aliases(sub)
    return finish(parser)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``podracer`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        configure_logging(args.log_level)
        _quiet_client_logs()
        code: int = args.func(args)
        return code
    except ConnectionClosed as exc:
        print(f"podracer: error: {unreachable(args, exc)}", file=sys.stderr)
        return 2
    except PodracerError as exc:
        print(f"podracer: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
