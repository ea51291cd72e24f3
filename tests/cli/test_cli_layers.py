"""The package floors hold: no package imports one above it."""

from __future__ import annotations

from pathlib import Path

from podracer.layers import ALLOWED, check_layers, floors

ROOT = Path(__file__).resolve().parents[2]


def test_no_import_crosses_the_floors() -> None:
    assert [str(v) for v in check_layers(ROOT)] == []


def test_floors_put_the_services_above_what_they_share(tmp_path: Path) -> None:
    levels = {p: n for n, packages in enumerate(floors()) for p in packages}
    assert levels["broker.core"] == 0 and levels["podracer"] == max(levels.values())
    assert levels["agents"] < levels["agents.pod"] and levels["agents"] < levels["leaderboard"]
    assert levels["broker.transports"] < levels["broker.runtime"]
    # a planted upward import is found, with its file and line
    for package in ALLOWED:
        (tmp_path / package.replace(".", "/")).mkdir(parents=True, exist_ok=True)
    (tmp_path / "broker" / "core" / "bad.py").write_text(
        "import os\nfrom podracer.cli import main\n")
    # an algorithm may not reach the pod service or a transport
    (tmp_path / "agents" / "sac.py").write_text("from agents.pod.runner import run\n"
                                                "from broker.transports import amqp\n")
    assert [str(v) for v in check_layers(tmp_path)] == [
        "agents/sac.py:1: imports agents.pod.runner.run",
        "agents/sac.py:2: imports broker.transports.amqp",
        "broker/core/bad.py:2: imports podracer.cli.main"]
