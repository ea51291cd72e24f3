"""``podracer export --format onnx|torchscript``: the files act like the policy, run
without Podracer (onnxruntime; torch alone in a fresh interpreter), and weak ensemble
members are left out with a line saying so."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime
import pytest
import torch

from agents.build import build_agent, resolve_config
from agents.registry import default_registry
from envs.registry import make_env
from leaderboard.deploy import export_onnx, export_torchscript
from leaderboard.export import Policy, PolicyMember, policy_from_store
from leaderboard.store import LeaderboardStore
from podracer.cli import main
from tests.cli.cli_store import ROWS, module_store

pytestmark = pytest.mark.timeout(120)
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def store_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return module_store(tmp_path_factory)


def _obs(n: int = 64) -> np.ndarray:
    rng = np.random.default_rng(0)
    angle = rng.uniform(-np.pi, np.pi, n)
    return np.stack([np.cos(angle), np.sin(angle), rng.normal(0, 4, n)], 1).astype(np.float32)


def _policy(root: Path, top: int) -> Policy:
    with LeaderboardStore(root) as store:
        return policy_from_store(store, [e.id for e in store.top(top)])


def _run_onnx(path: Path, obs: np.ndarray) -> np.ndarray:
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    result: np.ndarray = session.run(None, {"obs": obs})[0]
    return result


@pytest.mark.parametrize("top", [1, 2])
def test_onnx_acts_like_the_policy(store_root: Path, tmp_path: Path, capsys: Any,
                                   top: int) -> None:
    out = tmp_path / "policy.onnx"
    assert main(["export", "--store", str(store_root), "--top", str(top), "--format", "onnx",
                 "--out", str(out)]) == 0
    assert f"exported {top} member(s) to {out} (onnx)" in capsys.readouterr().out
    obs = _obs()
    expected = _policy(store_root, top)(torch.from_numpy(obs)).numpy()
    got = _run_onnx(out, obs)
    diff = float(np.abs(got - expected).max())
    print(f"onnx top {top}: max abs difference {diff:.3g} over {len(obs)} observations")
    assert got.shape == expected.shape == (64, 1) and diff < TOLERANCE
    assert float(np.abs(expected).max()) > 0  # the comparison is not of two zero tensors


# The TorchScript file is run by an interpreter that cannot import Podracer: -I ignores
# PYTHONPATH and the user site, -S skips site-packages' .pth files (the editable install),
# and only the directories of torch and numpy are put on sys.path.
_RUNNER = textwrap.dedent("""
    import importlib.util, sys
    sys.path[:0] = sys.argv[1].split("|")
    assert importlib.util.find_spec("podracer") is None, "podracer is importable"
    assert importlib.util.find_spec("leaderboard") is None, "leaderboard is importable"
    import numpy, torch
    torch.set_num_threads(1)
    module = torch.jit.load(sys.argv[2])
    obs = torch.from_numpy(numpy.load(sys.argv[3]))
    numpy.save(sys.argv[4], module(obs).numpy())
""")


def _site_dirs() -> str:
    dirs = {str(Path(m.__file__).resolve().parent.parent) for m in (torch, np)}
    return "|".join(sorted(dirs))


@pytest.mark.parametrize("top", [1, 2])
def test_torchscript_runs_without_podracer(store_root: Path, tmp_path: Path, capsys: Any,
                                           top: int) -> None:
    out = tmp_path / "policy.pt"
    assert main(["export", "--store", str(store_root), "--top", str(top), "--format",
                 "torchscript", "--out", str(out)]) == 0
    assert f"({'torchscript'})" in capsys.readouterr().out
    obs = _obs()
    np.save(tmp_path / "obs.npy", obs)
    work = tmp_path / "elsewhere"
    work.mkdir()
    done = subprocess.run([sys.executable, "-I", "-S", "-c", _RUNNER, _site_dirs(), str(out),
                           str(tmp_path / "obs.npy"), str(tmp_path / "act.npy")],
                          cwd=work, capture_output=True, text=True, timeout=100,
                          env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    got = np.load(tmp_path / "act.npy")
    expected = _policy(store_root, top)(torch.from_numpy(obs)).numpy()
    diff = float(np.abs(got - expected).max())
    print(f"torchscript top {top}: max abs difference {diff:.3g} over {len(obs)} observations")
    assert got.shape == expected.shape and diff < TOLERANCE


def test_discrete_vote_exports_to_both(tmp_path: Path) -> None:
    registry = default_registry()
    hparams = {"num_envs": 4, "rollout_steps": 16, "hidden_size": 16}
    env = make_env("torch/CartPole-v1", resolve_config(registry, "ppo", hparams).num_envs)
    try:
        agents = [build_agent(registry, "ppo", hparams, env, torch.device("cpu"), seed)
                  for seed in (1, 2, 3)]
        for agent in agents:
            agent.train_iteration(env)  # normaliser statistics that are not the identity
        policy = Policy("torch/CartPole-v1",
                        [PolicyMember(f"m{i}", "ppo", hparams, 0.0) for i in range(3)], agents,
                        env.single_action_space, torch.device("cpu"),
                        env.single_observation_space)
    finally:
        env.close()
    obs = torch.randn(256, 4) * torch.tensor([1.0, 2.0, 0.2, 2.0])
    expected = policy(obs).numpy()
    onnx_actions = _run_onnx(export_onnx(policy, tmp_path / "p.onnx"), obs.numpy())
    script = torch.jit.load(str(export_torchscript(policy, tmp_path / "p.pt")))
    assert np.array_equal(onnx_actions, expected)
    assert np.array_equal(script(obs).numpy(), expected)
    assert len(set(expected.tolist())) == 2  # both actions occur: the vote is exercised


def test_top_k_leaves_out_weak_members_and_says_so(store_root: Path, tmp_path: Path,
                                                   capsys: Any) -> None:
    # ROWS score -100, -150, -200, -300: -200 and -300 are more than half of |best| below
    out = tmp_path / "top4.policy"
    assert main(["export", "--store", str(store_root), "--top", "4", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "left out 2 member(s) far below the best -100.0" in text
    assert f"{ROWS[0].id[:12]} (-200.0)" in text and f"{ROWS[2].id[:12]} (-300.0)" in text
    assert "exported 2 member(s)" in text
    assert main(["export", "--store", str(store_root), "--top", "4", "--out", str(out),
                 "--keep-weak"]) == 0
    text = capsys.readouterr().out
    assert "warning: kept 2 member(s) far below the best" in text
    assert "exported 4 member(s)" in text
