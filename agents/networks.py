"""Small building blocks shared by the algorithms: MLPs with orthogonal init, the twin
Q critic of TD3 and SAC, seeded construction, and the gradient-step and target helpers
of their updates.

Every network in Podracer is an MLP over a flat observation. ``mlp`` builds one with
orthogonal weights (gain sqrt(2) for hidden layers, ``out_gain`` for the last layer:
a small gain such as 0.01 keeps a fresh policy near-uniform, 1.0 suits critics), the
init CleanRL and the PPO implementation-details study found to matter.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Iterator, Sequence

import torch
from torch import nn

from broker.core.errors import ConfigError

HIDDEN_GAIN = math.sqrt(2.0)


def orthogonal_init(layer: nn.Linear, gain: float = HIDDEN_GAIN, bias: float = 0.0) -> nn.Linear:
    """Initialise ``layer`` in place with orthogonal weights and a constant bias; return it."""
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(
    sizes: Sequence[int],
    activation: type[nn.Module] = nn.Tanh,
    out_gain: float = 1.0,
    out_activation: type[nn.Module] | None = None,
) -> nn.Sequential:
    """An MLP ``sizes[0] -> ... -> sizes[-1]``, orthogonally initialised.

    ``activation`` follows every hidden layer; ``out_activation`` (e.g. ``nn.Tanh`` for a
    deterministic actor) follows the last one if given.
    """
    if len(sizes) < 2:
        raise ConfigError("sizes", f"an MLP needs input and output sizes, got {list(sizes)}")
    layers: list[nn.Module] = []
    last = len(sizes) - 2
    for i, (n_in, n_out) in enumerate(itertools.pairwise(sizes)):
        gain = out_gain if i == last else HIDDEN_GAIN
        layers.append(orthogonal_init(nn.Linear(n_in, n_out), gain))
        if i < last:
            layers.append(activation())
        elif out_activation is not None:
            layers.append(out_activation())
    return nn.Sequential(*layers)


def flat_dim(shape: Sequence[int] | None) -> int:
    """The number of features of an observation of ``shape`` (1 for a scalar)."""
    return int(math.prod(shape)) if shape else 1


class TwinQ(nn.Module):
    """Two independent Q(s, a) networks (the critics of TD3 and SAC)."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: int, layers: int) -> None:
        super().__init__()
        sizes = [obs_dim + act_dim, *[hidden] * layers, 1]
        self.q1 = mlp(sizes, nn.ReLU)
        self.q2 = mlp(sizes, nn.ReLU)

    def forward(self, obs: torch.Tensor, action: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Both Q estimates, each ``[B]``."""
        x = torch.cat([obs.flatten(1), action], dim=-1)
        return self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Within the block torch's global RNG is seeded with ``seed`` and restored after:
    networks built in it are initialised reproducibly without touching the RNG that
    other code in the process relies on."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def polyak(target: nn.Module, source: nn.Module, tau: float) -> None:
    """``target <- (1 - tau) * target + tau * source``, parameter by parameter."""
    with torch.no_grad():
        torch._foreach_lerp_(list(target.parameters()), list(source.parameters()), tau)


def gradient_step(optimizer: torch.optim.Optimizer, loss: torch.Tensor) -> None:
    """Backpropagate ``loss`` from cleared gradients and take one ``optimizer`` step."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


@contextlib.contextmanager
def frozen(module: nn.Module) -> Iterator[None]:
    """Within the block ``module`` takes no gradients (a critic while its actor learns:
    they would be thrown away anyway)."""
    module.requires_grad_(False)
    try:
        yield
    finally:
        module.requires_grad_(True)


class RunningMeanStd(nn.Module):
    """Running mean / variance of observations (parallel Welford), kept as buffers.

    Being buffers, the statistics travel with ``state_dict`` and so with checkpoints.
    """

    def __init__(self, shape: Sequence[int], epsilon: float = 1e-4, clip: float = 10.0) -> None:
        super().__init__()
        self.clip = clip
        self.register_buffer("mean", torch.zeros(*shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(*shape, dtype=torch.float64))
        # float64 count: a pseudo-count epsilon avoids a division by zero before the first update
        self.register_buffer("count", torch.tensor(epsilon, dtype=torch.float64))

    mean: torch.Tensor
    var: torch.Tensor
    count: torch.Tensor

    @torch.no_grad()
    def update(self, batch: torch.Tensor) -> None:
        """Fold a batch ``[B, *shape]`` into the statistics."""
        x = batch.reshape(-1, *self.mean.shape)
        b_count = x.shape[0]
        # two-pass with plain sums: exact, and ~5x faster than var_mean over dim 0 on CPU
        x_mean = x.sum(0) / b_count
        b_var = (x - x_mean).square().sum(0).to(torch.float64) / b_count
        self._fold(x_mean.to(torch.float64), b_var, b_count)

    def _fold(self, b_mean: torch.Tensor, b_var: torch.Tensor, b_count: int) -> None:
        """Merge a batch's mean, (population) variance and count (Chan et al.)."""
        delta = b_mean - self.mean
        total = self.count + b_count
        m2 = self.var * self.count + b_var * b_count + delta.square() * self.count * b_count / total
        self.mean.add_(delta * b_count / total)
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """``(x - mean) / std`` clipped to ``[-clip, clip]``, in ``x``'s dtype."""
        mean, std = self.mean.to(x.dtype), (self.var + 1e-8).sqrt().to(x.dtype)
        return ((x - mean) / std).clamp(-self.clip, self.clip)
