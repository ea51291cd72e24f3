"""Metadata is range-checked at decode (issue 22, items 2 and 6): every refusal names the
field, is one short line (it becomes a log line and an ``x-podracer-reason`` header),
and never echoes a hostile key or value unbounded."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from broker.core.errors import SchemaError
from broker.core.fields import MAX_COUNT
from broker.core.schemas import Budget, Checkpoint, Initialization, Stop, from_wire

EXP = "bounds"


def checkpoint_wire(**changes: Any) -> dict[str, Any]:
    wire = Checkpoint(experiment=EXP, init_id="i", pod="pod", algorithm="ppo", env="e",
                      hparams={"lr": 3e-4}, state={"w": torch.zeros(2)}, score_mean=-1.0,
                      score_std=0.5, env_steps=64, wall_time=1.0).to_wire()
    return {**wire, **changes}


@pytest.mark.parametrize(("changes", "field"), [
    ({"env_steps": 2**62}, "env_steps"),
    ({"env_steps": MAX_COUNT + 1}, "env_steps"),
    ({"env_steps": -1}, "env_steps"),
    ({"generation": -1}, "generation"),
    ({"generation": 2**62}, "generation"),
    ({"created": 1e300}, "created"),
    ({"created": -5.0}, "created"),
    ({"wall_time": -1.0}, "wall_time"),
    ({"wall_time": 1e300}, "wall_time"),
    ({"score_mean": 1e308}, "score_mean"),
    ({"score_std": -1e300}, "score_std"),
    ({"curve": [[1.0, 0.0, -3]]}, "curve"),
    ({"hparams": {"lr\nERROR forged line": 1.0}}, "hparams"),
    ({"hparams": {"k" * (1 << 20): 1.0}}, "hparams"),
    ({"hparams": {"act": "tanh\nERROR"}}, "hparams"),
    ({"hparams": {f"k{i}": i for i in range(2000)}}, "hparams"),
    ({"state": {"w\nERROR": torch.zeros(1)}}, "state"),
    ({"env": "e\nERROR forged"}, "env"),
    ({"algorithm": "a" * 5000}, "algorithm"),
])
def test_out_of_range_metadata_is_refused_in_one_short_line(
    changes: dict[str, Any], field: str,
) -> None:
    with pytest.raises(SchemaError) as refused:
        from_wire(checkpoint_wire(**changes), expect=Checkpoint)
    reason = str(refused.value)
    assert reason.startswith(f"{field}: ") and "\n" not in reason and len(reason) < 400
    assert "ERROR" not in reason and "kkkk" not in reason


def test_the_largest_honest_values_still_decode() -> None:
    cp = from_wire(checkpoint_wire(env_steps=MAX_COUNT, generation=10**6, wall_time=3600.0,
                                   hparams={"a.b-c/d_e": "x" * 256}), expect=Checkpoint)
    assert cp.env_steps == MAX_COUNT


def test_initialization_and_stop_are_bounded_too() -> None:
    init = Initialization(experiment=EXP, algorithm="ppo", env="e", hparams={},
                          budget=Budget(steps=1), seed=0).to_wire()
    for bad in ({"generation": -1}, {"budget": {"steps": 2**62, "seconds": None}},
                {"hparams": {"a b": 1}}, {"pooled": 1}, {"pooled": "false"}):
        with pytest.raises(SchemaError, match=next(iter(bad))):
            from_wire({**init, **bad}, expect=Initialization)
    # a build without ``pooled`` feeds the round from the pool: optional within 2
    assert from_wire({k: v for k, v in init.items() if k != "pooled"},
                     expect=Initialization).pooled is True
    assert from_wire({**init, "pooled": False}, expect=Initialization).pooled is False
    stop = Stop(experiment=EXP, reason="x").to_wire()
    with pytest.raises(SchemaError, match="reason"):
        from_wire({**stop, "reason": "over\nCRITICAL forged"}, expect=Stop)


def test_an_unforeseen_failure_inside_validation_is_still_a_schema_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``from_wire`` is total: a check that raises something else is the message's fault."""
    import broker.core.schemas as schemas

    def broken(data: Any, name: str) -> Any:
        raise RuntimeError("Stride calculation overflowed\nsecond line")

    monkeypatch.setattr(schemas, "_budget", broken)
    init = Initialization(experiment=EXP, algorithm="ppo", env="e", hparams={},
                          budget=Budget(steps=1), seed=0).to_wire()
    with pytest.raises(SchemaError, match=r"RuntimeError: Stride calculation overflowed$"):
        from_wire(init, expect=Initialization)
