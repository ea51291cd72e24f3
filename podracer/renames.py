"""Flags renamed so that one spelling means one thing across ``podracer`` commands.

Each old spelling keeps working for one release, hidden from ``--help``, and prints one
warning line naming the new flag (``podracer.cli_parser.deprecated``):

===============  ==================  =========================================================
command          old -> new          why
===============  ==================  =========================================================
train            --out -> --run-dir  ``--out`` is a file to write elsewhere (export, backtest)
serve            --name -> --instance  ``--name`` is the experiment's name (train, users)
clean            --store -> --delete-run  ``--store`` is a run directory path elsewhere
leaderboard      -k -> --rows        ``--top K`` is an ensemble of the K best (export)
status           -k -> --rows        as leaderboard
report           --out -> --chart-dir  ``--out`` is a file to write elsewhere
users *          --experiment -> --name  ``--experiment`` is an experiment file elsewhere
leaderboard,     --experiment NAME   a bare name still works with a warning (``podracer
status, export,  -> --name NAME      .inspect_cli.experiment_name``); the file stays
evaluate                             ``--experiment``
===============  ==================  =========================================================
"""

from __future__ import annotations

from typing import Any

from podracer.cli_parser import deprecated

RENAMES: dict[str, tuple[tuple[str, str], ...]] = {
    "train": (("--out", "--run-dir"),),
    "serve": (("--name", "--instance"),),
    "clean": (("--store", "--delete-run"),),
    "leaderboard": (("-k", "--rows"),),
    "status": (("-k", "--rows"),),
    "report": (("--out", "--chart-dir"),),
    "users env": (("--experiment", "--name"),),
    "users setup": (("--experiment", "--name"),),
    "users remove": (("--experiment", "--name"),),
}
"""Subcommand -> (old spelling, new spelling) pairs."""


def add_aliases(sub: Any) -> None:
    """Add the old spellings of ``RENAMES`` to the subcommand parsers of ``sub``."""
    for command, pairs in RENAMES.items():
        parser = sub.choices[command.split()[0]]
        for word in command.split()[1:]:
            parser = next(a for a in parser._actions if hasattr(a, "choices")
                          and isinstance(a.choices, dict)).choices[word]
        for old, new in pairs:
            deprecated(parser, old, new)
