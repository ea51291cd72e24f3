"""Every command in the docs runs: the site builds strictly, the hello world reaches its
target, the commands of the docs' shell blocks parse, and the cheap ones run against a
store made by a short embedded ``podracer train``.

Nothing here skips: mkdocs and mkdocstrings come with the ``docs`` extra (in ``dev``,
which CI installs); without them the build test fails.
"""

from __future__ import annotations

import contextlib
import html
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.required import skip_or_fail

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
# a command of the docs must not pick up a broker, store or experiment from the caller
ENV = {k: v for k, v in os.environ.items()
       if k not in ("PODRACER_BROKER", "PODRACER_STORE", "PODRACER_EXPERIMENT_FILE",
                    "PODRACER_DEVICE")}


def run_podracer(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """``podracer ARGS`` as the docs write it (the console script next to this Python,
    else ``python -m podracer``), from the repository root."""
    script = Path(sys.executable).with_name("podracer")
    argv = [str(script)] if script.is_file() else [sys.executable, "-m", "podracer"]
    return subprocess.run([*argv, *args], cwd=REPO, env=ENV, capture_output=True, text=True,
                          timeout=timeout)


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, (f"{shlex.join(map(str, proc.args))} exited "
                                  f"{proc.returncode}\n{proc.stdout[-3000:]}\n"
                                  f"{proc.stderr[-3000:]}")
    return proc.stdout


@pytest.mark.timeout(120)
def test_docs_build_strictly(tmp_path: Path) -> None:
    import mkdocs  # noqa: F401  (installed with the docs extra; missing is a failure)
    import mkdocstrings  # noqa: F401

    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "--site-dir", str(site)], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    # the hello world page includes the example itself, the API pages the docstrings
    assert "TaskScaler(run_pod, lambda name" in page_text(site / "hello_world" / "index.html")
    assert "Who trains next" in page_text(site / "api" / "leaderboard" / "index.html")


def page_text(path: Path) -> str:
    """The text of an HTML page (tags dropped, entities decoded)."""
    return html.unescape(re.sub(r"<[^>]+>", "", path.read_text()))


def doc_commands() -> Iterator[tuple[str, str]]:
    """(page, command) for every ``podracer ...`` command in the docs' bash blocks."""
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text()
        for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
            for line in block.splitlines():
                line = re.sub(r"\s#\s.*$", "", line).strip().rstrip("&").strip()
                for part in line.split("&&"):
                    # a redirection is the shell's, not an argument of the command
                    part = re.sub(r"\s[12]?>>?\s*\S+", "", part).strip()
                    if part.startswith("podracer "):
                        yield str(page.relative_to(DOCS)), part


def test_every_documented_command_parses() -> None:
    from podracer.cli import build_parser

    found = list(doc_commands())
    assert len(found) >= 20, found  # the extraction keeps finding the commands
    bad = []
    for page, command in found:
        warned = io.StringIO()
        try:
            with contextlib.redirect_stderr(warned):
                build_parser().parse_args(shlex.split(command)[1:])
        except SystemExit as exc:
            bad.append(f"{page}: {command} (exit {exc.code})")
        if "is renamed" in warned.getvalue():  # an old spelling (podracer.renames)
            bad.append(f"{page}: {command} ({warned.getvalue().strip()})")
    assert not bad, "\n".join(bad)


@pytest.mark.timeout(150)
def test_hello_world_reaches_its_target(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "hello_world.py"),
                           str(tmp_path / "hello")], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=140)
    out = ok(proc)
    assert "exit codes (updater, generator, orchestrator): [0, 0, 0]" in out
    assert "target -400.0 reached" in out
    assert re.search(r"^1\. (ppo|sac)", out, flags=re.M), out


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory made by a short embedded ``podracer train``."""
    out = tmp_path_factory.mktemp("docs") / "run"
    ok(run_podracer("train", "--env", "torch/Pendulum-v1", "--target-score", "-1000",
                "--budget", "30s", "--run-dir", str(out), "--quiet", timeout=150))
    assert (out / "leaderboard.sqlite").is_file()
    return out


@pytest.fixture(scope="module")
def policy(store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The best policy of ``store``, exported as the docs do (once for the tests that read it)."""
    path = tmp_path_factory.mktemp("policy") / "policy.podracer"
    ok(run_podracer("export", "--store", str(store), "--top", "1", "--out", str(path)))
    return path


@pytest.mark.timeout(300)
def test_inspection_commands_run(store: Path, policy: Path) -> None:
    board = ok(run_podracer("leaderboard", "--store", str(store)))
    assert re.search(r"top [1-9]\d* of", board), board
    best = re.search(r"^1\s+(\w+)", board, flags=re.M)
    assert best, board
    assert "lineage of" in ok(run_podracer("leaderboard", "--store", str(store),
                                       "--lineage", best.group(1)[:6]))

    report = ok(run_podracer("report", "--store", str(store)))
    assert "tournament.png" in report and "throughput.png" in report
    assert (store / "tournament.png").stat().st_size > 0

    assert policy.stat().st_size > 0  # ``podracer export``
    scored = ok(run_podracer("evaluate", str(policy), "--episodes", "4"))
    assert "torch/Pendulum-v1:" in scored and "over 4 episodes" in scored

    layers = ok(run_podracer("layers"))
    assert "0 import(s) across the floors" in layers


def test_load_policy_as_documented(policy: Path) -> None:
    import torch

    import podracer as package

    loaded = package.load_policy(policy)
    actions = loaded(torch.zeros(4, 3))
    assert actions.shape == (4, 1)


@pytest.mark.timeout(300)
def test_stock_commands_run(tmp_path: Path) -> None:
    """docs/tutorials/stock.md and the README's stock section, with a 20 s training."""
    prices = REPO.parent / "shared" / "data" / "sp500_20_adjclose_daily.csv.gz"
    if not prices.is_file():  # where examples/stock_sp20.toml reads them
        skip_or_fail(f"examples/stock_sp20.toml reads {prices}, which is missing",
                     "PODRACER_REQUIRE_STOCK_DATA")
    run = tmp_path / "stock_sp20"
    trained = ok(run_podracer("train", "examples/stock_sp20.toml", "--budget", "20s",
                              "--round-budget", "10s", "--run-dir", str(run), "--quiet",
                              timeout=200))
    assert ("validation=2014-01-01..2014-12-31,2015-01-01..2015-12-31,2018-05-13..2019-05-12"
            in trained)  # three validation years by default
    top3 = ok(run_podracer("backtest", "--store", str(run), "--top", "3"))
    assert "2019-05-13 .. 2021-05-26 (515 trading days, 20 stocks)" in top3
    assert "buy-and-hold (equal weight)" in top3 and (run / "backtest.png").is_file()
    snapshots = ok(run_podracer("backtest", "--store", str(run), "--snapshots"))
    assert "snapshots" in snapshots and (run / "snapshots.png").is_file()
    policy = tmp_path / "stock.podracer"
    ok(run_podracer("export", "--store", str(run), "--top", "3", "--out", str(policy)))
    # a policy file does not open the CSV it names: --csv is the operator's
    assert "rebalanced daily" in ok(run_podracer("backtest", str(policy), "--csv", str(prices)))
    year = ok(run_podracer("backtest", str(policy), "--csv", str(prices), "--start",
                           "2020-01-01", "--end", "2020-12-31", "--capital", "100000",
                           "--cost", "0.001"))
    assert "capital 100,000, cost 0.1%" in year and "WARNING" not in year


@pytest.mark.timeout(200)
def test_custom_env_commands_run(tmp_path: Path) -> None:
    """docs/tutorials/custom_env.md: the example env trains, named ``gym/<module>:<id>``
    with its ``[env_kwargs]``, in reproducible mode, from the repository root."""
    page = (DOCS / "tutorials" / "custom_env.md").read_text()
    command = "podracer train examples/corridor.toml --budget 8k"
    assert "export PYTHONPATH=examples\n" + command in page
    run = tmp_path / "corridor"
    script = Path(sys.executable).with_name("podracer")
    argv = [str(script)] if script.is_file() else [sys.executable, "-m", "podracer"]
    proc = subprocess.run([*argv, *shlex.split(command)[1:], "--run-dir", str(run), "--quiet"],
                          cwd=REPO, env={**ENV, "PYTHONPATH": os.pathsep.join(
                              ["examples", *filter(None, [ENV.get("PYTHONPATH")])])},
                          capture_output=True, text=True, timeout=180)
    trained = ok(proc)
    assert "training ppo on gym/corridor_env:Corridor-v0 with 1 pod" in trained, trained
    assert re.search(r"done after .*: [1-9]\d* checkpoints?, best -?\d", trained), trained
    recorded = json.loads((run / "experiment.json").read_text())
    assert recorded["env_kwargs"] == {"length": 4.0, "speed": 0.5}
    assert recorded["reproducible"] is True


@pytest.mark.timeout(200)
def test_lifecycle_commands_run(store: Path, tmp_path: Path) -> None:
    """``ls``, the refusal to mix two runs, ``--resume`` of a finished run and
    ``clean --delete-run`` (docs/tutorials/lifecycle.md; the broker side runs in
    tests/lifecycle)."""
    listed = ok(run_podracer("ls", "--runs", str(store.parent)))
    row = re.search(r"^(\S+)\s+finished\s+torch/Pendulum-v1\s", listed, flags=re.M)
    assert row, listed
    again = run_podracer("train", "--env", "torch/Pendulum-v1", "--budget", "30s",
                         "--run-dir", str(store), "--quiet")
    assert again.returncode == 2, again.stdout + again.stderr
    assert "--resume" in again.stderr and "--fresh" in again.stderr
    assert "finished already" in ok(run_podracer("train", "--resume", str(store), "--quiet"))
    runs = tmp_path / "runs"
    shutil.copytree(store, runs / row.group(1))
    ok(run_podracer("clean", row.group(1), "--delete-run", "--yes", "--runs", str(runs)))
    assert not (runs / row.group(1)).exists()
