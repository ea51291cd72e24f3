"""The package floors hold: no package imports one above it."""

from __future__ import annotations

from pathlib import Path

from podracer.layers import ALLOWED, check_layers, floors

ROOT = Path(__file__).resolve().parents[2]


def test_no_import_crosses_the_floors() -> None:
    assert [str(v) for v in check_layers(ROOT)] == []


def test_floors_put_the_services_above_what_they_share(tmp_path: Path) -> None:
    levels = {p: n for n, packages in enumerate(floors()) for p in packages}
    assert levels["broker"] == 0 and levels["podracer"] == max(levels.values())
    assert levels["agents"] < levels["leaderboard"]
    # a planted upward import is found, with its file and line
    for package in ALLOWED:
        (tmp_path / package).mkdir()
    (tmp_path / "broker" / "bad.py").write_text("import os\nfrom podracer.cli import main\n")
    assert [str(v) for v in check_layers(tmp_path)] == ["broker/bad.py:2: imports podracer.cli"]
