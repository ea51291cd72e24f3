"""Export a policy for deployment: ONNX or TorchScript, run without Podracer.

``podracer export --format onnx|torchscript`` writes the best checkpoint, or a top-k
ensemble, as one self-contained graph ``obs float32[N, *obs_shape] -> action[N, ...]``.
The graph is traced from ``leaderboard.export.Policy`` itself, so it computes exactly
what the policy computes: each member's observation normalisation (PPO's running
mean/std, frozen at export), its network, the rescaling to the action space, and the
ensemble's average (clipped) or vote. The weights travel as parameters of the file.

* ONNX: ``onnxruntime.InferenceSession(path).run(None, {"obs": obs})[0]``; the batch
  dimension is dynamic. Needs the ``export`` extra (``pip install podracer[export]``).
* TorchScript: ``torch.jit.load(path)(obs)``; needs only torch.

Weak ensemble members: a top-k ensemble averages (or votes) its members equally, so a
member scoring far below the best pulls the ensemble down. ``leaderboard.answer.split_weak``
keeps the members within ``tolerance * max(|best|, 1)`` of the best; the others are left
out unless the user insists (``--keep-weak``).
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import torch
from torch import nn

from broker.core.errors import ConfigError
from leaderboard.answer import split_weak
from leaderboard.export import Policy
from leaderboard.store import Entry, short_id

log = logging.getLogger(__name__)

FORMATS = ("policy", "onnx", "torchscript")
"""``policy``: Podracer's own file (``leaderboard.export``); the others: this module."""
INPUT, OUTPUT = "obs", "action"
"""The names of the exported graph's input and output."""


class PolicyModule(nn.Module):
    """``Policy`` as an ``nn.Module`` whose parameters are its members' networks."""

    def __init__(self, policy: Policy) -> None:
        super().__init__()
        self.policy = policy
        # the agents' networks registered here, so tracing keeps their weights as
        # parameters (a traced function would have to bake them in as constants)
        self.nets = nn.ModuleList([m for agent in policy.agents for m in vars(agent).values()
                                   if isinstance(m, nn.Module)])
        self.nets.requires_grad_(False)
        self.eval()

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Actions of a batch ``obs[N, *obs_shape]``."""
        return self.policy(obs)


def example_batch(policy: Policy, n: int = 4) -> torch.Tensor:
    """``n`` observations from the policy's observation space (float32), for tracing."""
    space = policy.observation_space
    if not isinstance(space, gymnasium.spaces.Box):
        raise ConfigError("format", f"observation space {space} is not a Box",
                          "export agents of an env with Box observations")
    space.seed(0)
    return torch.as_tensor(np.stack([space.sample() for _ in range(n)]), dtype=torch.float32)


def _write(path: Path, save: Any) -> Path:
    """Call ``save(tmp)`` and rename ``tmp`` to ``path``: a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        save(tmp)
        os.replace(tmp, path)
    except OSError as exc:
        raise ConfigError("--out", f"cannot write {path}: {exc.strerror or exc}",
                          "choose a writable file path") from None
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _traced(policy: Policy, obs: torch.Tensor) -> torch.jit.ScriptModule:
    with warnings.catch_warnings():
        # the action bounds become constants of the graph: that is what we want
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.export cannot take
        # ``Policy`` as it is (Python objects around the networks); tracing can
        traced: torch.jit.ScriptModule = torch.jit.trace(PolicyModule(policy), obs,
                                                          check_trace=False)
    return traced


def export_torchscript(policy: Policy, path: str | Path) -> Path:
    """Write ``policy`` as a TorchScript file (``torch.jit.load(path)(obs)``)."""
    traced = _traced(policy, example_batch(policy))
    return _write(Path(path), lambda tmp: traced.save(str(tmp)))


def export_onnx(policy: Policy, path: str | Path) -> Path:
    """Write ``policy`` as an ONNX file (input ``obs``, output ``action``, batch dynamic)."""
    module = PolicyModule(policy)
    obs = example_batch(policy)

    def save(tmp: Path) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the exporter's deprecation and tracer notes
            # TorchScript-based exporter: needs no extra package and takes well under a
            # second (the dynamo one needs onnxscript and ~6 s for the same graph)
            torch.onnx.export(module, (obs,), str(tmp), dynamo=False, input_names=[INPUT],
                              output_names=[OUTPUT],
                              dynamic_axes={INPUT: {0: "batch"}, OUTPUT: {0: "batch"}})

    return _write(Path(path), save)


def max_difference(policy: Policy, path: Path, fmt: str, n: int = 256) -> float | None:
    """The largest absolute difference between the file's actions and the policy's on
    ``n`` observations of its space (None: onnxruntime is not installed to run it)."""
    obs = example_batch(policy, n)
    expected = policy(obs).cpu().numpy()
    if fmt == "onnx":
        try:
            import onnxruntime
        except ImportError:
            return None
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        got = session.run(None, {INPUT: obs.numpy()})[0]
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            got = torch.jit.load(str(path))(obs).numpy()
    return float(np.abs(np.asarray(got, dtype=np.float64) - expected).max())


def export_deployable(policy: Policy, path: str | Path, fmt: str) -> Path:
    """Write ``policy`` to ``path`` as ``fmt`` (``onnx`` or ``torchscript``)."""
    if fmt == "onnx":
        return export_onnx(policy, path)
    if fmt == "torchscript":
        return export_torchscript(policy, path)
    raise ConfigError("--format", f"unknown format {fmt!r}", f"use one of {', '.join(FORMATS)}")


def choose_members(entries: Sequence[Entry], *, keep_weak: bool) -> tuple[list[Entry], str]:
    """The members to export (best first) and one line saying what was done with weak
    ones (``""`` when there were none)."""
    kept, weak = split_weak(entries)
    if not weak:
        return list(entries), ""
    listed = ", ".join(f"{short_id(e.id)} ({e.score_mean:.1f})" for e in weak)
    if keep_weak:
        return list(entries), (f"warning: kept {len(weak)} member(s) far below the best "
                               f"{entries[0].score_mean:.1f}: {listed} (--keep-weak)")
    return kept, (f"left out {len(weak)} member(s) far below the best "
                  f"{entries[0].score_mean:.1f}: {listed}; exporting {len(kept)} "
                  "(--keep-weak exports them anyway)")
