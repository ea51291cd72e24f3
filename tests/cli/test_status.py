"""``podracer status`` against a real RabbitMQ, and its broker-free parts."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import torch

from broker.core.schemas import Budget, Heartbeat, Initialization, Metrics
from broker.transports.connect import connect
from podracer.cli import main
from podracer.status_cli import queue_rates

pytestmark = pytest.mark.timeout(60)


def test_status_needs_a_real_broker(capsys: Any) -> None:
    assert main(["status", "--broker", "memory://", "--name", "x"]) == 2
    assert "--broker: status needs a RabbitMQ broker" in capsys.readouterr().err


def test_unreachable_management_api_means_no_rates() -> None:
    assert queue_rates("amqp://guest:guest@127.0.0.1:5672/", "q",
                       management="http://127.0.0.1:9") is None


Seen = list[tuple[str, "str | None"]]


def _management_handler(seen: Seen) -> type[BaseHTTPRequestHandler]:
    """A handler answering GET /api/queues/... like RabbitMQ's management plugin."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append((self.path, self.headers.get("Authorization")))
            body = json.dumps({"name": "q", "message_stats": {
                "publish_details": {"rate": 1.5}, "deliver_get_details": {"rate": 0.25},
                "ack_details": {"rate": 0.2}}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture
def management() -> Iterator[tuple[str, Seen]]:
    seen: Seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _management_handler(seen))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


def test_rates_come_from_the_management_api_with_the_amqp_credentials(
        management: tuple[str, Seen]) -> None:
    url, seen = management
    rates = queue_rates("amqp://alice:s%40cret@127.0.0.1:5672/prod", "podracer.x.generator",
                        management=url)
    assert rates is not None
    assert (rates.publish, rates.deliver, rates.ack) == (1.5, 0.25, 0.2)
    [(path, auth)] = seen
    assert path == "/api/queues/prod/podracer.x.generator"
    assert auth == "Basic " + base64.b64encode(b"alice:s@cret").decode()
    queue_rates("amqp://guest:guest@127.0.0.1:5672/", "q", management=url)
    assert seen[-1][0] == "/api/queues/%2F/q"  # the default vhost "/"


async def _declare_and_fill(url: str, experiment: str) -> None:
    async with connect(url, experiment=experiment) as transport:
        init = Initialization(experiment=experiment, algorithm="ppo", env="torch/Pendulum-v1",
                              hparams={}, budget=Budget(steps=10), seed=0)
        await transport.publish("generator", init)


async def _beat(url: str, experiment: str, stop: threading.Event, ready: threading.Event
                ) -> None:
    async with connect(url, experiment=experiment) as transport:
        ready.set()
        while not stop.is_set():
            beat = Heartbeat(experiment=experiment, pod="pod-test-1", role="pod",
                             status="training ppo", env_steps=1234)
            await transport.publish_event("heartbeat.pod-test-1", beat)
            pool = {"pool/rows": 52000.0, "pool/feed_rows_per_s": 4100.0,
                    "pool/share_of_data": 0.25, "pool/skipped": 7.0, "pool/refused": 95.0}
            await transport.publish_event("metrics.pod-test-1", Metrics(
                experiment=experiment, pod="pod-test-1", values=pool))
            await asyncio.sleep(0.2)


@pytest.mark.rabbitmq
def test_status_shows_queues_heartbeats_and_leaderboard(amqp_url: str, experiment: str,
                                                        tmp_path: Path, capsys: Any) -> None:
    torch.set_num_threads(1)
    asyncio.run(_declare_and_fill(amqp_url, experiment))
    stop, ready = threading.Event(), threading.Event()
    beater = threading.Thread(target=asyncio.run, args=(_beat(amqp_url, experiment, stop, ready),))
    beater.start()
    try:
        assert ready.wait(10)
        code = main(["status", "--broker", amqp_url, "--name", experiment,
                     "--listen", "1.5", "--store", str(tmp_path / "none")])
    finally:
        stop.set()
        beater.join(10)
    out = capsys.readouterr().out
    assert code == 0
    prefix = f"podracer.{experiment}"
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith(prefix)}
    assert set(rows) == {f"{prefix}.{q}" for q in
                         ("generator", "updater", "generator.dead", "updater.dead")}
    assert rows[f"{prefix}.generator"][1:3] == ["1", "0"]  # one ready message, no consumer
    assert rows[f"{prefix}.updater.dead"][1] == "0"
    for row in rows.values():  # rates: numbers from the management API, or n/a
        assert all(re.fullmatch(r"\d+\.\d\d|n/a", cell) for cell in row[3:6]), row
    assert re.search(r"pod-test-1\s+pod\s+training ppo\s+1,234\s+\d+\.\ds ago", out), out
    assert "services heard in 1.5s: 1" in out
    assert re.search(r"pod-test-1\s+52,000\s+4,100\s+25%\s+7\s+95", out), out  # the pool
    assert "(no leaderboard at" in out


@pytest.mark.rabbitmq
def test_status_of_an_undeclared_experiment_says_so(amqp_url: str, experiment: str,
                                                    tmp_path: Path, capsys: Any) -> None:
    code = main(["status", "--broker", amqp_url, "--name", experiment,
                 "--store", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    assert out.count("missing") == 4 and "its services have not started yet" in out


@pytest.mark.rabbitmq
def test_status_json_is_one_document(amqp_url: str, experiment: str, tmp_path: Path,
                                     capsys: Any) -> None:
    asyncio.run(_declare_and_fill(amqp_url, experiment))
    code = main(["status", "--broker", amqp_url, "--name", experiment, "--listen", "0",
                 "--store", str(tmp_path), "--json"])
    data = json.loads(capsys.readouterr().out)  # nothing else on stdout
    assert code == 0
    queues = {q["queue"]: q for q in data["queues"]}
    prefix = f"podracer.{experiment}"
    assert queues[f"{prefix}.generator"]["ready"] == 1
    assert queues[f"{prefix}.generator"]["consumers"] == 0
    assert all(q["declared"] for q in queues.values())
    assert data["experiment"] == experiment and "guest:***@" in data["broker"]
    assert data["services"] == [] and data["leaderboard"] is None
