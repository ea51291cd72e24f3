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
    "broker.core": (),
    "envs": ("broker.core",),
    "broker.transports": ("broker.core",),
    "agents": ("broker.core", "envs"),
    "broker.runtime": ("broker.core", "broker.transports"),
    "orchestrator": ("broker.core", "broker.transports", "broker.runtime"),
    "agents.pod": ("broker.core", "broker.transports", "broker.runtime", "envs", "agents"),
    "leaderboard": ("broker.core", "broker.transports", "broker.runtime", "envs", "agents"),
    "podracer": ("broker.core", "broker.transports", "broker.runtime", "envs", "agents",
                 "agents.pod", "leaderboard", "orchestrator"),
}
"""Package -> the packages it may import, bottom floor first. A package is a folder
(``agents/pod`` is ``agents.pod``); a module belongs to the longest one that holds it, so
``agents`` means the algorithms and ``agents.pod`` the pod service."""


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
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def package_of(module: str) -> str | None:
    """The package of ``ALLOWED`` that holds ``module`` (dotted), the longest match."""
    held = [p for p in ALLOWED if module == p or module.startswith(p + ".")]
    return max(held, key=len) if held else None


def check_layers(root: Path) -> list[Violation]:
    """Every import under ``root`` that crosses the floors of ``ALLOWED``."""
    violations = []
    tops = sorted({package.split(".")[0] for package in ALLOWED})
    for path in sorted(p for top in tops for p in (root / top).rglob("*.py")):
        relative = path.relative_to(root)
        package = package_of(".".join(relative.with_suffix("").parts))
        if package is None:
            continue
        for line, imported in _imports(path):
            target = package_of(imported)
            if target is not None and target != package and target not in ALLOWED[package]:
                violations.append(Violation(str(relative), line, imported))
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
