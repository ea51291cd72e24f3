"""The one checkpoint contract of every algorithm: the training state as a flat map of
tensors, named the same way by all of them.

* ``<part>.<key>``: a network's ``state_dict`` entries (weights, targets, normaliser
  statistics), or ``<part>`` alone for a lone tensor (SAC's ``log_alpha``);
* ``optim.<param>.<slot>``: Adam's ``step``, ``exp_avg`` and ``exp_avg_sq`` of the
  parameter stored as ``<param>``: named by parameter, not by its index inside one
  optimizer, so the name says what it is and survives a reordering;
* ``rng`` / ``rng.<stream>``: ``torch.Generator`` states (uint8);
* ``counters.<name>``: int64 scalars;
* collected data, ``replay.*`` and ``hterm.*``: rows, present only when there are any.

Adam's moments are created with the optimizer (``adam``). Zero moments at step 0 are
exactly what Adam creates at its first step, so learning is unchanged, and a freshly
built agent's state has the same names, shapes and dtypes as a trained one's: whoever
checks a checkpoint can compare it with any agent built from the same config.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch
from torch import nn

from broker.core.errors import ConfigError

StateDict = dict[str, torch.Tensor]
Parts = Mapping[str, nn.Module | torch.Tensor]
"""An agent's networks (and lone tensors) by the name their tensors are stored under."""


def adam(params: Iterable[torch.Tensor], lr: float, eps: float = 1e-8) -> torch.optim.Adam:
    """An Adam optimizer whose state exists from the start (see the module doc)."""
    optimizer = torch.optim.Adam(params, lr=lr, eps=eps)
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state[param]
            if not state:  # Adam's own first-step initialisation, done now
                state["step"] = torch.tensor(0.0)
                state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(param,
                                                       memory_format=torch.preserve_format)
    return optimizer


def adam_state_tensors(optimizer: torch.optim.Optimizer, named: Mapping[str, torch.Tensor]
                       ) -> StateDict:
    """The live state tensors of ``optimizer``, ``optim.<name>.<slot>`` where ``named``
    maps ``name`` to the parameter (``named`` may hold parameters of other optimizers)."""
    names = {id(param): name for name, param in named.items()}
    out: StateDict = {}
    for group in optimizer.param_groups:
        for param in group["params"]:
            assert id(param) in names, "every optimized parameter is part of the state"
            for slot, value in optimizer.state[param].items():
                if isinstance(value, torch.Tensor):
                    out[f"optim.{names[id(param)]}.{slot}"] = value
    return out


def live_tensors(parts: Parts, optimizers: Sequence[torch.optim.Optimizer]) -> StateDict:
    """Every tensor of ``parts`` and the state of ``optimizers``, by their state names
    (the live tensors themselves: ``copy_state`` writes into them)."""
    live: StateDict = {}
    named: dict[str, torch.Tensor] = {}
    for name, part in parts.items():
        if isinstance(part, torch.Tensor):
            live[name] = named[name] = part
        else:
            live.update({f"{name}.{k}": v for k, v in part.state_dict().items()})
            named.update({f"{name}.{k}": p for k, p in part.named_parameters()})
    for optimizer in optimizers:
        live.update(adam_state_tensors(optimizer, named))
    return live


def copy_state(live: Mapping[str, torch.Tensor], state: Mapping[str, torch.Tensor]) -> None:
    """Copy ``state`` into the ``live`` tensors in place, all or nothing.

    Raises ``ConfigError`` naming the first missing, unexpected or mis-shaped tensor
    before anything is written.
    """
    missing = sorted(set(live) - set(state))
    if missing:
        raise ConfigError(f"state.{missing[0]}", f"missing {len(missing)} tensor(s)",
                          "the checkpoint was made by another algorithm or network size")
    extra = sorted(set(state) - set(live))
    if extra:
        raise ConfigError(f"state.{extra[0]}", f"unexpected {len(extra)} tensor(s)",
                          "the checkpoint was made by another algorithm or network size")
    for name, target in live.items():
        if tuple(state[name].shape) != tuple(target.shape):
            raise ConfigError(f"state.{name}",
                              f"shape {tuple(state[name].shape)} != expected {tuple(target.shape)}",
                              "match the hidden sizes and env spaces of the checkpoint")
    with torch.no_grad():
        for name, target in live.items():
            target.copy_(state[name])


def save_state(live: Mapping[str, torch.Tensor], generators: Mapping[str, torch.Generator],
               counters: Mapping[str, int]) -> StateDict:
    """Copies of ``live``, the ``generators``' states and the ``counters`` (int64)."""
    state = {name: value.detach().clone() for name, value in live.items()}
    state.update({name: gen.get_state() for name, gen in generators.items()})
    state.update({name: torch.tensor(value, dtype=torch.int64)
                  for name, value in counters.items()})
    return state


def load_state(state: Mapping[str, torch.Tensor], live: Mapping[str, torch.Tensor],
               generators: Mapping[str, torch.Generator], counters: Sequence[str],
               data: tuple[str, ...] = ()) -> dict[str, int]:
    """Restore what ``save_state`` wrote, all or nothing; return the counters.

    Tensors named with a ``data`` prefix are the caller's to load. A generator whose state
    is absent keeps its stream: a child of a checkpoint drops its parent's RNG states so
    that siblings explore differently (see ``agents.build.build_agent``). Optimizer
    hyperparameters (learning rates) stay the current config's, so a mutated child's take
    effect on the restored moments.
    """
    for name in counters:
        value = state.get(name)
        if value is None or value.numel() != 1 or value.is_floating_point():
            raise ConfigError(f"state.{name}", "missing or not an integer scalar",
                              "pass a full checkpoint of the same algorithm")
    for name, gen in generators.items():
        rng = state.get(name)
        if rng is not None and (rng.dtype != torch.uint8
                                or rng.shape != gen.get_state().shape):
            raise ConfigError(f"state.{name}", f"not a generator state ({rng.dtype}, "
                              f"{tuple(rng.shape)})", "pass a full checkpoint of the same "
                              "algorithm")
    skip = {*counters, *generators}
    copy_state(live, {k: v for k, v in state.items()
                      if k not in skip and not k.startswith(data)})
    for name, gen in generators.items():
        if name in state:
            gen.set_state(state[name].cpu())
    return {name: int(state[name]) for name in counters}
