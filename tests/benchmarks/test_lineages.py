"""The lineages benchmark's configurations and table (no run: synthetic results)."""

from __future__ import annotations

from benchmarks.lineages import CONFIGS, table
from benchmarks.tournament import TASKS
from benchmarks.tournament_runs import RunResult


def test_the_configs_change_one_thing_each_and_the_table_compares_them_to_the_default(
        ) -> None:
    assert CONFIGS["default"].overrides == {} and CONFIGS["default"].threads is None
    assert [CONFIGS[f"members-{n}"].overrides for n in (1, 2, 3)] == [
        {"population.members": n} for n in (1, 2, 3)]
    assert (CONFIGS["timeshare"].overrides, CONFIGS["timeshare"].threads) == ({"pods": 1}, 2)
    assert "1 pod(s) x 2 thread(s)" in CONFIGS["timeshare"].describe()
    runs = [RunResult("pendulum", "default", 0, time_to_target=10.0, env_steps=1000, wall=10.0),
            RunResult("pendulum", "default", 1, time_to_target=20.0, env_steps=1000, wall=10.0),
            RunResult("pendulum", "timeshare", 0, time_to_target=30.0, env_steps=500,
                      wall=10.0),
            RunResult("pendulum", "timeshare", 1, env_steps=500, wall=60.0)]  # a miss
    text = table(TASKS["pendulum"], 60.0, [CONFIGS["default"], CONFIGS["timeshare"]], runs)
    default = next(line for line in text.splitlines() if line.startswith("default "))
    timeshare = next(line for line in text.splitlines() if line.startswith("timeshare "))
    assert "15.0 ± 7.1" in default and "2/2" in default and "1.00" in default.split()
    # a miss counts as the cap: (30 + 60) / 2 = 45, three times the default's 15
    assert ">= 45.0 ± 21.2" in timeshare and "1/2" in timeshare and "3.00" in timeshare
    assert "timeshare    s0 30.0, s1 miss" in text
