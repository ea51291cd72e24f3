"""``podracer users setup|remove``: one least-privilege RabbitMQ user per role.

``setup`` (as a RabbitMQ administrator) creates or resets ``podracer-<exp>-<role>``
for each role (``broker.runtime.users`` says what each may do) and prints one broker
URL per role; ``--env-file`` also writes ``PODRACER_<ROLE>_USER`` /
``PODRACER_<ROLE>_PASSWORD`` lines for docker compose and ``docker stack deploy``;
``--secret-file`` writes the experiment's message secret there if it does not exist
yet (``broker.core.auth``). ``remove`` deletes the users.

    podracer users setup --broker amqp://admin:PASS@127.0.0.1:5672/ --experiment ant \\
        --env-file .env --secret-file podracer.secret
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker.core.errors import ConfigError
from broker.core.topology import check_experiment


def _args(args: argparse.Namespace) -> tuple[str, str, tuple[str, ...]]:
    from broker.runtime.users import ROLES

    broker = args.broker or os.environ.get("PODRACER_BROKER")
    if not broker or not broker.startswith(("amqp://", "amqps://")):
        raise ConfigError("--broker", "`podracer users` needs the RabbitMQ URL of an "
                          "administrator", "pass --broker amqp://admin:pass@host:5672/")
    roles = tuple(r.strip() for r in (args.roles or ",".join(ROLES)).split(",") if r.strip())
    for role in roles:
        if role not in ROLES:
            raise ConfigError("--roles", f"unknown role {role!r}", f"use {', '.join(ROLES)}")
    return broker, check_experiment(args.experiment), roles


def cmd_setup(args: argparse.Namespace) -> int:
    """Create or reset the users and print their broker URLs."""
    from broker.core.auth import write_secret_file
    from broker.runtime.lifecycle import Management
    from broker.runtime.users import role_url, setup_users

    broker, experiment, roles = _args(args)
    made = setup_users(Management.of(broker, args.management), experiment, roles)
    for creds in made:
        print(f"{creds.role:<13} {role_url(broker, creds)}")
    if args.env_file:
        lines = [f"PODRACER_{c.role.upper()}_{what}={value}" for c in made
                 for what, value in (("USER", c.user), ("PASSWORD", c.password))]
        path = Path(args.env_file)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a") as fh:
            fh.write("\n".join(lines) + "\n")
        print(f"podracer: credentials appended to {path}")
    if args.secret_file:
        path = Path(args.secret_file)
        if path.exists():
            print(f"podracer: keeping the experiment's secret in {path}")
        else:
            write_secret_file(path)
            print(f"podracer: the experiment's secret is in {path} (PODRACER_SECRET_FILE)")
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    """Delete the users."""
    from broker.runtime.lifecycle import Management
    from broker.runtime.users import remove_users

    broker, experiment, roles = _args(args)
    removed = remove_users(Management.of(broker, args.management), experiment, roles)
    print(f"podracer: removed {len(removed)} user(s): {', '.join(removed) or 'none'}")
    return 0


def add_command(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    """Register ``podracer users``."""
    users = sub.add_parser("users", help="least-privilege RabbitMQ users, one per role")
    verbs = users.add_subparsers(dest="verb", required=True)
    for verb, func, text in (("setup", cmd_setup, "create or reset the users; print them"),
                             ("remove", cmd_remove, "delete the users")):
        p = verbs.add_parser(verb, help=text)
        p.add_argument("--experiment", required=True, help="experiment name")
        p.add_argument("--roles", help="comma-separated subset of "
                                       "pod,generator,updater,orchestrator,operator")
        p.add_argument("--management", help="management API base URL (default "
                                            "http://<broker host>:15672)")
        if verb == "setup":
            p.add_argument("--env-file", help="append PODRACER_<ROLE>_USER/_PASSWORD lines")
            p.add_argument("--secret-file", help="write a new message secret here if absent")
        common(p)
        p.set_defaults(func=func)
