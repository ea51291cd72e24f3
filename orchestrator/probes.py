"""What a node has and how busy it is: CPU and memory from psutil, GPUs from NVML.

A machine without an NVIDIA driver simply reports no GPUs, logged once at debug level:
CPU-only nodes are a normal deployment, not an error. A machine with the driver but
without ``pynvml`` (the ``gpu`` extra, ``nvidia-ml-py``) reports no GPUs too, but says
so in one warning naming the extra: its GPUs would otherwise go uncounted in silence.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol, runtime_checkable

import psutil

from broker.core.errors import ConfigError
from broker.core.extras import MissingExtra, require

log = logging.getLogger(__name__)

NVIDIA_DRIVER = "/proc/driver/nvidia/version"
"""Present on a Linux machine whose NVIDIA kernel driver is loaded."""


@dataclasses.dataclass(frozen=True)
class GpuLoad:
    """One GPU's utilisation; memory in bytes."""

    index: int
    util_percent: float
    mem_used: int
    mem_total: int

    @property
    def mem_percent(self) -> float:
        """Memory in use, in percent of the total."""
        return 100.0 * self.mem_used / self.mem_total if self.mem_total else 0.0


@dataclasses.dataclass(frozen=True)
class NodeLoad:
    """A snapshot of one node's load."""

    node: str
    cpu_percent: float
    """Whole-machine CPU utilisation since the previous reading, 0-100."""
    cpu_count: int
    """Logical CPUs."""
    mem_percent: float
    gpus: list[GpuLoad] = dataclasses.field(default_factory=list)


@runtime_checkable
class Probe(Protocol):
    """Reads a node's current load."""

    def read(self) -> NodeLoad:
        """A fresh snapshot."""
        ...

    def close(self) -> None:
        """Release what the probe holds (idempotent)."""
        ...


def _import_nvml() -> Any:
    """``pynvml``; its absence beside an NVIDIA driver is worth a warning, not only a
    debug line (the ``ImportError`` still means "no GPUs" to the caller)."""
    try:
        return require("pynvml", extra="gpu", purpose="counting this node's GPUs")
    except MissingExtra as exc:
        if Path(NVIDIA_DRIVER).exists():
            log.warning("NVIDIA driver found, GPUs not counted: %s", exc)
        raise ImportError(str(exc)) from None


class NodeProbe:
    """The local machine through psutil and NVML (``import pynvml``).

    ``nvml`` injects the NVML module (tests pass a fake); by default ``pynvml`` is
    imported, and any failure to import or initialise it means "no GPUs".
    """

    def __init__(self, node: str | None = None, nvml: ModuleType | Any | None = None) -> None:
        """Probe this machine, reported as ``node`` (default: the host name)."""
        self.node = node or socket.gethostname()
        self._nvml = self._init_nvml(nvml)
        # CPU percent is measured between two readings; keep our own reference point
        # (psutil.cpu_percent's is shared by the whole process).
        self._last_cpu = psutil.cpu_times()

    @staticmethod
    def _init_nvml(nvml: Any | None) -> Any | None:
        try:
            if nvml is None:
                nvml = _import_nvml()
            nvml.nvmlInit()
        except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, DriverNotLoaded...
            log.debug("no GPUs visible through NVML (%s: %s)", type(exc).__name__, exc)
            return None
        return nvml

    def read(self) -> NodeLoad:
        """CPU, memory and (when NVML works) GPU load right now."""
        return NodeLoad(
            node=self.node,
            cpu_percent=self._cpu_percent(),
            cpu_count=psutil.cpu_count(logical=True) or 1,
            mem_percent=float(psutil.virtual_memory().percent),
            gpus=self._gpus(),
        )

    def _cpu_percent(self) -> float:
        now = psutil.cpu_times()
        before, self._last_cpu = self._last_cpu, now
        total = _total(now) - _total(before)
        idle = _idle(now) - _idle(before)
        if total <= 0:
            return 0.0  # two readings within one clock tick
        return min(100.0, max(0.0, 100.0 * (total - idle) / total))

    def _gpus(self) -> list[GpuLoad]:
        nvml = self._nvml
        if nvml is None:
            return []
        try:
            gpus = []
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                util = nvml.nvmlDeviceGetUtilizationRates(handle)
                mem = nvml.nvmlDeviceGetMemoryInfo(handle)
                gpus.append(GpuLoad(index=index, util_percent=float(util.gpu),
                                    mem_used=int(mem.used), mem_total=int(mem.total)))
        except Exception as exc:  # a driver reset or a GPU falling off the bus
            log.warning("NVML read failed, reporting no GPUs this poll: %s", exc)
            log.debug("NVML failure", exc_info=True)
            return []
        return gpus

    def close(self) -> None:
        """Shut NVML down (idempotent)."""
        nvml, self._nvml = self._nvml, None
        if nvml is not None:
            try:
                nvml.nvmlShutdown()
            except Exception as exc:
                log.debug("nvmlShutdown failed: %s", exc)


def _total(times: Any) -> float:
    # guest time is already counted in user time on Linux
    return float(sum(times)) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)


def _idle(times: Any) -> float:
    return float(times.idle) + getattr(times, "iowait", 0.0)


class FakeProbe:
    """A probe that replays scripted loads (the last one repeats); for tests and demos."""

    def __init__(self, loads: Sequence[NodeLoad]) -> None:
        """Replay ``loads`` in order, one per ``read``."""
        if not loads:
            raise ConfigError("loads", "FakeProbe needs at least one NodeLoad")
        self._loads = list(loads)
        self.reads = 0

    def set(self, load: NodeLoad) -> None:
        """From now on always report ``load`` (an injected load change)."""
        self._loads = [load]
        self.reads = 0

    def read(self) -> NodeLoad:
        """The next scripted load."""
        load = self._loads[min(self.reads, len(self._loads) - 1)]
        self.reads += 1
        return load

    def close(self) -> None:
        """Nothing to release."""


def machine_pods(probe: NodeProbe | None = None) -> int:
    """How many pods this machine runs well: one per GPU, else one per CPU core.

    A pod's round is mostly one Python thread (env stepping, small tensor ops): on a
    CPU a second torch thread per pod adds almost nothing (measured on 2 cores: SAC on
    HalfCheetah 2134 env steps/s with 1 thread, 2013 with 2), while a second pod on the
    other core doubles the work done. So the population fits the cores, one thread each.
    """
    own = probe is None
    probe = probe or NodeProbe()
    try:
        load = probe.read()
    finally:
        if own:
            probe.close()
    return len(load.gpus) or max(1, load.cpu_count)
