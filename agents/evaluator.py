"""Score a policy on a separate batched env, and remember the best state of a round.

``evaluate`` runs deterministic actions on an eval env of its own (never the training
env, whose episodes are mid-way) until ``episodes`` episodes are done. Which episodes
count is fixed *before* running: copy ``i`` contributes its first ``k_i`` episodes,
with the ``k_i`` spread as evenly as possible (with 32 copies and 32 episodes, every
copy's first episode). Counting "whichever episodes finish first" instead would favour
short episodes, which in many envs are the failures.

An env that holds out validation data of its own (``HoldsOutValidation``: a stock env
whose name gives validation windows) is scored on its ``validation_envs()`` instead, so
every score (in a round, by the updater, by ``podracer evaluate``) ranks on them: each
window gets ``episodes`` episodes, and the env's ``validation_score`` makes one score of
the windows' means (a policy that does well in one regime only ranks lower). The std is
then the spread of the windows' means.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Protocol, runtime_checkable

import torch

from broker.core.errors import ConfigError, PodracerError
from envs.base import VecEnv

log = logging.getLogger(__name__)


@runtime_checkable
class HoldsOutValidation(Protocol):
    """An env whose evaluations score on held-out days of its own."""

    def validation_envs(self) -> Sequence[VecEnv]:
        """The envs to score on, one per validation window: as many copies each."""
        ...

    def validation_score(self, returns: Sequence[float]) -> float:
        """One score from each window's mean return."""
        ...


@dataclasses.dataclass(frozen=True)
class EvalResult:
    """Mean and (population) std of undiscounted episode returns over ``episodes``."""

    mean: float
    std: float
    episodes: int

    def joined(self, other: EvalResult) -> EvalResult:
        """The result of this one's episodes and ``other``'s together."""
        n = self.episodes + other.episodes
        mean = (self.episodes * self.mean + other.episodes * other.mean) / n
        second = (self.episodes * (self.std ** 2 + self.mean ** 2)
                  + other.episodes * (other.std ** 2 + other.mean ** 2)) / n
        return EvalResult(mean, math.sqrt(max(0.0, second - mean ** 2)), n)


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """Run the block with ``threads`` torch threads in this thread, restored after.

    OpenMP counts threads per calling thread, and a thread that never set them (an
    ``asyncio.to_thread`` worker) runs as many as the machine has cores: beside pods that
    each hold a core, such a pool spins on theirs. Measured on 2 cores: the updater's
    32-episode HalfCheetah measurement took 5.9 s with the default 2 threads and 4.8 s
    with 1, alone."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _targets(episodes: int, num_envs: int, device: torch.device) -> torch.Tensor:
    base, rest = divmod(episodes, num_envs)
    targets = torch.full((num_envs,), base, dtype=torch.long, device=device)
    targets[:rest] += 1
    return targets


@torch.no_grad()
def evaluate(
    agent_act: Callable[[torch.Tensor], torch.Tensor],
    env: VecEnv,
    episodes: int = 32,
    *,
    seed: int | None = None,
    max_steps: int = 100_000,
) -> EvalResult:
    """Run ``agent_act`` (deterministic actions) on ``env`` until ``episodes`` episodes end.

    ``env`` is reset first (with ``seed`` when given). ``max_steps`` bounds the loop: an
    env whose episodes never end raises ``PodracerError`` instead of hanging the pod.
    """
    if episodes < 1:
        raise ConfigError("episodes", f"must be >= 1, got {episodes}")
    if isinstance(env, HoldsOutValidation):
        windows = [_run(agent_act, e, episodes, seed, max_steps)
                   for e in env.validation_envs()]
        if len(windows) == 1:
            return windows[0]
        means = [w.mean for w in windows]
        spread = float(torch.tensor(means, dtype=torch.float64).std(unbiased=False))
        return EvalResult(mean=env.validation_score(means), std=spread,
                          episodes=episodes * len(windows))
    return _run(agent_act, env, episodes, seed, max_steps)


def _run(agent_act: Callable[[torch.Tensor], torch.Tensor], env: VecEnv, episodes: int,
         seed: int | None, max_steps: int) -> EvalResult:
    obs, _ = env.reset(seed=seed)
    device = obs.device
    targets = _targets(episodes, env.num_envs, device)
    done_count = torch.zeros(env.num_envs, dtype=torch.long, device=device)
    running = torch.zeros(env.num_envs, dtype=torch.float64, device=device)
    returns: list[torch.Tensor] = []
    for _ in range(max_steps):
        obs, reward, terminated, truncated, _ = env.step(agent_act(obs))
        running += reward.to(device, torch.float64)
        ended = terminated | truncated
        counted = ended & (done_count < targets)
        returns.append(running[counted])
        done_count += ended.long()
        running *= ~ended
        if bool((done_count >= targets).all()):
            break
    else:
        raise PodracerError(f"evaluation: {int(done_count.clamp(max=targets).sum())} of "
                            f"{episodes} episodes ended within {max_steps} steps")
    scores = torch.cat(returns)
    assert scores.numel() == episodes, (scores.numel(), episodes)
    mean = float(scores.mean())
    std = float(scores.std(unbiased=False))
    return EvalResult(mean=mean, std=std, episodes=episodes)


class BestSnapshot:
    """The best-scoring state seen during a round (ties keep the earlier one)."""

    def __init__(self) -> None:
        self.result: EvalResult | None = None
        self.state: dict[str, torch.Tensor] | None = None
        self.env_steps = 0

    def offer(
        self,
        result: EvalResult,
        state_fn: Callable[[], Mapping[str, torch.Tensor]],
        env_steps: int = 0,
    ) -> bool:
        """Keep a copy of ``state_fn()`` if ``result`` beats the best so far; say whether."""
        if not math.isfinite(result.mean):
            return False
        if self.result is not None and result.mean <= self.result.mean:
            return False
        self.result = result
        self.state = {k: v.detach().clone() for k, v in state_fn().items()}
        self.env_steps = env_steps
        log.debug("new best %.2f at %d steps", result.mean, env_steps)
        return True
