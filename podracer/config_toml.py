"""``podracer train --print-config``: the complete effective experiment as TOML.

Every field of ``broker.core.experiment.Experiment`` is printed, walked generically with
``dataclasses.fields`` (a field added later prints without an edit here), each under its
docstring as a comment; a field that is ``None`` (TOML has no null) is a
comment saying so. The text reads back, through ``--experiment``, as an equal
``Experiment``: values come from ``Experiment.to_dict`` (the TOML shape that
``parse_experiment`` reads) where it has them, else from the field itself.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import itertools
import json
import math
import re
import sys
import textwrap
from collections.abc import Mapping
from typing import Any

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring, on one line (the string after its annotation), from
    ``cls`` and its bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            docs.update(_own_docs(klass))
    return docs


def _own_docs(cls: type) -> dict[str, str]:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return {}
    docs: dict[str, str] = {}
    body = tree.body[0].body if isinstance(tree.body[0], ast.ClassDef) else []
    for stmt, after in itertools.pairwise(body):
        if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            text = " ".join(after.value.value.split()).replace("``", "")
            docs[stmt.target.id] = text
    return docs


def plain(value: Any) -> Any:
    """``value`` as TOML-shaped data: dataclasses and mappings as tables (``None`` fields
    left out), tuples as arrays."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)
                if getattr(value, f.name) is not None}
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def _key(name: str) -> str:
    return name if _BARE_KEY.fullmatch(name) else json.dumps(name)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return ("nan" if math.isnan(value) else repr(value) if math.isfinite(value)
                else "inf" if value > 0 else "-inf")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {value!r} as TOML")


def _comment(text: str) -> list[str]:
    return [f"# {line}" for line in textwrap.wrap(text, 86)]


def _table(path: str, data: dict[str, Any], comment: str) -> list[str]:
    lines = ["", *_comment(comment), f"[{path}]"]
    lines += [f"{_key(k)} = {_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for k, v in data.items():
        if isinstance(v, dict):
            lines += _table(f"{path}.{_key(k)}", v, "")
    return lines


def experiment_toml(experiment: Any, notes: Mapping[str, str] | None = None) -> str:
    """The complete TOML of ``experiment`` (a ``broker.core.experiment.Experiment``);
    ``notes`` adds a comment line above a field's key."""
    docs, notes = field_docs(type(experiment)), notes or {}
    shaped = experiment.to_dict()
    head = ["# The complete experiment (podracer train --print-config): every default filled.",
            "# Run it: podracer train --experiment <this file>"]
    tables: list[str] = []
    for f in dataclasses.fields(experiment):
        raw = getattr(experiment, f.name)
        value = shaped[f.name] if f.name in shaped else plain(raw)
        comment = " ".join(filter(None, (docs.get(f.name), notes.get(f.name))))
        if raw is None:
            head += ["", *_comment(f"{f.name}: not set. {comment}")]
        elif isinstance(value, dict):
            tables += _table(_key(f.name), value, comment)
        else:
            head += ["", *_comment(comment), f"{_key(f.name)} = {_value(value)}"]
    return "\n".join(head + tables) + "\n"


def print_config(args: argparse.Namespace, experiment: Any) -> int:
    """``--print-config``: ``experiment`` as the complete TOML that ``--experiment`` reads
    back (``podracer.config_toml``), with where the defaults that depend on the run come
    from."""
    from broker.core.experiment import default_round_budget

    notes = {}
    if experiment.round_budget == default_round_budget(experiment.total_budget):
        notes["round_budget"] = ("Here derived from total_budget (its seconds / 15 within "
                                 "10..120 s, else 60 s): drop this table to keep it derived.")
    if not (args.experiment_file or args.experiment or args.budget):
        notes["total_budget"] = ("Default of a run from flags alone: 30 minutes (a file "
                                 "gives its own, or a target_score).")
    if not (args.algos or args.experiment_file or args.experiment):
        notes["algos"] = ("Default: ppo, sac and td3; train drops those that cannot act "
                          "in the env's action space.")
    sys.stdout.write(experiment_toml(experiment, notes))
    return 0
