"""Replay buffer: ring wraparound, batched insert, seeded sampling, state round trip."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from agents.replay import ReplayBuffer, store_step
from broker.core.errors import ConfigError

pytestmark = pytest.mark.timeout(30)


def _rows(start: int, n: int) -> tuple[torch.Tensor, ...]:
    """n transitions whose every field encodes its global index."""
    ids = torch.arange(start, start + n, dtype=torch.float32)
    obs = ids.unsqueeze(1).repeat(1, 3)
    return obs, ids.unsqueeze(1), ids, obs + 0.5, ids % 2 == 0


def _buffer(capacity: int) -> ReplayBuffer:
    return ReplayBuffer(capacity, (3,), (1,), torch.device("cpu"))


def test_batched_insert_wraps_around_and_keeps_the_newest() -> None:
    buf = _buffer(10)
    buf.add(*_rows(0, 4))
    buf.add(*_rows(4, 4))
    assert (len(buf), buf.pos) == (8, 8)
    buf.add(*_rows(8, 5))  # 2 rows fill the tail, 3 overwrite the head
    assert (len(buf), buf.pos) == (10, 3)
    assert buf.reward.tolist() == [10, 11, 12, 3, 4, 5, 6, 7, 8, 9]
    assert torch.equal(buf.next_obs[:, 0], buf.reward + 0.5)
    assert buf.done.tolist() == [1.0 if i % 2 == 0 else 0.0 for i in buf.reward.tolist()]


def test_insert_larger_than_capacity_keeps_only_the_last_rows() -> None:
    buf = _buffer(4)
    buf.add(*_rows(0, 7))
    assert len(buf) == 4
    assert sorted(buf.reward.tolist()) == [3, 4, 5, 6]


def test_sampling_is_seeded_and_only_reads_filled_rows() -> None:
    buf = _buffer(100)
    buf.add(*_rows(0, 5))
    a = buf.sample(64, torch.Generator().manual_seed(7))
    b = buf.sample(64, torch.Generator().manual_seed(7))
    assert torch.equal(a.reward, b.reward)
    assert set(a.reward.tolist()) <= {0.0, 1.0, 2.0, 3.0, 4.0}
    assert len(set(a.reward.tolist())) > 1
    # a sampled row stays one transition: its fields agree
    assert torch.equal(a.obs[:, 0], a.reward) and torch.equal(a.action[:, 0], a.reward)


def test_sampling_an_empty_buffer_fails() -> None:
    with pytest.raises(RuntimeError):
        _buffer(3).sample(1, torch.Generator())


def test_state_dict_round_trip_preserves_order_and_position() -> None:
    buf = _buffer(6)
    buf.add(*_rows(0, 8))
    copy = _buffer(6)
    copy.load_state_dict(buf.state_dict())
    assert (len(copy), copy.pos) == (len(buf), buf.pos)
    copy.add(*_rows(8, 1))
    buf.add(*_rows(8, 1))
    assert torch.equal(copy.reward, buf.reward)


def test_state_dict_too_big_for_capacity_names_the_field() -> None:
    buf = _buffer(6)
    buf.add(*_rows(0, 6))
    with pytest.raises(ConfigError, match=r"replay\.obs"):
        _buffer(3).load_state_dict(buf.state_dict())


class _TruncatingEnv:
    """Two copies; copy 0 truncates on every step, copy 1 terminates on every step."""

    num_envs = 2

    def step(self, action: torch.Tensor) -> tuple[Any, ...]:
        reset_obs = torch.zeros(2, 3)
        final = torch.full((2, 3), 9.0)
        return (reset_obs, torch.ones(2), torch.tensor([False, True]),
                torch.tensor([True, False]), {"final_obs": final})


def test_store_step_keeps_final_obs_and_masks_only_termination() -> None:
    buf = _buffer(4)
    obs = torch.ones(2, 3)
    next_obs, _reward, ended = store_step(_TruncatingEnv(), buf, obs,  # type: ignore[arg-type]
                                         torch.zeros(2, 1))
    assert torch.equal(next_obs, torch.zeros(2, 3))  # the agent continues from the reset obs
    assert torch.equal(buf.next_obs[:2], torch.full((2, 3), 9.0))  # ...but learns from final
    assert buf.done[:2].tolist() == [0.0, 1.0]  # truncation bootstraps, termination does not
    assert ended.tolist() == [True, True]


def test_loading_into_a_bigger_ring_appends_after_the_saved_rows() -> None:
    small = _buffer(4)
    small.add(*_rows(0, 6))  # full ring, pos 2
    big = _buffer(8)
    big.load_state_dict(small.state_dict())
    big.add(*_rows(6, 2))
    assert (len(big), big.pos) == (6, 6)
    assert sorted(big.reward[:6].tolist()) == [2, 3, 4, 5, 6, 7]
