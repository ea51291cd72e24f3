"""``podracer layers``: the project's floors, and every import that breaks them.

Each package may import only from the packages listed for it in ``ALLOWED`` (the floors
below it); a module-level or function-level import of any other project package is a
violation. The check reads the source (``ast``), it imports nothing.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

ALLOWED: Mapping[str, tuple[str, ...]] = {
    "broker": (),
    "envs": ("broker",),
    "agents": ("broker", "envs"),
    "orchestrator": ("broker",),
    "leaderboard": ("broker", "envs", "agents"),
    "podracer": ("broker", "envs", "agents", "leaderboard", "orchestrator"),
}
"""Package -> the packages it may import, bottom floor first."""


@dataclasses.dataclass(frozen=True)
class Violation:
    """``module`` (a file) imports ``imported``, which its package may not."""

    module: str
    line: int
    imported: str

    def __str__(self) -> str:
        return f"{self.module}:{self.line}: imports {self.imported}"


def _imports(path: Path) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def check_layers(root: Path) -> list[Violation]:
    """Every import under ``root`` that crosses the floors of ``ALLOWED``."""
    violations = []
    for package, allowed in ALLOWED.items():
        for path in sorted((root / package).rglob("*.py")):
            for line, module in _imports(path):
                top = module.split(".")[0]
                if top in ALLOWED and top != package and top not in allowed:
                    violations.append(Violation(str(path.relative_to(root)), line, module))
    return violations


def floors() -> list[list[str]]:
    """``ALLOWED`` as floors, bottom up: a package sits one floor above its highest need."""
    level: dict[str, int] = {}
    for package in ALLOWED:  # listed bottom up, so every need is placed already
        level[package] = 1 + max((level[p] for p in ALLOWED[package]), default=-1)
    out: list[list[str]] = [[] for _ in range(max(level.values()) + 1)]
    for package, n in level.items():
        out[n].append(package)
    return out


def cmd_layers(args: argparse.Namespace) -> int:
    """Print the floors and the imports that break them; exit 1 if there are any."""
    for n, packages in reversed(list(enumerate(floors()))):
        print(f"floor {n}: {', '.join(packages)}")
    violations = check_layers(Path(args.root))
    for violation in violations:
        print(f"upward import: {violation}")
    print(f"{len(violations)} import(s) across the floors")
    return 1 if violations else 0


def add_command(sub: Any, add_common: Callable[[argparse.ArgumentParser], None]) -> None:
    """Register ``layers`` on ``sub``."""
    p = sub.add_parser("layers", help="the package floors and any import that breaks them")
    p.add_argument("--root", default=".", help="repository root (default .)")
    add_common(p)
    p.set_defaults(func=cmd_layers)
