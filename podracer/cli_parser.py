"""How every ``podracer`` subcommand parses: one-line errors, defaults in ``--help``,
renamed flags that keep their old spelling for one release, and ``--version``.

* ``PodracerParser.error``: ``podracer train: error: <what>`` plus a hint to ``--help`` on
  one line, exit code 2 (argparse prints the whole usage block, which hides the error).
* ``DefaultsFormatter``: ``--help`` shows each option's default; an option whose default
  is ``None`` says in its own help text what it falls back to.
* ``deprecated(parser, old, new)``: ``old`` still works, hidden from ``--help``, and prints
  one warning line naming ``new``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn


def version() -> str:
    """The installed distribution's version (the package's ``__version__`` when Podracer
    runs from a source tree that was never installed)."""
    from importlib import metadata

    try:
        return metadata.version("podracer")
    except metadata.PackageNotFoundError:
        from podracer import __version__

        return __version__


class PodracerParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (subparsers inherit the class)."""

    def error(self, message: str) -> NoReturn:
        """Print ``<prog>: error: <message>`` and where help is, then exit 2."""
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


class DefaultsFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` to an option's help unless it already names its default
    or has nothing worth showing (``None``, a switch's ``False``)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if ("default" in text or default is None or default is False
                or default is argparse.SUPPRESS or not action.option_strings):
            return text
        return f"{text} (default: %(default)s)"


class _Deprecated(argparse.Action):
    """Stores into the new flag's ``dest`` and warns once that ``old`` is renamed."""

    def __init__(self, option_strings: Sequence[str], dest: str, new: str = "",
                 const: Any = None, nargs: Any = None, **kwargs: Any) -> None:
        self.new = new
        super().__init__(option_strings, dest, nargs=nargs, const=const, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        print(f"{parser.prog}: warning: {option_string} is renamed {self.new}; the old "
              "spelling goes in the next release", file=sys.stderr)
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)


def deprecated(parser: argparse.ArgumentParser, old: str, new: str) -> None:
    """Keep ``old`` as a hidden alias of the already added option ``new``."""
    target = next(a for a in parser._actions if new in a.option_strings)
    switch = target.nargs == 0
    extra: dict[str, Any] = {} if switch or target.type is None else {"type": target.type}
    parser.add_argument(old, action=_Deprecated, new=new, dest=target.dest,
                        nargs=0 if switch else None, const=target.const if switch else None,
                        help=argparse.SUPPRESS, **extra)


def subparsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """``parser`` and every subcommand parser below it."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                yield from subparsers(child)


def finish(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Give every subcommand the defaults formatter; return ``parser``."""
    for p in subparsers(parser):
        p.formatter_class = DefaultsFormatter
    return parser


def unreachable(args: argparse.Namespace, exc: Exception) -> str:
    """The one line for a broker that cannot be reached: which URL, that RabbitMQ must
    run there, how to check."""
    from broker.transports.base import redact

    url = getattr(args, "broker", None) or os.environ.get("PODRACER_BROKER") or "?"
    return (f"cannot reach RabbitMQ at {redact(url)} ({exc}): RabbitMQ must run there; "
            "check with `rabbitmq-diagnostics ping` on that host (or `docker compose ps`), "
            "or pass --broker (PODRACER_BROKER) with the right URL")

