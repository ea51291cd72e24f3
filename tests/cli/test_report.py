"""``podracer report`` and ``write_report``: the tournament and throughput charts of a store."""

from __future__ import annotations

import argparse
import struct
import sys
from pathlib import Path

import pytest
import torch

from broker.core.errors import ConfigError
from broker.core.schemas import Checkpoint
from leaderboard.store import DB_NAME, Entry, LeaderboardStore
from podracer.cli import _add_common
from podracer.report import add_command, rounds, run_start, throughput_series, write_report

T0 = 1_700_000_000.0


def _put(store: LeaderboardStore, cid: str, algorithm: str, score: float, *, end: float,
         seconds: float, steps: int, parent: str | None = None, init: str | None = None,
         curve: list[tuple[float, float, int]] | None = None, pod: str = "pod-1") -> Entry:
    return store.insert(Checkpoint(
        id=cid, experiment="exp", init_id=init or cid, pod=pod, algorithm=algorithm,
        env="torch/Pendulum-v1", hparams={"lr": 1e-3}, state={"w": torch.zeros(2)},
        score_mean=score, score_std=1.0, env_steps=steps, wall_time=seconds,
        parent_id=parent, generation=0 if parent is None else 1, created=T0 + end,
        curve=curve or [])).entry


def _tournament(root: Path) -> None:
    """Two algorithms, a parent and its child, in-round curves (one of a single point)."""
    with LeaderboardStore(root) as store:
        _put(store, "a0", "ppo", -500.0, end=10, seconds=10, steps=1000,
             curve=[(5.0, -800.0, 500), (10.0, -500.0, 1000)])
        _put(store, "b0", "sac", -300.0, end=15, seconds=10, steps=2000, pod="pod-2",
             curve=[(10.0, -300.0, 2000)])
        _put(store, "a1", "ppo", -200.0, end=22, seconds=11, steps=1100, parent="a0",
             curve=[(4.0, -450.0, 400), (8.0, -260.0, 800), (11.0, -200.0, 1100)])


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{path} is no PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_write_report_draws_both_charts_and_returns_the_summary(tmp_path: Path) -> None:
    _tournament(tmp_path)
    summary = write_report(tmp_path, started_wall=T0 - 2.0, target=-250.0)
    assert (summary.checkpoints, summary.best_score, summary.best_id) == (3, -200.0, "a1")
    assert summary.charts == (tmp_path / "tournament.png", tmp_path / "throughput.png")
    for name in ("tournament.png", "throughput.png"):
        width, height = _png_size(tmp_path / name)
        assert 800 <= width <= 2000 and 400 <= height <= 1200, (name, width, height)
        assert (tmp_path / name).stat().st_size > 10_000  # something was drawn
    assert not (tmp_path / "learning_curve.png").exists()


def test_write_report_of_an_empty_store_draws_nothing(tmp_path: Path) -> None:
    summary = write_report(tmp_path, started_wall=T0)
    assert (summary.checkpoints, summary.best_score, summary.best_id) == (0, None, None)
    assert not list(tmp_path.glob("*.png"))


def test_throughput_sums_the_rounds_running_at_once(tmp_path: Path) -> None:
    # round A: [100, 110] s, 1000 steps (100/s); round B: [105, 115] s, 2000 steps (200/s)
    with LeaderboardStore(tmp_path) as store:
        entries = [_put(store, "A", "ppo", 0.0, end=110, seconds=10, steps=1000),
                   _put(store, "B", "sac", 0.0, end=115, seconds=10, steps=2000)]
    start = T0 + 100
    assert run_start(entries) == pytest.approx(start)
    times, rates, pods = throughput_series(entries, start, points=3)
    assert times == pytest.approx([2.5, 7.5, 12.5])
    assert rates == pytest.approx([100.0, 300.0, 200.0])
    assert pods == pytest.approx([1.0, 2.0, 1.0])
    # a cell is the mean over it: [100, 107.5) holds 750 + 500 steps, [107.5, 115) 250 + 1500
    times, rates, pods = throughput_series(entries, start, points=2)
    assert rates == pytest.approx([1250 / 7.5, 1750 / 7.5])
    assert pods == pytest.approx([4 / 3, 4 / 3])
    # cells after the last round are empty
    assert throughput_series(entries, start, points=4, end=start + 20)[1][-1] == 0.0


def test_a_round_with_an_intermediate_best_counts_once(tmp_path: Path) -> None:
    # round B as an intermediate best (4 s, 1000 steps) continued by its own checkpoint
    # (6 s, 1000 steps): one round of [105, 115], 200 steps/s throughout, one pod
    with LeaderboardStore(tmp_path) as store:
        entries = [_put(store, "A", "ppo", 0.0, end=110, seconds=10, steps=1000),
                   _put(store, "B.1", "sac", 0.0, end=109, seconds=4, steps=1000, init="B"),
                   _put(store, "B", "sac", 1.0, end=115, seconds=6, steps=1000, parent="B.1",
                        curve=[(10.0, 1.0, 2000)])]
    found = rounds(entries)
    assert [(r.init_id, r.start - T0, r.end - T0, r.env_steps) for r in found] == [
        ("A", 100.0, 110.0, 1000), ("B", 105.0, 115.0, 2000)]
    assert found[1].curve == [(10.0, 1.0, 2000)]
    _, rates, pods = throughput_series(entries, T0 + 100, points=3)
    assert rates == pytest.approx([100.0, 300.0, 200.0])
    assert pods == pytest.approx([1.0, 2.0, 1.0])


def _run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="podracer")
    add_command(parser.add_subparsers(dest="command", required=True), _add_common)
    args = parser.parse_args(["report", *argv])
    code: int = args.func(args)
    return code


def test_report_command_redraws_a_store_and_prints_a_summary(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _tournament(tmp_path / "run")
    assert _run("--store", str(tmp_path / "run"), "--target", "-250",
                "--chart-dir", str(tmp_path / "charts")) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == [str(tmp_path / "charts" / "tournament.png"),
                         str(tmp_path / "charts" / "throughput.png")]
    assert lines[2].startswith("3 checkpoints from 3 rounds over 22s; best -200.0 (ppo a1)")
    for name in ("tournament.png", "throughput.png"):
        assert _png_size(tmp_path / "charts" / name)[0] >= 800
    assert not list((tmp_path / "run").glob("*.png"))  # --out, not the store's directory


def test_report_command_on_a_missing_store_names_store(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        _run("--store", str(tmp_path / "nowhere"))
    assert caught.value.field == "--store" and "--store" in str(caught.value)
    assert not (tmp_path / "nowhere" / DB_NAME).exists()  # read-only: nothing created


def test_without_matplotlib_the_run_ends_well_and_says_how_to_get_the_charts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _tournament(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an import finds uninstalled
    summary = write_report(tmp_path, started_wall=T0 - 2.0)
    assert (summary.checkpoints, summary.best_id, summary.charts) == (3, "a1", ())
    assert not (tmp_path / "tournament.png").exists()
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and "pip install 'podracer[viz]'" in lines[0], lines
    assert f"podracer report --store {tmp_path}" in lines[0]
