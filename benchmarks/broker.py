"""Throughput of Podracer's transport + codec versus raw aio-pika, on one RabbitMQ.

Both sides send persistent messages with publisher confirms to a durable quorum queue
(up to ``--window`` publishes in flight), then consume them all with manual acks
(prefetch ``--prefetch``). The raw side sends opaque bytes of the payload size; the
Podracer side sends a ``Checkpoint`` whose tensor payload has that size, through
``encode_message``/``decode_message`` (msgpack + tensor ext, schema validation).
The 4 MiB case is run inline (inline limit raised to 8 MiB) and, separately, through the
claim check (default 4 MiB limit: the body goes to a FileBlobStore in a temp dir, one
blob per message, kept after the ack for the orphan sweep). Cases are interleaved ``--repeat``
times and the best round of each is printed, because a shared machine is noisy.

Authentication (``broker.core.auth``): the Podracer rows sign every message with the
experiment's secret and check it on receipt; the ``no auth`` rows run the same
transport ``insecure`` (no MAC), and the ``vs no auth`` column is the ratio of the two
(targets: 0.9x for 1 KiB messages, 0.95x for 4 MiB checkpoints).

    python benchmarks/broker.py [--url amqp://guest:guest@127.0.0.1:5672/]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

# Run as a script, this file's folder comes first on sys.path and this module would
# shadow the ``broker`` package it measures.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import aio_pika  # noqa: E402
import torch  # noqa: E402

from broker.core.auth import new_secret  # noqa: E402
from broker.core.blobstore import FileBlobStore  # noqa: E402
from broker.core.messages import DEFAULT_INLINE_LIMIT  # noqa: E402
from broker.core.schemas import Checkpoint  # noqa: E402
from broker.core.topology import Topology  # noqa: E402
from broker.transports.connect import connect  # noqa: E402

MIB = 1024 * 1024


@dataclass(frozen=True)
class Result:
    """Seconds to publish and to consume ``count`` messages of ``size`` payload bytes."""

    count: int
    size: int
    publish_s: float
    consume_s: float

    def rate(self) -> tuple[float, float]:
        """(messages/s, MiB/s) over publish + consume."""
        total = self.publish_s + self.consume_s
        return self.count / total, self.count * self.size / MIB / total


async def _windowed(count: int, window: int, send: Callable[[int], Awaitable[None]]) -> None:
    gate = asyncio.Semaphore(window)

    async def one(i: int) -> None:
        async with gate:
            await send(i)

    await asyncio.gather(*(one(i) for i in range(count)))


async def bench_raw(url: str, size: int, count: int, window: int, prefetch: int) -> Result:
    """Raw aio-pika: confirmed persistent publishes, then consume with acks."""
    name = f"podracer.bench-raw-{uuid.uuid4().hex[:6]}.q"
    payload = bytes(size)
    async with await aio_pika.connect_robust(url) as pub, await aio_pika.connect_robust(url) as sub:
        channel = await pub.channel(publisher_confirms=True)
        await channel.declare_queue(name, durable=True, arguments={"x-queue-type": "quorum"})

        async def send(i: int) -> None:
            await channel.default_exchange.publish(
                aio_pika.Message(payload, delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                                 message_id=str(i), content_type="application/octet-stream"),
                routing_key=name)

        start = time.perf_counter()
        await _windowed(count, window, send)
        published = time.perf_counter()
        consume_channel = await sub.channel()
        await consume_channel.set_qos(prefetch_count=prefetch)
        queue = await consume_channel.declare_queue(
            name, durable=True, arguments={"x-queue-type": "quorum"})
        got = 0
        async with queue.iterator() as messages:
            async for message in messages:
                await message.ack()
                got += 1
                if got == count:
                    break
        consumed = time.perf_counter()
        await channel.queue_delete(name)
    return Result(count, size, published - start, consumed - published)


async def bench_podracer(url: str, size: int, count: int, window: int, prefetch: int,
                         inline_limit: int, auth: bool = True) -> Result:
    """Podracer transport: Checkpoint messages through the codec, same pattern; signed
    and checked with a secret when ``auth``, else insecure (no MAC)."""
    experiment = f"bench-{uuid.uuid4().hex[:6]}"
    # one distinct message each (own id, own tensor), as a run sends them: one blob each
    messages = [Checkpoint(experiment=experiment, init_id="i", pod="bench", algorithm="ppo",
                           env="bench", hparams={"lr": 3e-4},
                           state={"w": torch.full((size // 4,), float(i), dtype=torch.float32)},
                           score_mean=0.0, score_std=0.0, env_steps=0, wall_time=0.0)
                for i in range(count)]
    with tempfile.TemporaryDirectory() as root:
        secret = new_secret() if auth else None
        async with connect(url, experiment=experiment, blobs=FileBlobStore(root),
                           inline_limit=inline_limit, secret=secret,
                           insecure=not auth) as transport:

            async def send(i: int) -> None:
                await transport.publish("updater", messages[i])

            start = time.perf_counter()
            await _windowed(count, window, send)
            published = time.perf_counter()
            got = 0
            async with transport.consume("updater", prefetch=prefetch,
                                         expect=Checkpoint) as inbox:
                async for delivery in inbox:
                    await delivery.ack()
                    got += 1
                    if got == count:
                        break
            consumed = time.perf_counter()
        await _delete(url, Topology(experiment))
    return Result(count, size, published - start, consumed - published)


async def _delete(url: str, topology: Topology) -> None:
    async with await aio_pika.connect(url) as connection:
        channel = await connection.channel()
        for name in topology.queues:
            await channel.queue_delete(name)
        for exchange in topology.exchanges:
            await channel.exchange_delete(exchange)


def _row(label: str, result: Result, raw: Result | None, bare: Result | None = None) -> str:
    msgs, mib = result.rate()
    ratio = f"{mib / raw.rate()[1]:.2f}x" if raw is not None else "-"
    auth = f"{mib / bare.rate()[1]:.2f}x" if bare is not None else "-"
    return (f"{label:<34} {result.count:>6} {result.publish_s:>8.2f} {result.consume_s:>8.2f} "
            f"{msgs:>9.0f} {mib:>8.1f} {ratio:>7} {auth:>11}")


async def main() -> None:
    """Run every case once and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="amqp://guest:guest@127.0.0.1:5672/")
    parser.add_argument("--small", type=int, default=3000, help="messages of 1 KiB")
    parser.add_argument("--large", type=int, default=80, help="messages of 4 MiB")
    parser.add_argument("--window", type=int, default=32, help="publishes in flight")
    parser.add_argument("--prefetch", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3,
                        help="interleaved rounds; the best round of each case is shown")
    args = parser.parse_args()
    print(f"{'case':<34} {'msgs':>6} {'pub s':>8} {'cons s':>8} {'msg/s':>9} {'MiB/s':>8} "
          f"{'vs raw':>7} {'vs no auth':>11}")
    for size, count in ((1024, args.small), (4 * MIB, args.large)):
        tag = "1 KiB" if size == 1024 else "4 MiB"
        # a shared machine is noisy: interleave the cases and keep each one's best round
        best: dict[str, Result] = {}
        for _ in range(args.repeat):
            inline = max(DEFAULT_INLINE_LIMIT, 2 * size)
            rounds = {
                "raw": bench_raw(args.url, size, count, args.window, args.prefetch),
                "bare": bench_podracer(args.url, size, count, args.window, args.prefetch,
                                       inline_limit=inline, auth=False),
                "inline": bench_podracer(args.url, size, count, args.window, args.prefetch,
                                         inline_limit=inline),
            }
            if size > 1024:
                rounds["claim bare"] = bench_podracer(
                    args.url, size, count, args.window, args.prefetch,
                    inline_limit=DEFAULT_INLINE_LIMIT, auth=False)
                rounds["claim"] = bench_podracer(args.url, size, count, args.window,
                                                 args.prefetch, inline_limit=DEFAULT_INLINE_LIMIT)
            for key, run in rounds.items():
                result = await run
                if key not in best or result.rate()[0] > best[key].rate()[0]:
                    best[key] = result
        print(_row(f"raw aio-pika {tag}", best["raw"], None))
        print(_row(f"podracer {tag} no auth", best["bare"], best["raw"]))
        print(_row(f"podracer {tag} authenticated", best["inline"], best["raw"], best["bare"]))
        if "claim" in best:
            print(_row(f"podracer {tag} claim check no auth", best["claim bare"], best["raw"]))
            print(_row(f"podracer {tag} claim check auth", best["claim"], best["raw"],
                       best["claim bare"]))


if __name__ == "__main__":
    asyncio.run(main())
