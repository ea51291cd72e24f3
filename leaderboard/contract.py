"""The checkpoint contract: the tensors a state of one algorithm and config must hold.

The updater checks every checkpoint's names, shapes and dtypes against the state of a
fresh agent built on the experiment's recorded spaces (``broker.core.spaces``): no env,
so no simulator, and one agent per shape-relevant config, not per checkpoint. A fresh
agent's ``state_dict`` has a trained one's names, shapes and dtypes (its optimizer
moments exist from the start), except data kept as rows, whose leading dimension is a
row count: ``replay.*`` (with ``checkpoint_replay``, at most ``buffer_size`` rows) and
``hterm.*`` (the H-term's memory, at most ``agents.hterm.MEMORY_ROWS``); their rows
are checked for count and layout, the tensors of one group having as many rows each.

Search-space fields (learning rates, coefficients) never change a tensor's shape, so
the cache leaves them out and a mutated child finds its parent's spec.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import torch

from agents.base import AlgorithmRegistry
from agents.build import Resolved
from agents.hterm import MEMORY_ROWS
from broker.core.errors import ConfigError
from broker.core.spaces import Spaces
from envs.spaces import gym_space

log = logging.getLogger(__name__)

TensorSpec = dict[str, tuple[tuple[int, ...], torch.dtype]]
ROW_GROUPS = ("replay.", "hterm.")
"""Prefixes of tensors whose first dimension counts rows of data."""


def _rows_cap(group: str, config: Any) -> int:
    if group == "replay.":
        return int(getattr(config, "buffer_size", 0))
    return MEMORY_ROWS


def _group(name: str) -> str | None:
    return next((g for g in ROW_GROUPS if name.startswith(g)), None)


def spec_of(state: Mapping[str, torch.Tensor]) -> TensorSpec:
    """Names, shapes and dtypes of ``state``."""
    return {k: (tuple(v.shape), v.dtype) for k, v in state.items()}


class StateContract:
    """What a checkpoint's state must hold, per algorithm and config (cached)."""

    def __init__(self, registry: AlgorithmRegistry, spaces: Spaces) -> None:
        self.registry = registry
        self.spaces = spaces
        self._specs: dict[tuple[str, str], TensorSpec] = {}
        self._data: dict[tuple[str, str], TensorSpec] = {}
        self.agents_built = 0
        """Agents built to derive specs (one per shape-relevant config)."""

    def _key(self, resolved: Resolved) -> tuple[str, str]:
        space = getattr(resolved.spec.config_cls, "SEARCH_SPACE", {})
        fields = sorted((f.name, getattr(resolved.config, f.name))
                        for f in dataclasses.fields(resolved.config)
                        if f.name not in space and f.name != "num_envs")
        return resolved.algorithm, repr(fields)

    def agent(self, resolved: Resolved, state: Mapping[str, torch.Tensor] | None = None
              ) -> Any:
        """An agent of ``resolved`` on the recorded spaces and one env copy (tensor shapes
        never depend on ``num_envs``), ``state`` loaded when given."""
        self.agents_built += 1
        return resolved.build(gym_space(self.spaces.observation), gym_space(self.spaces.action),
                              torch.device("cpu"), 0, state,
                              config=dataclasses.replace(resolved.config, num_envs=1))

    def expected(self, resolved: Resolved) -> tuple[TensorSpec, TensorSpec]:
        """The names, shapes and dtypes every state of ``resolved`` holds, and those of the
        collected-data tensors it may add (zero rows: see ``Agent.data_layout``)."""
        key = self._key(resolved)
        if key not in self._specs:
            agent = self.agent(resolved)
            self._specs[key] = spec_of(agent.state_dict())
            self._data[key] = spec_of(agent.data_layout())
        return self._specs[key], self._data[key]

    def check(self, resolved: Resolved, state: Mapping[str, torch.Tensor]) -> None:
        """``ConfigError`` naming the first tensor that breaks the contract."""
        fixed, data = self.expected(resolved)
        missing = sorted(set(fixed) - set(state))
        extra = sorted(set(state) - set(fixed) - set(data))
        if missing or extra:
            raise ConfigError("state", f"tensor names differ from {resolved.algorithm}'s: "
                              + (f"missing {missing[:3]}" if missing else
                                 f"unexpected {extra[:3]}"))
        held = {_group(n) for n in state if n in data}
        partial = sorted(n for n in data if _group(n) in held and n not in state)
        if partial:
            raise ConfigError(f"state.{partial[0]}", "missing beside the other tensors of "
                              "its group")
        expected = {**fixed, **{n: data[n] for n in data if n in state}}
        rows: dict[str, tuple[str, int]] = {}
        for name, (shape, dtype) in expected.items():
            tensor = state[name]
            group = _group(name)
            if group is not None and tensor.dim() >= 1 and len(shape) >= 1:
                if tensor.dtype != dtype or tuple(tensor.shape[1:]) != shape[1:]:
                    raise ConfigError(f"state.{name}", f"expected {dtype} rows of "
                                      f"{list(shape[1:])}, got {tensor.dtype} "
                                      f"{list(tensor.shape)}")
                count, cap = int(tensor.shape[0]), _rows_cap(group, resolved.config)
                if count > cap:
                    raise ConfigError(f"state.{name}", f"{count} rows exceed the {cap} "
                                      "this config holds")
                first = rows.setdefault(group, (name, count))
                if first[1] != count:
                    raise ConfigError(f"state.{name}", f"{count} rows, but {first[0]} has "
                                      f"{first[1]}")
            elif tuple(tensor.shape) != shape or tensor.dtype != dtype:
                raise ConfigError(f"state.{name}", f"expected {dtype} {list(shape)}, got "
                                  f"{tensor.dtype} {list(tensor.shape)}")
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                raise ConfigError(f"state.{name}", "contains NaN or infinite values")
