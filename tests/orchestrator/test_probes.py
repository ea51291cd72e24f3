"""Node probes: psutil on this machine, NVML through an injected fake, the fake probe."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

import pytest

from broker.core.errors import ConfigError
from orchestrator import probes
from orchestrator.probes import FakeProbe, GpuLoad, NodeLoad, NodeProbe, Probe


class FakeNvml:
    """The slice of the pynvml API NodeProbe uses, with two GPUs."""

    def __init__(self, fail_on_read: bool = False) -> None:
        self.fail_on_read = fail_on_read
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        if self.fail_on_read:
            raise RuntimeError("GPU has fallen off the bus")
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        return SimpleNamespace(gpu=30 + 10 * handle, memory=5)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        return SimpleNamespace(used=(handle + 1) * 2**30, total=8 * 2**30, free=0)


class BrokenNvml(FakeNvml):
    def nvmlInit(self) -> None:
        raise OSError("NVML Shared Library Not Found")


def test_this_machine_without_a_gpu_driver(caplog: pytest.LogCaptureFixture) -> None:
    """No NVIDIA driver here (or a broken one injected): no GPUs, one debug line."""
    caplog.set_level(logging.DEBUG, logger="orchestrator.probes")
    probe = NodeProbe(node="n1", nvml=BrokenNvml())
    first, second = probe.read(), probe.read()
    probe.close()
    assert first.gpus == [] and second.gpus == []
    assert [r.levelno for r in caplog.records] == [logging.DEBUG]
    assert first.node == "n1" and first.cpu_count >= 1
    assert 0.0 <= first.cpu_percent <= 100.0 and 0.0 < first.mem_percent <= 100.0


def test_default_probe_never_crashes() -> None:
    probe = NodeProbe()
    load = probe.read()
    probe.close()
    probe.close()
    assert load.node and isinstance(load.gpus, list)
    assert all(isinstance(g, GpuLoad) for g in load.gpus)


def test_gpus_read_through_nvml() -> None:
    nvml = FakeNvml()
    probe = NodeProbe(node="gpu-node", nvml=nvml)
    gpus = probe.read().gpus
    probe.close()
    assert gpus == [GpuLoad(0, 30.0, 2**30, 8 * 2**30), GpuLoad(1, 40.0, 2**31, 8 * 2**30)]
    assert gpus[1].mem_percent == 25.0
    assert nvml.shutdowns == 1


def test_nvml_failing_mid_run_reports_no_gpus(caplog: pytest.LogCaptureFixture) -> None:
    probe = NodeProbe(node="n", nvml=FakeNvml(fail_on_read=True))
    assert probe.read().gpus == []
    assert any("NVML read failed" in r.getMessage() for r in caplog.records)


def test_fake_probe_replays_then_repeats_the_last() -> None:
    a = NodeLoad("n", 10.0, 4, 20.0)
    b = NodeLoad("n", 90.0, 4, 20.0)
    probe = FakeProbe([a, b])
    assert isinstance(probe, Probe) and isinstance(NodeProbe(nvml=BrokenNvml()), Probe)
    assert [probe.read() for _ in range(3)] == [a, b, b]
    probe.set(a)
    assert probe.read() == a
    with pytest.raises(ConfigError, match="loads"):
        FakeProbe([])


class Times(NamedTuple):
    """A psutil ``scputimes`` look-alike (sum() over fields, attribute access)."""

    user: float
    system: float
    idle: float
    iowait: float


def test_cpu_percent_between_two_readings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Busy share of the CPU time elapsed since the previous reading (iowait is idle)."""
    times = iter([Times(10.0, 5.0, 80.0, 5.0),
                  Times(16.0, 6.0, 82.0, 6.0),  # 7 busy of 10 seconds
                  Times(16.0, 6.0, 82.0, 6.0)])  # no time passed
    monkeypatch.setattr("orchestrator.probes.psutil.cpu_times", lambda: next(times))
    probe = NodeProbe(node="n", nvml=BrokenNvml())
    assert probe.read().cpu_percent == pytest.approx(70.0)
    assert probe.read().cpu_percent == 0.0


@pytest.mark.parametrize("driver", [True, False])
def test_without_nvidia_ml_py_no_gpus_and_a_warning_only_beside_a_driver(
        driver: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # what an import finds uninstalled
    version = tmp_path / "version"
    if driver:
        version.write_text("NVRM version: 550\n")
    monkeypatch.setattr(probes, "NVIDIA_DRIVER", str(version))
    with caplog.at_level(logging.DEBUG, logger="orchestrator.probes"):
        probe = NodeProbe("n1")
    assert probe.read().gpus == []
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    if driver:
        assert len(warnings) == 1 and "pip install 'podracer[gpu]'" in warnings[0], warnings
    else:
        assert warnings == []
    probe.close()
