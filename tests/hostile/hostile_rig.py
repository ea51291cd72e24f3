"""A transport under attack: the test's own transport plus a raw sender on the same broker.

Shared by the hostile tests; ``make_rig`` builds one for ``memory://`` or RabbitMQ.
"""

from __future__ import annotations

import dataclasses
import math
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import aio_pika
import pytest
import torch

import broker.core.codec
from broker.core.blobstore import FileBlobStore
from broker.transports.base import Transport
from broker.transports.connect import connect
from broker.transports.memory import MemoryBroker
from tests.hostile.hostile_cases import RawSender

MAX_PEAK_BYTES = 64 * 1024 * 1024
"""Python heap a hostile batch may use at peak (its bodies total about 2.5 MiB)."""


@dataclasses.dataclass
class Rig:
    """The transport a service would use, a raw sender, and the shared blob store."""

    url: str
    experiment: str
    transport: Transport
    sender: RawSender
    blobs: FileBlobStore
    hub: MemoryBroker | None
    channel: aio_pika.abc.AbstractChannel | None

    async def dead_ids(self, queue: str) -> list[str]:
        """Message ids now in ``<queue>.dead`` (read raw; RabbitMQ's are consumed)."""
        full = f"{self.transport.topology.prefix}.{queue}.dead"
        if self.hub is not None:
            return [e.message_id for e in self.hub.queue(full).ready]
        assert self.channel is not None
        dead = await self.channel.get_queue(full)
        ids = []
        while (raw := await dead.get(no_ack=True, fail=False)) is not None:
            ids.append(raw.message_id or "")
        return ids


@asynccontextmanager
async def make_rig(url: str, experiment: str, blob_root: Path) -> AsyncIterator[Rig]:
    """A declared transport of ``experiment`` at ``url`` and a raw sender beside it."""
    hub = MemoryBroker() if url.startswith("memory") else None
    blobs = FileBlobStore(blob_root)
    transport = connect(url, experiment=experiment, blobs=blobs, memory=hub)
    async with transport:
        if hub is not None:
            yield Rig(url, experiment, transport, RawSender(experiment, hub=hub), blobs, hub,
                      None)
            return
        connection = await aio_pika.connect(url)
        try:
            channel = await connection.channel()
            yield Rig(url, experiment, transport, RawSender(experiment, channel=channel), blobs,
                      None, channel)
        finally:
            await connection.close()


class TorchSpy:
    """Stands in for ``torch`` inside ``broker.core.codec`` and records every allocation.

    ``largest`` is the most bytes any ``torch.empty`` / ``torch.frombuffer`` call of the
    decoder asked for, so a test can prove nothing was sized from an unchecked header.
    """

    def __init__(self) -> None:
        self.largest = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    def empty(self, shape: Any, *args: Any, dtype: torch.dtype = torch.float32,
              **kwargs: Any) -> torch.Tensor:
        """``torch.empty``, after noting its size."""
        dims = [shape] if isinstance(shape, int) else list(shape)
        itemsize = torch.empty((), dtype=dtype).element_size()
        self.largest = max(self.largest, math.prod(dims) * itemsize)
        return torch.empty(shape, *args, dtype=dtype, **kwargs)

    def frombuffer(self, buffer: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        """``torch.frombuffer``, after noting the buffer's size."""
        self.largest = max(self.largest, memoryview(buffer).nbytes)
        return torch.frombuffer(buffer, *args, **kwargs)


@contextmanager
def watch_memory(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[TorchSpy, list[int]]]:
    """Spy on the codec's tensor allocations and trace the Python heap's peak.

    Yields the spy and a list that holds the traced peak (bytes) once the block exits.
    """
    spy = TorchSpy()
    monkeypatch.setattr(broker.core.codec, "torch", spy)
    peak: list[int] = []
    tracemalloc.start()
    try:
        yield spy, peak
    finally:
        peak.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        monkeypatch.setattr(broker.core.codec, "torch", torch)
