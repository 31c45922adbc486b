"""GPU samples through NVML (nvidia-ml-py): memory, utilisation, temperature, power, processes.

On a node this is the NVIDIA driver's libnvidia-ml.so.1; in tests the project's mock NVML
(native/build/mock on LD_LIBRARY_PATH). Memory and the process list are required; an optional
field the library or the GPU does not support (NotSupported, FunctionNotFound) is None and the
matching series is left out, instead of failing the scrape.
"""

from __future__ import annotations

import threading
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
    # pid → SM utilisation ratio over the last interval; None when NVML cannot say per process.
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
        with self._lock:
            return [self._sample(*device) for device in self._devices]

    def _sample(self, index: int, uuid: str, name: str, handle: Any) -> GpuSample:
        try:
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            processes = tuple(
                GpuProcess(int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory))
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            )
            total, used, responding = int(memory.total), int(memory.used), True
        except pynvml.NVMLError:
            total, used, responding, processes = 0, 0, False, ()
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
        if not self._per_process_utilization:
            return None
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(
                handle, self._last_seen_us.get(index, 0)
            )
        except pynvml.NVMLError_NotFound:
            return {}  # no process ran a kernel since the last sample
        except (pynvml.NVMLError_FunctionNotFound, pynvml.NVMLError_NotSupported):
            self._per_process_utilization = False  # never will; stop asking
            return None
        except pynvml.NVMLError:
            return None
        result: dict[int, float] = {}
        for item in samples:
            result[int(item.pid)] = max(result.get(int(item.pid), 0.0), item.smUtil / 100)
            self._last_seen_us[index] = max(self._last_seen_us.get(index, 0), item.timeStamp)
        return result
