"""export_policy / load_policy: file format, actions, ensembles, and bad files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium
import pytest
import torch

import podracer
from broker.core import codec
from broker.core.errors import ConfigError
from broker.core.schemas import Checkpoint
from leaderboard.export import (
    FORMAT,
    Policy,
    PolicyMember,
    export_policy,
    load_policy,
    policy_from_store,
    resolve_entry,
)
from leaderboard.store import LeaderboardStore, short_id
from tests.cli.cli_store import ENV, HPARAMS, ROWS, build_store, make_agent

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def store_root(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("store")
    return root, build_store(root)


def _obs(n: int = 16) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    angle = torch.rand(n, generator=gen) * 6.28 - 3.14
    return torch.stack([angle.cos(), angle.sin(), torch.randn(n, generator=gen)], dim=1)


def test_export_writes_the_documented_codec_format(store_root: Any, tmp_path: Path) -> None:
    root, states = store_root
    with LeaderboardStore(root) as store:
        path = export_policy(store, tmp_path / "best.policy")
    doc = codec.unpack(path.read_bytes())
    assert doc["format"] == FORMAT and doc["version"] == 1 and doc["env"] == ENV
    [member] = doc["members"]
    assert member["id"] == "d1f0000000000000" and member["algorithm"] == "ppo"
    assert member["score_mean"] == -100.0 and member["hparams"]["lr"] == 1e-3
    assert set(member["state"]) == set(states[member["id"]])
    assert all(torch.equal(member["state"][k], v) for k, v in states[member["id"]].items())


def test_loaded_policy_acts_like_the_member_agent(store_root: Any, tmp_path: Path) -> None:
    root, states = store_root
    with LeaderboardStore(root) as store:
        path = export_policy(store, tmp_path / "best.policy")
    policy = podracer.load_policy(path)
    best = ROWS[3]
    agent = make_agent(best.seed, best.lr, state=states[best.id])
    obs = _obs()
    actions = policy(obs)
    assert policy.env == ENV and [m.id for m in policy.members] == [best.id]
    assert actions.shape == (16, 1)
    assert bool(((actions >= -2.0) & (actions <= 2.0)).all())
    with torch.no_grad():
        assert torch.equal(actions, agent.act(obs, True))
    assert torch.equal(policy(obs), actions)  # deterministic


def test_ensemble_of_two_averages_the_members(store_root: Any, tmp_path: Path) -> None:
    root, states = store_root
    with LeaderboardStore(root) as store:
        path = export_policy(store, tmp_path / "top2.policy", top=2)
    policy = load_policy(path)
    assert [m.id for m in policy.members] == [ROWS[3].id, ROWS[1].id]  # best first
    obs = _obs()
    with torch.no_grad():
        first = make_agent(ROWS[3].seed, state=states[ROWS[3].id]).act(obs, True)
        second = make_agent(ROWS[1].seed, state=states[ROWS[1].id]).act(obs, True)
    assert not torch.equal(first, second)
    assert torch.allclose(policy(obs), ((first + second) / 2).clamp(-2.0, 2.0))


def test_export_by_id_prefix_and_policy_from_store(store_root: Any, tmp_path: Path) -> None:
    root, _ = store_root
    with LeaderboardStore(root) as store:
        path = export_policy(store, tmp_path / "c.policy", ids=["a1f1"])
        direct = policy_from_store(store, ["a1f10"])
    loaded = load_policy(path)
    assert [m.id for m in loaded.members] == [ROWS[2].id] == [m.id for m in direct.members]
    obs = _obs()
    assert torch.equal(loaded(obs), direct(obs))


def test_resolve_entry_rejects_unknown_and_ambiguous_prefixes(store_root: Any) -> None:
    root, _ = store_root
    with LeaderboardStore(root) as store:
        assert resolve_entry(store, "b1").id == ROWS[1].id
        with pytest.raises(ConfigError, match="no checkpoint id starts with 'zz'") as unknown:
            resolve_entry(store, "zz", "--id")
        assert unknown.value.field == "--id" and "d1f000000000" in unknown.value.fix
        with pytest.raises(ConfigError, match="'a1f' matches 2 checkpoints") as ambiguous:
            resolve_entry(store, "a1f", "--lineage")
        assert ROWS[0].id in str(ambiguous.value) and ROWS[2].id in str(ambiguous.value)
        assert ambiguous.value.field == "--lineage"



def test_an_id_as_tables_show_it_names_a_round_or_one_of_its_links(tmp_path: Path) -> None:
    # a round that claimed the target trains on: its claim ``<round>.1`` and its own
    # checkpoint ``<round>`` share every prefix of the round's id
    state = make_agent(0).state_dict()
    with LeaderboardStore(tmp_path) as store:
        for i, (cid, parent) in enumerate((("e5a0000000000000.1", None),
                                           ("e5a0000000000000", "e5a0000000000000.1"),
                                           ("f7b0000000000000.1", None))):
            store.insert(Checkpoint(
                id=cid, experiment="clitest", init_id=cid.partition(".")[0], pod="pod-0",
                algorithm="ppo", env=ENV, hparams=dict(HPARAMS), state=state,
                score_mean=-100.0 - i, score_std=1.0, env_steps=1, wall_time=1.0,
                parent_id=parent, generation=i, created=1000.0 + i))
        assert short_id("e5a0000000000000.1") == "e5a000000000.1"
        assert short_id("e5a0000000000000", 8) == "e5a00000"
        assert resolve_entry(store, "e5a").id == "e5a0000000000000"  # the round's own
        assert resolve_entry(store, "e5a000000000.1").id == "e5a0000000000000.1"
        assert resolve_entry(store, "f7b").id == "f7b0000000000000.1"  # its only link
        with pytest.raises(ConfigError, match=r"no checkpoint id starts with 'e5a\.2'"):
            resolve_entry(store, "e5a.2")

class _Fixed:
    """A stand-in agent whose deterministic action is fixed."""

    def __init__(self, actions: list[int]) -> None:
        self.actions = torch.tensor(actions)

    def act(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        return self.actions


def test_discrete_ensemble_takes_a_majority_vote_ties_to_the_best_member() -> None:
    votes = [[0, 1, 2, 3], [1, 1, 0, 3], [2, 0, 0, 1]]
    members = [PolicyMember(f"m{i}", "dqn", {}, -float(i)) for i in range(3)]
    policy = Policy("x", members, [_Fixed(v) for v in votes],  # type: ignore[misc]
                    gymnasium.spaces.Discrete(4), torch.device("cpu"))
    # column 0: a three-way tie -> member 0's action; then clear majorities
    assert policy(torch.zeros(4, 2)).tolist() == [0, 1, 0, 3]


def _write(path: Path, doc: Any) -> Path:
    path.write_bytes(codec.pack(doc))
    return path


@pytest.mark.parametrize(("doc", "field"), [
    ({"format": "other", "version": 1, "env": ENV, "members": []}, "format"),
    ({"format": FORMAT, "version": 2, "env": ENV, "members": []}, "version"),
    ({"format": FORMAT, "version": 1, "env": ENV, "members": []}, "members"),
    ({"format": FORMAT, "version": 1, "env": ENV,
      "members": [{"id": "x", "algorithm": "ppo", "hparams": {}, "score_mean": 1.0,
                   "state": {}}]}, "members[0].state"),
    ([1, 2, 3], "path"),
])
def test_bad_documents_raise_config_error_naming_the_field(tmp_path: Path, doc: Any,
                                                           field: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_policy(_write(tmp_path / "bad.policy", doc))
    assert err.value.field == field


def test_garbage_missing_and_misfitting_files_raise_config_error(store_root: Any,
                                                                  tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.policy"
    garbage.write_bytes(b"\x80\x04not msgpack at all \xc1")
    with pytest.raises(ConfigError, match="not a podracer policy file"):
        load_policy(garbage)
    with pytest.raises(ConfigError, match="cannot read"):
        load_policy(tmp_path / "missing.policy")
    root, _ = store_root
    with LeaderboardStore(root) as store:
        path = export_policy(store, tmp_path / "ok.policy")
    doc = codec.unpack(path.read_bytes())
    doc["members"][0]["hparams"]["hidden_size"] = 32  # the state no longer fits the net
    with pytest.raises(ConfigError) as err:
        load_policy(_write(tmp_path / "misfit.policy", doc))
    assert err.value.field.startswith("members[0] (d1f000000000).state")
