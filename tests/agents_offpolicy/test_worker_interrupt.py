"""Ctrl-C reaches the round worker process too (the terminal signals its whole process
group); the worker must not die of it (issue 23: "round worker process died (exit code
None)" on every Ctrl-C): its pod decides how the round ends."""

from __future__ import annotations

import os
import signal

import pytest

from agents.build import resolve
from agents.pod.runner import ProcessWorker, RoundJob, RunnerConfig
from agents.registry import default_registry
from broker.core.schemas import Budget
from envs.registry import make_env

pytestmark = pytest.mark.timeout(120)

JOB = RoundJob(resolved=resolve(default_registry(), "ppo", {
    "num_envs": 4, "rollout_steps": 8, "num_minibatches": 2, "update_epochs": 1,
    "hidden_size": 8}), env="torch/Pendulum-v1", seed=0, budget=Budget(steps=64))


def test_sigint_does_not_kill_the_round_worker() -> None:
    worker = ProcessWorker(default_registry(),
                           RunnerConfig(eval_episodes=2, eval_every_s=None, torch_threads=1),
                           make_env)
    try:
        worker.run(JOB)  # the child is serving jobs now
        pid = worker._proc.pid
        os.kill(pid, signal.SIGINT)
        output = worker.run(JOB)
        assert worker._proc.pid == pid  # the same process: not died and restarted
        assert output.result.state is not None and output.result.env_steps > 0
    finally:
        worker.close()
