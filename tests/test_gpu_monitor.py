"""The NVML monitor and its /metrics series. No GPU here: NVML itself is the one stand-in.

`FakeNvml` answers with pynvml's own return types (the ctypes structs `c_nvmlUtilization_t`
and `c_nvmlMemory_t`, and `NVMLError` subclasses), as nvidia-ml-py's pynvml.py defines them.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pynvml
import pytest

from egrm.gpu_monitor import GpuMonitor, GpuReading, read_gpus
from egrm.metrics import Metrics

GIB = 1024**3


class FakeNvml:
    """Two GPUs; `lost` holds the indices whose calls fail as a fallen-off-the-bus GPU does."""

    def __init__(self) -> None:
        self.util = {0: 87, 1: 5}
        self.used = {0: 60 * GIB, 1: 1 * GIB}
        self.lost: set[int] = set()

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index in self.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return index

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> pynvml.c_nvmlUtilization_t:
        return pynvml.c_nvmlUtilization_t(gpu=self.util[handle], memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> pynvml.c_nvmlMemory_t:
        total = 141 * GIB
        return pynvml.c_nvmlMemory_t(total=total, free=total - self.used[handle], used=self.used[handle])

    def nvmlDeviceGetName(self, handle: int) -> str | bytes:
        return "NVIDIA H200" if handle == 0 else b"NVIDIA H200"  # older bindings return bytes


def samples(exposition: bytes) -> dict[str, float]:
    """`name{labels}` -> value of every sample line of a Prometheus text exposition."""
    lines = exposition.decode().splitlines()
    return {key: float(value) for key, value in (ln.rsplit(" ", 1) for ln in lines if not ln.startswith("#"))}


def test_read_gpus_reads_every_device():
    assert read_gpus(FakeNvml()) == [
        GpuReading(0, "NVIDIA H200", 87.0, 60 * GIB, 141 * GIB),
        GpuReading(1, "NVIDIA H200", 5.0, 1 * GIB, 141 * GIB),
    ]


def test_a_lost_gpu_is_left_out_and_the_others_still_read():
    nvml = FakeNvml()
    nvml.lost = {0}
    assert [g.index for g in read_gpus(nvml)] == [1]


def test_metrics_export_the_latest_reading_labelled_by_index_and_name():
    nvml = FakeNvml()
    monitor = GpuMonitor(interval_s=3600, nvml=nvml)  # the thread never fires: readings by hand
    metrics = Metrics()
    metrics.watch_gpus(monitor.latest)
    try:
        assert monitor.start()
        first = samples(metrics.render())
        assert first['egrm_gpu_utilization_percent{gpu="0",name="NVIDIA H200"}'] == 87
        assert first['egrm_gpu_memory_used_bytes{gpu="1",name="NVIDIA H200"}'] == GIB
        assert first['egrm_gpu_memory_total_bytes{gpu="0",name="NVIDIA H200"}'] == 141 * GIB
        nvml.util[0] = 12
        assert samples(metrics.render())['egrm_gpu_utilization_percent{gpu="0",name="NVIDIA H200"}'] == 87
        monitor.read_once()  # a scrape shows what the monitor last read, never calls NVML itself
        assert samples(metrics.render())['egrm_gpu_utilization_percent{gpu="0",name="NVIDIA H200"}'] == 12
    finally:
        monitor.close()


def test_the_background_thread_refreshes_the_reading():
    nvml = FakeNvml()
    monitor = GpuMonitor(interval_s=0.01, nvml=nvml)
    try:
        monitor.start()
        nvml.util[1] = 99
        deadline = time.monotonic() + 30
        while monitor.latest()[1].utilization_percent != 99 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert monitor.latest()[1].utilization_percent == 99
    finally:
        monitor.close()
    assert not any(t.name == "egrm-gpu-monitor" for t in threading.enumerate())


def test_a_failed_device_count_publishes_nothing_rather_than_stale_numbers():
    nvml = FakeNvml()
    monitor = GpuMonitor(interval_s=3600, nvml=nvml)
    try:
        monitor.start()
        assert len(monitor.latest()) == 2

        def fail() -> int:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

        nvml.nvmlDeviceGetCount = fail  # type: ignore[method-assign]
        monitor.read_once()
        assert monitor.latest() == []
        metrics = Metrics()
        metrics.watch_gpus(monitor.latest)
        assert "egrm_gpu" not in metrics.render().decode()
    finally:
        monitor.close()


def test_interval_zero_turns_the_monitor_off():
    monitor = GpuMonitor(interval_s=0, nvml=FakeNvml())
    assert monitor.start() is False and monitor.latest() == []
    monitor.close()


def test_real_nvml_without_a_gpu_gives_no_series_and_logs_once(caplog):
    # The machine's own word, not NVML's: an NVIDIA driver makes this device node. Without it (this
    # project's CI), no series and one log line; on a GPU machine the same path must find the GPUs.
    has_gpu = Path("/dev/nvidiactl").exists()
    caplog.set_level(logging.INFO, logger="egrm.gpu_monitor")
    monitor = GpuMonitor(interval_s=5)
    metrics = Metrics()
    metrics.watch_gpus(monitor.latest)
    try:
        started = monitor.start()
        assert started == has_gpu
        assert ("egrm_gpu_utilization_percent" in metrics.render().decode()) == has_gpu
        if not started:
            assert [r.getMessage() for r in caplog.records if "GPU metrics off" in r.getMessage()] == [
                f"GPU metrics off: no NVIDIA driver or GPU ({_init_error()})"
            ]
    finally:
        monitor.close()


def _init_error() -> str:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return str(exc)
    pytest.fail("NVML initialised")
