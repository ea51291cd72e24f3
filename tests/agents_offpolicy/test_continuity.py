"""Continuity across rounds: a lineage keeps its replay data, siblings differ, learners
train every algorithm, and rounds run in a thread or in a worker process alike."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from agents.base import config_to_hparams
from agents.build import resolve, resolve_config
from agents.pod.continuity import (
    CACHE_ENV,
    ContinuingEnv,
    EnvPool,
    ReplayCache,
    default_cache_bytes,
    fit_rows,
    replay_rows,
    rows_bytes,
)
from agents.pod.learners import LearnerGroup, build_learners
from agents.pod.runner import (
    ProcessWorker,
    RoundJob,
    RoundOutput,
    RoundRunner,
    RunnerConfig,
    ThreadWorker,
    buffer_of,
)
from agents.registry import default_registry
from agents.replay import ReplayBuffer
from broker.core.errors import ConfigError
from broker.core.schemas import Budget
from broker.runtime.faults import Fault, Faulted
from envs.registry import make_env

pytestmark = pytest.mark.timeout(120)

CPU = torch.device("cpu")
PENDULUM = "torch/Pendulum-v1"
TINY = {"num_envs": 4, "batch_size": 8, "learning_starts": 8, "hidden_size": 16,
        "updates_per_iter": 2, "buffer_size": 4096}
ENV_OF = {"sac": PENDULUM, "td3": PENDULUM, "ddpg": PENDULUM, "dqn": "torch/CartPole-v1",
          "ppo": PENDULUM}
HPARAMS_OF: dict[str, dict[str, Any]] = {
    **{name: TINY for name in ("sac", "td3", "ddpg", "dqn")},
    "ppo": {"num_envs": 4, "rollout_steps": 8, "num_minibatches": 2, "update_epochs": 1,
            "hidden_size": 8}}


def _runner() -> RoundRunner:
    return RoundRunner(default_registry(), RunnerConfig(eval_episodes=2, eval_every_s=None),
                       make_env)


def _job(steps: int, **changes: Any) -> RoundJob:
    fields: dict[str, Any] = {"algorithm": "sac", "env": PENDULUM, "hparams": TINY, "seed": 0,
                              "budget": Budget(steps=steps)}
    fields.update(changes)
    fields["resolved"] = resolve(default_registry(), fields.pop("algorithm"),
                                 fields.pop("hparams"))
    return RoundJob(**fields)


def _child(parent: RoundOutput, seed: int, steps: int = 40) -> RoundJob:
    assert parent.result.state is not None
    return _job(steps, seed=seed, state=parent.result.state, replay=parent.replay,
                own_rng=True)


# ------------------------------------------------------------------ replay rows and cache

def test_rows_come_out_oldest_first_and_fit_a_smaller_buffer() -> None:
    buffer = ReplayBuffer(5, (1,), (1,), CPU)
    for value in range(7):  # the ring wraps: rows 2..6 stay, the oldest at pos 2
        t = torch.full((1, 1), float(value))
        buffer.add(t, t, t[:, 0], t, torch.zeros(1, dtype=torch.bool))
    rows = replay_rows(buffer)
    assert rows["replay.obs"].flatten().tolist() == [2.0, 3.0, 4.0, 5.0, 6.0]
    other = ReplayBuffer(5, (1,), (1,), CPU)
    other.load_state_dict(rows)  # full ring, pos 0: the next write replaces the oldest
    t = torch.full((1, 1), 7.0)
    other.add(t, t, t[:, 0], t, torch.zeros(1, dtype=torch.bool))
    assert sorted(other.obs.flatten().tolist()) == [3.0, 4.0, 5.0, 6.0, 7.0]
    newest = fit_rows(rows, 3)
    assert newest["replay.obs"].flatten().tolist() == [4.0, 5.0, 6.0]


def _rows(n: int, value: float = 0.0) -> dict[str, torch.Tensor]:
    return {"replay.obs": torch.full((n, 4), value), "replay.pos": torch.tensor(0)}


def test_cache_evicts_least_recently_used_within_its_bytes() -> None:
    size = rows_bytes(_rows(10))
    cache = ReplayCache(max_bytes=2 * size)
    cache.put("a", _rows(10))
    cache.put("b", _rows(10))
    assert cache.get("a") is not None  # a is now the most recent
    cache.put("c", _rows(10))
    assert cache.get("b") is None and cache.get("a") is not None and cache.get("c") is not None
    assert cache.bytes <= 2 * size
    cache.put("huge", _rows(1000))  # larger than the whole cache: not kept, nothing evicted
    assert cache.get("huge") is None and len(cache) == 2


def test_cache_gives_a_lineage_its_newest_rows() -> None:
    cache = ReplayCache(max_bytes=10**6)
    cache.put("root", _rows(2, 1.0))
    cache.put("child", _rows(3, 2.0), parent_id="root")
    cache.put("grandchild", _rows(4, 3.0), parent_id="child")
    cache.put("other", _rows(1, 9.0))
    # a lineage continued from an older checkpoint keeps what its descendants collected
    for ancestor in ("root", "child", "grandchild"):
        rows = cache.get(ancestor)
        assert rows is not None and rows["replay.obs"].shape[0] == 4
    assert cache.get("other")["replay.obs"].shape[0] == 1  # type: ignore[index]
    # an intermediate best of a round holds no rows: its lineage gets the round's end
    cache.link("grandchild.1", "child")
    cache.put("great", _rows(5, 4.0), parent_id="grandchild.1")
    for ancestor in ("root", "child", "grandchild.1"):
        assert cache.get(ancestor)["replay.obs"].shape[0] == 5  # type: ignore[index]
    assert cache.get(None) is None and cache.get("unknown") is None


def test_env_pool_reuses_envs_of_the_same_kind() -> None:
    built: list[tuple[str, int]] = []

    def make(name: str, copies: int) -> Any:
        built.append((name, copies))
        return make_env(name, copies)

    pool = EnvPool(make, keep=1)
    env = pool.take(PENDULUM, 4)
    pool.give_back(PENDULUM, 4, env)
    assert pool.take(PENDULUM, 4) is env and built == [(PENDULUM, 4)]
    pool.give_back(PENDULUM, 4, env)
    pool.give_back(PENDULUM, 2, pool.take(PENDULUM, 2))  # a second kind evicts the first
    assert pool.take(PENDULUM, 4) is not env
    pool.close()


# ------------------------------------------------------------------ rounds across a lineage

def test_a_continuing_child_holds_its_parents_transitions_and_a_fresh_one_starts_empty(
        ) -> None:
    torch.set_num_threads(1)
    runner = _runner()
    parent = runner.run(_job(80))
    assert parent.replay is not None
    kept = parent.replay["replay.obs"]
    assert kept.shape[0] == 80  # a fresh initialization collected only its own round
    child = runner.run(_child(parent, seed=1))
    assert child.replay is not None
    rows = child.replay["replay.obs"]
    assert rows.shape[0] == 80 + 40
    assert torch.equal(rows[:80], kept)  # the parent's transitions, oldest first
    cold = runner.run(_job(40, seed=2, state=parent.result.state, own_rng=True))
    assert cold.replay is not None and cold.replay["replay.obs"].shape[0] == 40
    runner.close()


def test_siblings_of_one_parent_explore_differently_and_a_seed_repeats() -> None:
    torch.set_num_threads(1)
    after = []
    for seed in (1, 2, 1):  # each on a runner of its own: the same envs' history
        runner = _runner()
        parent = runner.run(_job(80))
        child = runner.run(_child(parent, seed=seed)).replay
        assert child is not None
        after.append(child["replay.action"][80:])
        runner.close()
    assert not torch.equal(after[0], after[1])  # siblings: their own noise
    assert torch.equal(after[0], after[2])  # the same seed replays the same round


def test_the_next_round_carries_on_the_episodes_and_evaluations_start_afresh() -> None:
    torch.set_num_threads(1)
    runner = _runner()
    parent = runner.run(_job(80))  # 20 steps of each of 4 copies: no Pendulum episode ends
    child = runner.run(_child(parent, seed=1))
    assert child.replay is not None
    rows = child.replay
    # the child's first observations are where the parent's copies stood (no reset)
    assert torch.equal(rows["replay.obs"][80:84], rows["replay.next_obs"][76:80])
    cold = _runner().run(_child(parent, seed=1))  # a runner whose envs never stepped
    assert cold.replay is not None
    assert not torch.equal(cold.replay["replay.obs"][80:84], rows["replay.next_obs"][76:80])
    kept = runner.envs.take(PENDULUM, 4)
    assert isinstance(kept, ContinuingEnv) and kept.carried == 1
    evals = runner.envs.take(PENDULUM, 2)  # the evaluation env is never a carried one
    assert not isinstance(evals, ContinuingEnv)
    runner.close()


def test_a_carried_env_resets_for_real_unless_told_to_carry_on() -> None:
    env = ContinuingEnv(make_env(PENDULUM, 2))
    env.carry_on()  # never stepped: nothing to carry on
    first, _ = env.reset(seed=3)
    stepped = env.step(torch.zeros(2, 1))[0]
    again, _ = env.reset(seed=3)  # not told to carry on: a real, seeded reset
    assert torch.equal(again, first) and not torch.equal(stepped, first)
    after = env.step(torch.zeros(2, 1))[0]
    env.carry_on()
    assert torch.equal(env.reset(seed=4)[0], after) and env.carried == 1
    assert torch.equal(env.reset(seed=3)[0], first)  # once only
    env.close()


@pytest.mark.parametrize("algorithm", ["ppo", "sac", "td3", "ddpg", "dqn"])
def test_learners_train_every_algorithm(algorithm: str) -> None:
    torch.set_num_threads(1)
    registry = default_registry()
    hparams = HPARAMS_OF[algorithm]
    config = resolve_config(registry, algorithm, hparams)
    envs = [make_env(ENV_OF[algorithm], config.num_envs) for _ in range(2)]
    group = build_learners(registry, resolve(registry, algorithm, hparams), envs, CPU, seed=0)
    assert isinstance(group, LearnerGroup)
    for _ in range(6):
        metrics = group.train_iteration(envs[0])
    assert any(key.startswith("losses/") for key in metrics), metrics
    for learner in group.learners:
        buffer = buffer_of(learner)
        if buffer is not None:  # fusion keeps every learner's data and its place in the env
            assert len(buffer) == 6 * config.num_envs * config_to_hparams(config).get(
                "steps_per_iter", 1)
            assert learner.updates > 0  # type: ignore[attr-defined]
    weights = [learner.state_dict() for learner in group.learners]
    floats = [k for k, v in weights[0].items() if v.is_floating_point()
              and not k.startswith("replay.")]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in floats)


# ------------------------------------------------------------------ workers

def test_process_worker_runs_rounds_like_a_thread_and_reports_bad_jobs() -> None:
    config = RunnerConfig(eval_episodes=2, eval_every_s=None, torch_threads=1)
    worker = ProcessWorker(default_registry(), config, make_env)
    try:
        reports: list[Any] = []
        first = worker.run(_job(40), reports.append)
        local = ThreadWorker(_runner()).run(_job(40))
        assert first.replay is not None and local.replay is not None
        # the same job gives the same transitions in a worker process and in a thread
        assert torch.equal(first.replay["replay.obs"], local.replay["replay.obs"])
        assert reports  # progress crossed the process boundary
        with pytest.raises(ConfigError, match=r"hparams\.batch_size"):
            _job(40, hparams={**TINY, "batch_size": -1})  # refused where it is resolved
        with pytest.raises(Faulted, match=r"state\.") as bad:
            worker.run(_job(40, state={"actor.0.weight": torch.zeros(3, 3)}))
        assert bad.value.verdict.fault is Fault.MESSAGE  # judged in the worker process
        worker.probe(_job(40))  # a node's probe: builds, trains nothing, raises nothing
        stop = threading.Event()
        stop.set()  # a stopped pod's round ends at once, and is still evaluated
        short = worker.run(_job(10**9, budget=Budget(seconds=600.0)), should_stop=stop.is_set)
        assert short.result.env_steps < 10**6 and short.result.state is not None
    finally:
        worker.close()


def test_the_replay_cache_bound_is_an_operator_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """``PODRACER_REPLAY_CACHE_MIB`` bounds the pod's replay cache; a bad value names it."""
    monkeypatch.setenv(CACHE_ENV, "64")
    assert default_cache_bytes() == 64 * 2**20
    monkeypatch.setenv(CACHE_ENV, "lots")
    with pytest.raises(ConfigError, match=CACHE_ENV):
        default_cache_bytes()
    monkeypatch.delenv(CACHE_ENV)
    assert 0 < default_cache_bytes() <= 8 * 2**30
