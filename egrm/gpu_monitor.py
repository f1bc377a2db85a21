"""GPU utilisation and memory through NVML, sampled on a background thread (metrics.py exports it).

NVML calls are blocking C calls that can stall when a driver is unhappy, so a scrape never makes
one: a daemon thread samples every few seconds and a scrape reads the latest snapshot. Without a
GPU or a driver (nvmlInit fails) the monitor stays empty and the service has no GPU series.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger(__name__)


class Nvml(Protocol):
    """The part of `pynvml` (package nvidia-ml-py) the monitor uses; tests pass a stand-in."""

    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...  # .gpu: percent of time busy
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...  # .used, .total: bytes
    def nvmlDeviceGetName(self, handle: Any) -> str | bytes: ...


@dataclass(frozen=True, slots=True)
class GpuReading:
    index: int
    name: str
    utilization_percent: float
    memory_used_bytes: int
    memory_total_bytes: int


def read_gpus(nvml: Nvml) -> list[GpuReading]:
    """One reading of every GPU; a GPU that fails to answer is left out of this reading."""
    samples = []
    for index in range(nvml.nvmlDeviceGetCount()):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            name = nvml.nvmlDeviceGetName(handle)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            samples.append(
                GpuReading(
                    index=index,
                    # Older bindings return bytes, newer ones str.
                    name=name.decode() if isinstance(name, bytes) else name,
                    utilization_percent=float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
                    memory_used_bytes=int(memory.used),
                    memory_total_bytes=int(memory.total),
                )
            )
        except Exception as exc:  # an NVMLError (e.g. GPU lost) must not stop the other GPUs' readings
            log.debug("NVML reading of GPU %d failed: %s", index, exc)
    return samples


class GpuMonitor:
    """Keeps the latest `read_gpus` result, refreshed every `interval_s` by a daemon thread."""

    def __init__(self, interval_s: float = 5.0, nvml: Nvml | None = None):
        self.interval_s = interval_s
        self._nvml = nvml  # None: load pynvml and initialise NVML in start()
        self._owns_nvml = nvml is None
        self._latest: list[GpuReading] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def latest(self) -> list[GpuReading]:
        return self._latest  # replaced whole by the thread, never mutated: no lock needed

    def start(self) -> bool:
        """Take a first reading and start the thread; False (and no series) where NVML is absent."""
        if self.interval_s <= 0:
            return False
        if self._nvml is None:
            self._nvml = _init_pynvml()
            if self._nvml is None:
                return False
        self.read_once()
        self._thread = threading.Thread(target=self._run, name="egrm-gpu-monitor", daemon=True)
        self._thread.start()
        return True

    def read_once(self) -> None:
        assert self._nvml is not None, "start() first"
        try:
            self._latest = read_gpus(self._nvml)
        except Exception as exc:  # nvmlDeviceGetCount failed: publish nothing rather than stale numbers
            log.warning("NVML reading failed: %s", exc)
            self._latest = []

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 5)
            self._thread = None
        if self._owns_nvml and self._nvml is not None:
            import pynvml

            pynvml.nvmlShutdown()
            self._nvml = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.read_once()


def _init_pynvml() -> Nvml | None:
    try:
        import pynvml
    except ImportError:
        log.info("GPU metrics off: nvidia-ml-py is not installed")
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        log.info("GPU metrics off: no NVIDIA driver or GPU (%s)", exc)
        return None
    return pynvml  # the module itself has the protocol's functions
