"""The ``podracer`` parser (issue 23): one-line errors, every default in ``--help``,
``--version``, renamed flags with their old spelling kept one release, and a broker that
cannot be reached named in one line."""

from __future__ import annotations

import argparse
import re
import socket
from typing import Any

import pytest

from podracer import renames
from podracer.cli import build_parser, main
from podracer.cli_parser import subparsers, version

pytestmark = pytest.mark.timeout(60)


def test_version_prints_the_installed_version(capsys: Any) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.strip() == f"podracer {version()}"
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", version())


@pytest.mark.parametrize("argv", [["train", "--pods", "x"], ["leaderboard", "--nope"],
                                  ["serve", "baker"], ["nope"]])
def test_a_bad_argument_is_one_line_with_a_hint_and_exit_2(argv: list[str], capsys: Any) -> None:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert len(err.strip().splitlines()) == 1, err  # no usage block
    assert re.match(r"podracer( \S+)?: error: .+ \(see `podracer( \S+)? --help`\)$", err.strip())


def _options() -> list[tuple[str, argparse.Action]]:
    return [(p.prog, a) for p in subparsers(build_parser()) for a in p._actions
            if a.option_strings and a.help != argparse.SUPPRESS and a.nargs != 0]


def test_help_shows_every_options_default() -> None:
    """An option with a value either has a default argparse prints, or its help says
    what it defaults to (or that it is required)."""
    missing = []
    for prog, action in _options():
        formatter = build_parser().formatter_class(prog)
        text = formatter._get_help_string(action) % {"default": action.default}  # type: ignore[attr-defined]
        if "default" not in text and "required" not in text:
            missing.append(f"{prog} {action.option_strings[0]}")
    assert not missing, missing


def test_train_help_shows_defaults_and_seed_has_help(capsys: Any) -> None:
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag in ("--pods", "--budget", "--round-budget", "--threads", "--algos", "--seed"):
        assert re.search(re.escape(flag) + r" \S+ [^-]*default", text), flag
    assert "without a file 30m" in text


def _alias_argv(command: str, old: str, tmp: str) -> list[str]:
    return {"train": ["train", old, tmp, "--print-config"],
            "serve": ["serve", "pod", old, "x", "--dry-run"],
            "clean": ["clean", "x", old, "--yes", "--runs", tmp],
            "leaderboard": ["leaderboard", old, "3", "--store", tmp],
            "status": ["status", old, "3", "--broker", "memory://"],
            "report": ["report", old, tmp, "--store", tmp],
            }.get(command, [*command.split(), old, "x"])


@pytest.mark.parametrize(("command", "old", "new"),
                         [(c, o, n) for c, pairs in renames.RENAMES.items() for o, n in pairs])
def test_an_old_flag_still_parses_warns_once_and_names_the_new_one(
        command: str, old: str, new: str, tmp_path: Any, capsys: Any) -> None:
    parser = build_parser()
    argv = _alias_argv(command, old, str(tmp_path))
    args = parser.parse_args(argv)
    err = capsys.readouterr().err
    assert err.count("warning") == 1 and f"{old} is renamed {new}" in err, err
    dest = next(a.dest for p in subparsers(parser) for a in p._actions
                if new in a.option_strings and p.prog.endswith(command))
    assert getattr(args, dest) not in (None, False)
    with pytest.raises(SystemExit):  # hidden from --help
        parser.parse_args([*command.split(), "--help"])
    assert old not in re.findall(r"(?<![\w-])-[-\w]+", capsys.readouterr().out)


def test_the_renamed_flags_mean_one_thing(capsys: Any) -> None:
    """The audit of issue 23 as a check: ``--out`` is a file, ``--store`` a directory,
    ``--name`` an experiment's name, ``--experiment`` a file, ``-k`` gone."""
    for prog, action in _options():
        flags, text = action.option_strings, (action.help or "").lower()
        if "--name" in flags:
            assert "experiment name" in text, prog
        if "--experiment" in flags:
            assert "file" in text, prog
        if "--out" in flags:
            assert "file" in text or "png" in text, prog
        assert "-k" not in flags, prog
    parser = build_parser()
    clean = next(p for p in subparsers(parser) if p.prog == "podracer clean")
    assert all("--store" not in a.option_strings or a.help == argparse.SUPPRESS
               for a in clean._actions)


def test_a_bare_name_in_experiment_warns_and_still_works(tmp_path: Any, capsys: Any) -> None:
    assert main(["leaderboard", "--experiment", "some-exp"]) == 2  # no store: exit 2 ...
    err = capsys.readouterr().err
    assert "now --name some-exp" in err  # ... after the warning
    assert "runs/some-exp" in err


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when the block ends: refused


def test_a_refused_broker_is_one_line_naming_url_and_check(capsys: Any) -> None:
    url = f"amqp://guest:guest@127.0.0.1:{_closed_port()}/"
    assert main(["status", "--broker", url, "--name", "nobody", "--listen", "0"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "cannot reach RabbitMQ at amqp://guest:***@127.0.0.1:" in err
    assert "RabbitMQ must run there" in err and "rabbitmq-diagnostics ping" in err
