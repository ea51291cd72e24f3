"""Plumbing shared by the pure-torch batched envs: argument checks, device, RNG.

Each env module keeps its own ``step`` so its physics reads top to bottom; only the
parts that are identical everywhere live here.
"""

from __future__ import annotations

import torch

from broker.core.errors import ConfigError


def check_num_envs(num_envs: int) -> int:
    """Return ``num_envs`` if it is a positive int, else raise ``ConfigError``."""
    if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
        raise ConfigError("num_envs", f"must be an int >= 1, got {num_envs!r}", "pass e.g. 1024")
    return num_envs


def check_device(device: str | torch.device) -> torch.device:
    """Parse ``device`` into a ``torch.device`` or raise ``ConfigError``."""
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ConfigError(
            "device", f"{device!r} is not a torch device ({e})", "use 'cpu' or 'cuda:0'"
        ) from None


def check_state_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accept float32 or float64 as the dtype the physics state is kept in."""
    if dtype not in (torch.float32, torch.float64):
        raise ConfigError(
            "state_dtype",
            f"must be torch.float32 or torch.float64, got {dtype!r}",
            "use float64 for 1e-5 agreement with Gymnasium, float32 for speed",
        )
    return dtype


def make_generator(device: torch.device, seed: int | None) -> torch.Generator:
    """A generator on ``device``; a fresh nondeterministic seed when ``seed`` is None."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


def uniform(
    generator: torch.Generator,
    shape: tuple[int, ...],
    low: float,
    high: float,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """Uniform samples in ``[low, high)`` from ``generator``, as ``dtype`` (no host sync).

    Always drawn in float64, so a seed gives the same start states whatever ``dtype``.
    """
    sample = torch.rand(shape, generator=generator, dtype=torch.float64, device=device)
    return sample.mul_(high - low).add_(low).to(dtype)


def check_state_shape(state: torch.Tensor, num_envs: int, width: int) -> None:
    """Raise ``ConfigError`` unless ``state`` is ``[num_envs, width]``."""
    if state.shape != (num_envs, width):
        raise ConfigError(
            "state",
            f"expected shape ({num_envs}, {width}), got {tuple(state.shape)}",
            "pass one row of the Gymnasium-layout state per copy",
        )
