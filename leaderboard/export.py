"""Export the leaderboard's best checkpoint(s) as one policy file, and load it back.

The file is ``broker.core.codec.pack`` of one map (msgpack with tensors; never pickle)::

    {"format": "podracer-policy", "version": 1, "env": "<env name>",
     "members": [{"id", "algorithm", "hparams", "score_mean", "state"}, ...]}

Members are ranked best first. ``load_policy`` validates the file field by field
(``ConfigError`` naming the field) and rebuilds each member's agent from its
algorithm, hyperparameters and state: loading decodes data, it never runs code from
the file. The agents are built on ``make_env(env, num_envs of the member's config)``
for the spaces, exactly as a pod builds them, so a state that does not fit is caught.

A file is not a command, as a message is not one to a pod: an env name imports modules
(``gym/<module>:<id>``) and opens files (``stock/<path>``), so ``load_policy`` builds on
the file's own env only when it does neither (``policy_env_refusal``); otherwise the
caller names the env it trusts (``env=``; the CLI's ``--env``, or ``backtest --csv``),
and the file's env is never built.

An ensemble ``Policy`` averages continuous actions (then clips them to the action
space) and takes a majority vote for discrete ones; a tie goes to the action of the
best-ranked member among those tied.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import torch

from agents.base import Agent, AlgorithmRegistry, Scalar
from agents.build import build_agent, resolve_config
from broker.core import codec
from broker.core.errors import ConfigError, DecodeError
from envs.registry import make_env
from leaderboard.store import Entry, LeaderboardStore, short_id

log = logging.getLogger(__name__)

FORMAT = "podracer-policy"
VERSION = 1
_MAX_CANDIDATES = 10


@dataclasses.dataclass(frozen=True)
class PolicyMember:
    """Who a member of an exported policy is (its state lives in its agent)."""

    id: str
    algorithm: str
    hparams: dict[str, Scalar]
    score_mean: float


class Policy:
    """Deterministic actions of one agent or an ensemble: ``policy(obs[N, ...]) -> act[N, ...]``."""

    def __init__(self, env: str, members: Sequence[PolicyMember], agents: Sequence[Agent],
                 action_space: gymnasium.spaces.Space[Any], device: torch.device,
                 observation_space: gymnasium.spaces.Space[Any] | None = None) -> None:
        """``members[i]`` describes ``agents[i]``; both ranked best first."""
        if not agents or len(agents) != len(members):
            raise ConfigError("members", f"{len(members)} members for {len(agents)} agents",
                              "give one agent per member, at least one")
        if not isinstance(action_space, gymnasium.spaces.Box | gymnasium.spaces.Discrete):
            raise ConfigError("action_space", f"{type(action_space).__name__} is not supported",
                              "export agents of an env with Box or Discrete actions")
        self.env = env
        self.members = tuple(members)
        self.agents = tuple(agents)
        self.action_space = action_space
        self.observation_space = observation_space
        self.device = device

    def __repr__(self) -> str:
        ids = ", ".join(short_id(m.id) for m in self.members)
        return f"Policy(env={self.env!r}, members=[{ids}])"

    @torch.no_grad()
    def __call__(self, obs: torch.Tensor) -> torch.Tensor:
        """Actions for a batch of observations (on the policy's device)."""
        obs = obs.to(self.device)
        actions = [agent.act(obs, True) for agent in self.agents]
        if len(actions) == 1:
            return actions[0]
        stacked = torch.stack(actions)
        if isinstance(self.action_space, gymnasium.spaces.Discrete):
            return self._vote(stacked, self.action_space)
        return self._average(stacked, self.action_space)

    def predict(self, obs: Any) -> Any:
        """Actions for ``obs`` given as NumPy (or a list) or torch, one observation or a
        batch; returned in the same kind and shape: ``act[N, ...]`` for ``obs[N, ...]``,
        ``act[...]`` for one. Like Stable-Baselines3's ``predict`` (deterministic), but
        the actions alone: a policy here has no recurrent state to return."""
        numpy_in = not isinstance(obs, torch.Tensor)
        tensor = torch.as_tensor(np.asarray(obs, dtype=np.float32)) if numpy_in else obs
        shape = tuple(getattr(self.observation_space, "shape", None) or ())
        single = tuple(tensor.shape) == shape
        if shape and not single and tuple(tensor.shape[1:]) != shape:
            raise ConfigError("obs", f"shape {tuple(tensor.shape)} is neither one observation "
                              f"{shape} nor a batch of them", f"give shape {shape} or "
                              f"(N, {', '.join(map(str, shape))})")
        actions = self(tensor[None] if single else tensor)
        actions = actions[0] if single else actions
        return actions.cpu().numpy() if numpy_in else actions.to(tensor.device)

    def _average(self, stacked: torch.Tensor, space: gymnasium.spaces.Box) -> torch.Tensor:
        mean = stacked.float().mean(dim=0)
        low = torch.as_tensor(space.low, dtype=mean.dtype, device=mean.device)
        high = torch.as_tensor(space.high, dtype=mean.dtype, device=mean.device)
        return torch.clamp(mean, low, high).to(stacked.dtype)

    def _vote(self, stacked: torch.Tensor, space: gymnasium.spaces.Discrete) -> torch.Tensor:
        start, n = int(space.start), int(space.n)
        members = stacked.shape[0]
        # Each vote counts 1 plus a bonus 2^-(rank+2): the bonuses sum to < 1/2, so they
        # never overturn a count, and among tied actions the best-ranked member's wins.
        weights = 1.0 + torch.pow(2.0, -torch.arange(2, members + 2, dtype=torch.float64,
                                                     device=stacked.device))
        onehot = torch.nn.functional.one_hot((stacked.long() - start).clamp(0, n - 1), n)
        scores = (onehot.to(torch.float64) * weights.view(-1, *([1] * (onehot.dim() - 1)))).sum(0)
        return (scores.argmax(dim=-1) + start).to(stacked.dtype)


# ------------------------------------------------------------------ choosing entries


def resolve_entry(store: LeaderboardStore, prefix: str, field: str = "id") -> Entry:
    """The entry whose id is ``prefix`` or uniquely starts with it, as tables show ids
    (``leaderboard.store.short_id``): ``<round prefix>`` names a round's own checkpoint
    (or its only link, when the round has no checkpoint of its own),
    ``<round prefix>.<k>`` that round's link ``k``; else ``ConfigError``."""
    exact = store.get(prefix)
    if exact is not None:
        return exact
    count = store.count()
    head, dot, link = prefix.partition(".")
    entries = store.top(count) if prefix and count else []
    rounds = [(e, *e.id.partition(".")[::2]) for e in entries]  # (entry, round, link)
    matches = [e for e, h, k in rounds if h.startswith(head) and k == link]
    if not matches and not dot:
        matches = [e for e, h, _ in rounds if h.startswith(head)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        best = [short_id(e.id) for e in store.top(_MAX_CANDIDATES)] if count else []
        raise ConfigError(field, f"no checkpoint id starts with {prefix!r} in {store.root}",
                          f"known ids include: {', '.join(best)}" if best
                          else "the store is empty")
    shown = ", ".join(e.id for e in matches[:_MAX_CANDIDATES])
    more = f" and {len(matches) - _MAX_CANDIDATES} more" if len(matches) > _MAX_CANDIDATES else ""
    raise ConfigError(field, f"{prefix!r} matches {len(matches)} checkpoints: {shown}{more}",
                      "give a longer prefix")


def _chosen(store: LeaderboardStore, top: int, ids: Sequence[str] | None) -> list[Entry]:
    if ids:
        entries: dict[str, Entry] = {}
        for given in ids:
            entry = resolve_entry(store, given, "ids")
            entries.setdefault(entry.id, entry)
        return list(entries.values())
    if top < 1:
        raise ConfigError("top", f"must be >= 1, got {top}", "export at least one member")
    found = store.top(top)
    if not found:
        raise ConfigError("store", f"no checkpoints in {store.root}",
                          "train first, or point at the run directory of a trained experiment")
    return found


# ------------------------------------------------------------------ export


def export_policy(store: LeaderboardStore, path: str | Path, top: int = 1,
                  ids: Sequence[str] | None = None) -> Path:
    """Write the ``top`` best entries (or the entries ``ids``, id prefixes allowed) to ``path``.

    The file is written to a temporary name and renamed, so a reader never sees half of it.
    """
    entries = _chosen(store, top, ids)
    envs = sorted({e.env for e in entries})
    if len(envs) > 1:
        raise ConfigError("ids", f"the chosen checkpoints were trained on different envs: "
                          f"{', '.join(envs)}", "export members of one env only")
    members = [{"id": e.id, "algorithm": e.algorithm, "hparams": dict(e.hparams),
                "score_mean": float(e.score_mean), "state": store.load_state(e)}
               for e in entries]
    document = {"format": FORMAT, "version": VERSION, "env": envs[0], "members": members}
    out = Path(path)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(codec.pack(document))
        os.replace(tmp, out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ConfigError("path", f"cannot write {out}: {exc.strerror or exc}",
                          "choose a writable file path") from None
    log.info("exported %d member(s) of %s to %s", len(members), envs[0], out)
    return out


# ------------------------------------------------------------------ load


def _read(path: Path) -> dict[str, Any]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError("path", f"cannot read {path}: {exc.strerror or exc}",
                          "give a file written by `podracer export`") from None
    try:
        document = codec.unpack(data)
    except DecodeError as exc:
        raise ConfigError("path", f"{path} is not a podracer policy file ({exc})",
                          "give a file written by `podracer export`") from None
    if not isinstance(document, dict):
        raise ConfigError("path", f"{path} holds a {type(document).__name__}, not a policy map",
                          "give a file written by `podracer export`")
    if document.get("format") != FORMAT:
        raise ConfigError("format", f"expected {FORMAT!r}, got {document.get('format')!r}",
                          "give a file written by `podracer export`")
    version = document.get("version")
    if version != VERSION:
        raise ConfigError("version", f"unsupported policy file version {version!r} "
                          f"(this build reads {VERSION})",
                          "export it again with this Podracer version, or upgrade")
    if not isinstance(document.get("env"), str) or not document["env"]:
        raise ConfigError("env", "missing or not a string", "re-export the policy")
    return document


def _member(raw: Any, index: int) -> tuple[PolicyMember, dict[str, torch.Tensor]]:
    where = f"members[{index}]"
    if not isinstance(raw, dict):
        raise ConfigError(where, f"expected a map, got {type(raw).__name__}")
    for name in ("id", "algorithm"):
        if not isinstance(raw.get(name), str) or not raw[name]:
            raise ConfigError(f"{where}.{name}", "missing or not a string")
    hparams = raw.get("hparams")
    if not isinstance(hparams, dict) or not all(
            isinstance(v, bool | int | float | str) for v in hparams.values()):
        raise ConfigError(f"{where}.hparams", "expected a map of scalars")
    score = raw.get("score_mean")
    if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score):
        raise ConfigError(f"{where}.score_mean", f"expected a finite number, got {score!r}")
    state = raw.get("state")
    if not isinstance(state, dict) or not state or not all(
            isinstance(v, torch.Tensor) for v in state.values()):
        raise ConfigError(f"{where}.state", "expected a non-empty map of tensors")
    member = PolicyMember(raw["id"], raw["algorithm"], dict(hparams), float(score))
    return member, state


def build_policy(env: str, members: Sequence[tuple[PolicyMember, Mapping[str, torch.Tensor]]],
                 device: str | torch.device = "cpu",
                 registry: AlgorithmRegistry | None = None) -> Policy:
    """Build each member's agent on ``device`` with its state loaded; see the module doc."""
    if registry is None:
        from agents.registry import default_registry

        registry = default_registry()
    torch_device = torch.device(device)
    if torch_device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", f"{torch_device} requested but CUDA is not available",
                          "use --device cpu")
    agents: list[Agent] = []
    action_space: gymnasium.spaces.Space[Any] | None = None
    observation_space: gymnasium.spaces.Space[Any] | None = None
    for index, (member, state) in enumerate(members):
        try:
            config = resolve_config(registry, member.algorithm, member.hparams)
            venv = make_env(env, config.num_envs, "cpu")
            try:
                agent = build_agent(registry, member.algorithm, member.hparams, venv,
                                    torch_device, seed=0, state=state)
                action_space = venv.single_action_space
                observation_space = venv.single_observation_space
            finally:
                venv.close()
        except ConfigError as exc:
            raise ConfigError(f"members[{index}] ({short_id(member.id)}).{exc.field}", exc.problem,
                              exc.fix) from None
        agents.append(agent)
    if action_space is None:
        raise ConfigError("members", "no member to build", "export at least one checkpoint")
    return Policy(env, [m for m, _ in members], agents, action_space, torch_device,
                  observation_space)


def policy_env_refusal(env: str) -> str | None:
    """Why a policy file may not have its own ``env`` built (``None``: it may)."""
    if re.fullmatch(r"[!-~]{1,512}", env) is None:
        return f"{env[:100]!a} is not a plain env name"
    prefix, _, target = env.partition("/")
    if prefix == "stock":
        return f"{env[:200]!r} would open the file {target.partition('?')[0][:200]!r}"
    if prefix == "gym" and ":" in target:
        return f"{env[:200]!r} would import the module {target.partition(':')[0][:100]!r}"
    return None


def policy_env(path: str | Path) -> str:
    """The env name a policy file was exported for (read, not built)."""
    env: str = _read(Path(path))["env"]
    return env


def load_policy(path: str | Path, device: str | torch.device = "cpu",
                registry: AlgorithmRegistry | None = None, *, env: str | None = None) -> Policy:
    """Read a file written by ``export_policy``; ``ConfigError`` names what is wrong.

    ``env`` is the env to build the policy on, the caller's choice (module doc); without
    it the file's env is built only if that imports no module and opens no file."""
    document = _read(Path(path))
    raw_members = document.get("members")
    if not isinstance(raw_members, list) or not raw_members:
        raise ConfigError("members", "missing or empty", "re-export the policy")
    members = [_member(raw, i) for i, raw in enumerate(raw_members)]
    if env is None:
        refusal = policy_env_refusal(document["env"])
        if refusal is not None:
            raise ConfigError("env", f"the policy file names {refusal}; a file does not "
                              "choose what to import or open",
                              "name the env you trust: env=... (CLI: --env, or backtest --csv)")
        env = document["env"]
    return build_policy(env, members, device, registry)


def policy_from_store(store: LeaderboardStore, ids: Sequence[str],
                      device: str | torch.device = "cpu",
                      registry: AlgorithmRegistry | None = None) -> Policy:
    """A ``Policy`` straight from store entries (id prefixes allowed), no file in between."""
    entries = _chosen(store, 1, ids)
    if len({e.env for e in entries}) > 1:
        raise ConfigError("ids", "the chosen checkpoints were trained on different envs",
                          "choose members of one env only")
    members = [(PolicyMember(e.id, e.algorithm, dict(e.hparams), e.score_mean),
                store.load_state(e)) for e in entries]
    return build_policy(entries[0].env, members, device, registry)
