"""GPU samples through NVML (nvidia-ml-py): memory, utilisation, temperature, power, processes.

On a node this is the NVIDIA driver's libnvidia-ml.so.1; in tests the project's mock NVML
(native/build/mock on LD_LIBRARY_PATH). Memory and the process list are required; an optional
field the library or the GPU does not support (NotSupported, FunctionNotFound) is None and the
matching series is left out, instead of failing the scrape.

Per-process SM utilisation (``nvmlDeviceGetProcessUtilization``) is asked for the period since
the previous ``sample()``: each device's query passes the newest sample timestamp it saw last
time as ``lastSeenTimeStamp``, so the scrapes (the only callers of ``sample()``; the watchdog
uses ``sample_memory()``) partition the time between them.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import pynvml


class NvmlError(RuntimeError):
    """NVML could not be used at all (no library, no driver); one line."""


@dataclass(frozen=True, slots=True)
class GpuProcess:
    pid: int  # in the node's (NVML's) pid namespace
    used_bytes: int | None  # None: the driver does not say


@dataclass(frozen=True, slots=True)
class GpuSample:
    index: int
    uuid: str
    name: str
    responding: bool  # False: the memory or process query failed (a lost GPU)
    memory_total_bytes: int
    memory_used_bytes: int
    utilization_ratio: float | None
    temperature_celsius: float | None
    power_watts: float | None
    processes: tuple[GpuProcess, ...]
    # pid → SM utilisation ratio since the previous sample() ({}: no process ran a kernel);
    # None when NVML cannot say per process (then the GPU's utilisation is all there is).
    process_utilization: dict[int, float] | None = None


def _optional(call: Any, *args: Any) -> Any:
    try:
        return call(*args)
    except pynvml.NVMLError:
        return None


class NvmlSource:
    """The node's GPUs; ``sample()`` queries them. One lock: NVML calls are serialised."""

    def __init__(self) -> None:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as error:
            raise NvmlError(f"NVML: cannot initialise: {error}") from None
        self._lock = threading.Lock()
        self._per_process_utilization = True
        self._last_seen_us: dict[int, int] = {}
        try:
            count = pynvml.nvmlDeviceGetCount()
            self._devices = []
            for index in range(count):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = pynvml.nvmlDeviceGetUUID(handle)
                name = pynvml.nvmlDeviceGetName(handle)
                self._devices.append((index, uuid, name, handle))
        except pynvml.NVMLError as error:
            pynvml.nvmlShutdown()
            raise NvmlError(f"NVML: cannot list the GPUs: {error}") from None

    @property
    def uuids(self) -> list[str]:
        return [uuid for _, uuid, _, _ in self._devices]

    def close(self) -> None:
        pynvml.nvmlShutdown()

    def sample(self) -> list[GpuSample]:
        """Every field, per-process utilisation over the period since the previous call."""
        with self._lock:
            return [self._sample(*device) for device in self._devices]

    def sample_memory(self) -> list[GpuSample]:
        """Memory and processes only (the watchdog's look): fewer NVML calls, and the period
        of ``sample()``'s per-process utilisation is left alone."""
        with self._lock:
            return [self._sample(*device, full=False) for device in self._devices]

    def _sample(
        self, index: int, uuid: str, name: str, handle: Any, full: bool = True
    ) -> GpuSample:
        try:
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            processes = tuple(
                GpuProcess(int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory))
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            )
            total, used, responding = int(memory.total), int(memory.used), True
        except pynvml.NVMLError:
            total, used, responding, processes = 0, 0, False, ()
        if not full:
            return GpuSample(
                index, uuid, name, responding, total, used, None, None, None, processes
            )
        rates = _optional(pynvml.nvmlDeviceGetUtilizationRates, handle)
        temperature = _optional(
            pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU
        )
        milliwatts = _optional(pynvml.nvmlDeviceGetPowerUsage, handle)
        return GpuSample(
            index=index,
            uuid=uuid,
            name=name,
            responding=responding,
            memory_total_bytes=total,
            memory_used_bytes=used,
            utilization_ratio=None if rates is None else rates.gpu / 100,
            temperature_celsius=None if temperature is None else float(temperature),
            power_watts=None if milliwatts is None else milliwatts / 1000,
            processes=processes,
            process_utilization=self._process_utilization(index, handle),
        )

    def _process_utilization(self, index: int, handle: Any) -> dict[int, float] | None:
        """pid → SM utilisation ratio since the previous call for this device ({}: no process
        ran); None when the driver cannot say per process (never: stop asking) or failed."""
        if not self._per_process_utilization:
            return None
        since = self._last_seen_us.get(index, 0)
        asked_us = time.time_ns() // 1000  # NVML's timestamps: CPU time, microseconds
        samples = None
        for _ in range(3):  # a process that appears between nvidia-ml-py's size query and read
            try:
                samples = pynvml.nvmlDeviceGetProcessUtilization(handle, since)
                break
            except pynvml.NVMLError_InsufficientSize:
                continue
            except pynvml.NVMLError_NotFound:
                # No sample newer than `since` up to now: nobody ran; the next period starts here.
                self._last_seen_us[index] = max(since, asked_us)
                return {}
            except (pynvml.NVMLError_FunctionNotFound, pynvml.NVMLError_NotSupported):
                self._per_process_utilization = False
                return None
            except pynvml.NVMLError:
                return None
        if samples is None:
            return None
        shares: dict[int, list[float]] = {}
        latest = since
        for item in samples:
            shares.setdefault(int(item.pid), []).append(item.smUtil / 100)
            latest = max(latest, int(item.timeStamp))
        self._last_seen_us[index] = latest
        # One sample per process is the rule; should a driver give several (equal periods),
        # their mean is the process's share of the period.
        return {pid: sum(values) / len(values) for pid, values in shares.items()}
