"""``podracer users env|setup|remove``: one least-privilege RabbitMQ user per role, and
with ``--pods N`` one per pod.

* ``env`` (no broker needed) prints ``PODRACER_<ROLE>_USER`` / ``_PASSWORD`` lines with
  fresh passwords, for a compose ``.env`` file, and ``PODRACER_POD_<k>_USER`` /
  ``_PASSWORD`` for k = 1..N; with ``--secret-file`` it also writes the experiment's
  message secret there (if absent) and prints ``PODRACER_SECRET_PATH`` (the file
  compose hands the services as a Docker secret); with ``--compose-file`` it writes
  the compose override that runs pod k as ``pod-<k>`` (``podracer.users_compose``).
* ``setup`` (as a RabbitMQ administrator) creates or resets ``podracer-<exp>-<role>``
  for each role and ``podracer-<exp>-pod-<k>`` for each pod (``broker.runtime.users``
  says what each may do) and prints one broker URL per user; ``--passwords-from-env``
  takes the passwords from the variables ``env`` printed (what compose's one-shot
  ``users`` service does with the ``.env`` that ``env`` wrote), else it makes new ones.
* ``remove`` deletes the users, every pod's own user included.

    podracer users env --name pendulum --pods 2 --secret-file podracer.secret > .env
    podracer users setup --broker amqp://admin:PASS@127.0.0.1:5672/ --name pendulum --pods 2
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker.core.errors import ConfigError
from broker.core.topology import check_experiment

_ROLE_NAMES = "pod,generator,updater,orchestrator,operator"


def _roles(args: argparse.Namespace) -> tuple[str, ...]:
    from broker.runtime.users import ROLES

    roles = tuple(r.strip() for r in (args.roles or ",".join(ROLES)).split(",") if r.strip())
    for role in roles:
        if role not in ROLES:
            raise ConfigError("--roles", f"unknown role {role!r}", f"use {', '.join(ROLES)}")
    return roles


def _broker(args: argparse.Namespace) -> str:
    broker: str | None = args.broker or os.environ.get("PODRACER_BROKER")
    if not broker or not broker.startswith(("amqp://", "amqps://")):
        raise ConfigError("--broker", f"`podracer users {args.verb}` needs the RabbitMQ URL "
                          "of an administrator", "pass --broker amqp://admin:pass@host:5672/")
    return broker


def _variable(role: str, what: str) -> str:
    """``PODRACER_POD_USER``, ``PODRACER_POD_1_PASSWORD`` (``pod-1``'s), ..."""
    return f"PODRACER_{role.upper().replace('-', '_')}_{what}"


def _users(args: argparse.Namespace) -> tuple[str, ...]:
    """The roles, then ``pod-1`` .. ``pod-<--pods>``."""
    from broker.runtime.users import pod_users

    return (*_roles(args), *pod_users(args.pods))


def cmd_env(args: argparse.Namespace) -> int:
    """Print user and fresh password variables per role (and write the secret file)."""
    from broker.core.auth import write_secret_file
    from broker.runtime.users import new_password, user_name

    experiment = _experiment(args)
    if args.compose_file and not args.pods:  # before a line goes to the .env
        raise ConfigError("--compose-file", "no pod users to run",
                          "give --pods N (the pods to run, each as its own user)")
    print(f"PODRACER_EXPERIMENT={experiment}")
    for role in _users(args):
        print(f"{_variable(role, 'USER')}={user_name(experiment, role)}")
        print(f"{_variable(role, 'PASSWORD')}={new_password()}")
    if args.secret_file:
        path = Path(args.secret_file)
        if not path.exists():
            write_secret_file(path)
        print(f"PODRACER_SECRET_PATH={path.resolve()}")
    if args.compose_file:
        from podracer.users_compose import pods_override_text

        Path(args.compose_file).write_text(pods_override_text(args.pods))
    return 0


def cmd_setup(args: argparse.Namespace) -> int:
    """Create or reset the users and print their broker URLs."""
    from broker.runtime.lifecycle import Management
    from broker.runtime.users import role_url, setup_users

    broker, experiment, roles = _broker(args), _experiment(args), _roles(args)
    passwords = None
    if args.passwords_from_env:
        users = _users(args)
        missing = [_variable(u, "PASSWORD") for u in users
                   if not os.environ.get(_variable(u, "PASSWORD"))]
        if missing:
            raise ConfigError(missing[0], "not set (--passwords-from-env)",
                              "write them with `podracer users env` (the same --pods) "
                              "into compose's .env")
        passwords = {u: os.environ[_variable(u, "PASSWORD")] for u in users}
    made = setup_users(Management.of(broker, args.management), experiment, roles, passwords,
                       pods=args.pods)
    for creds in made:
        print(f"{creds.role:<13} {role_url(broker, creds)}")
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    """Delete the users (with the ``pod`` role: every pod's own user too)."""
    from broker.runtime.lifecycle import Management
    from broker.runtime.users import remove_users

    broker, experiment, roles = _broker(args), _experiment(args), _roles(args)
    removed = remove_users(Management.of(broker, args.management), experiment, roles,
                           pods="pod" in roles)
    print(f"podracer: removed {len(removed)} user(s): {', '.join(removed) or 'none'}")
    return 0


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"not a count of pods: {text!r}")
    return int(text)


def _experiment(args: argparse.Namespace) -> str:
    if not args.experiment:
        raise ConfigError("--name", "no experiment name given", "e.g. --name pendulum")
    return check_experiment(args.experiment)


def add_command(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    """Register ``podracer users``."""
    users = sub.add_parser("users", help="least-privilege RabbitMQ users, one per role "
                                         "and per pod")
    verbs = users.add_subparsers(dest="verb", required=True)
    for verb, func, text in (
            ("env", cmd_env, "print user/password variables for compose (no broker)"),
            ("setup", cmd_setup, "create or reset the users; print their broker URLs"),
            ("remove", cmd_remove, "delete the users")):
        p = verbs.add_parser(verb, help=text)
        p.add_argument("--name", dest="experiment", help="experiment name (required)")
        p.add_argument("--roles", help=f"comma-separated subset of {_ROLE_NAMES} (default: all)")
        if verb != "remove":  # remove finds every pod user itself
            p.add_argument("--pods", type=_count, default=0,
                           help="also one user per pod, podracer-<name>-pod-1 .. -pod-N, "
                                "each allowed only its own heartbeats (default: 0, the "
                                "pods share the pod role's user)")
        if verb == "env":
            p.add_argument("--secret-file", help="write a new message secret here if absent "
                           "(default: none)")
            p.add_argument("--compose-file", help="with --pods: write here a compose "
                           "override running each pod as its own user (default: none)")
        else:
            p.add_argument("--management", help="management API base URL (default "
                                                "http://<broker host>:15672)")
        if verb == "setup":
            p.add_argument("--passwords-from-env", action="store_true",
                           help="passwords from PODRACER_<ROLE>_PASSWORD (podracer users env)")
        common(p)
        p.set_defaults(func=func)
