"""A pod process killed mid-round: its initialization goes to another pod (RabbitMQ)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker.core.blobstore import FileBlobStore
from broker.core.schemas import Budget, Checkpoint, Initialization
from broker.core.settings import default_experiment, write_experiment
from broker.transports.connect import connect

ENV = "torch/Pendulum-v1"
PPO = {"num_envs": 8, "rollout_steps": 16, "hidden_size": 16}


def _start_pod(name: str, url: str, experiment_file: Path, store: Path,
               log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PODRACER_BROKER": url, "PODRACER_POD": name,
           "PODRACER_EXPERIMENT_FILE": str(experiment_file), "PODRACER_STORE": str(store),
           "PODRACER_DEVICE": "cpu", "PODRACER_TORCH_THREADS": "1"}
    with log.open("wb") as fh:
        return subprocess.Popen([sys.executable, "-m", "podracer", "serve", "pod"], env=env,
                                stdout=fh, stderr=subprocess.STDOUT)


def _wait_for(path: Path, text: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return True
        time.sleep(0.2)
    return False


@pytest.mark.rabbitmq
@pytest.mark.timeout(180)
async def test_sigkilled_pod_round_is_redelivered_to_another_pod(
        amqp_url: str, experiment: str, tmp_path: Path) -> None:
    exp = default_experiment(ENV).with_overrides(name=experiment, eval_episodes=4)
    experiment_file = write_experiment(exp, tmp_path / "experiment.json")
    transport = connect(amqp_url, experiment=experiment, blobs=FileBlobStore(tmp_path))
    async with transport:
        init = Initialization(experiment=experiment, algorithm="ppo", env=ENV, hparams=PPO,
                              budget=Budget(seconds=6.0), seed=1)
        first_log, second_log = tmp_path / "pod-1.log", tmp_path / "pod-2.log"
        first = _start_pod("pod-1", amqp_url, experiment_file, tmp_path, first_log)
        try:
            async with transport.subscribe(["metrics.pod-1"]) as metrics:
                await transport.publish("generator", init)
                assert await asyncio.to_thread(_wait_for, first_log, f"round {init.id[:8]}",
                                               60), first_log.read_text()
                await asyncio.wait_for(anext(metrics), 60)  # it reports progress: mid-round
            first.send_signal(signal.SIGKILL)
            first.wait(10)
        finally:
            if first.poll() is None:
                first.kill()
        second = _start_pod("pod-2", amqp_url, experiment_file, tmp_path, second_log)
        try:
            async with transport.consume("updater", prefetch=1, expect=Checkpoint) as inbox:
                delivery = await asyncio.wait_for(anext(inbox), 90)
                checkpoint = delivery.message
                await delivery.ack()
            assert checkpoint.init_id == init.id
            assert checkpoint.pod == "pod-2"
            assert "published" not in first_log.read_text()
            second.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(second.wait, 60) == 0
        finally:
            if second.poll() is None:
                second.kill()
        assert await transport.queue_depth("generator") == (0, 0)
        assert (await transport.queue_depth("generator.dead"))[0] == 0
