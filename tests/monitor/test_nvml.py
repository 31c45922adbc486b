"""NvmlSource's per-process utilisation against a scripted nvidia-ml-py: the period since the
previous sample, NOT_FOUND as idle, and the fallback when the driver cannot say per process.
(The mock NVML's answers are tested in tests/native and through the agent in
test_node_agent.py; here the driver's other answers are scripted.)"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from gpushare.monitor.nvml import NvmlSource


def sample(pid: int, time_stamp: int, sm_util: int) -> SimpleNamespace:
    return SimpleNamespace(pid=pid, timeStamp=time_stamp, smUtil=sm_util, memUtil=0)


def error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)  # nvidia-ml-py returns the code's subclass


class FakeNvml:
    """One GPU; each nvmlDeviceGetProcessUtilization call takes the next scripted answer (a
    list of samples, or an NVMLError to raise) and records the timestamp it was asked with."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, answers: list[Any]) -> None:
        self.answers = list(answers)
        self.asked: list[int] = []
        self.rates_asked = 0
        calls: dict[str, Callable[..., Any]] = {
            "nvmlInit": lambda: None,
            "nvmlShutdown": lambda: None,
            "nvmlDeviceGetCount": lambda: 1,
            "nvmlDeviceGetHandleByIndex": lambda index: f"handle{index}",
            "nvmlDeviceGetUUID": lambda handle: "GPU-0",
            "nvmlDeviceGetName": lambda handle: "NVIDIA H200",
            "nvmlDeviceGetMemoryInfo": lambda handle: SimpleNamespace(total=100, used=10),
            "nvmlDeviceGetComputeRunningProcesses": lambda handle: [
                SimpleNamespace(pid=1, usedGpuMemory=10)
            ],
            "nvmlDeviceGetUtilizationRates": self._rates,
            "nvmlDeviceGetTemperature": lambda handle, sensor: 45,
            "nvmlDeviceGetPowerUsage": lambda handle: 120000,
            "nvmlDeviceGetProcessUtilization": self._process_utilization,
        }
        for name, call in calls.items():
            monkeypatch.setattr(pynvml, name, call)

    def _rates(self, handle: str) -> SimpleNamespace:
        self.rates_asked += 1
        return SimpleNamespace(gpu=50, memory=0)

    def _process_utilization(self, handle: str, last_seen: int) -> list[SimpleNamespace]:
        self.asked.append(last_seen)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_each_sample_covers_the_period_since_the_previous_one(monkeypatch) -> None:
    fake = FakeNvml(
        monkeypatch,
        [
            [sample(1, 1_000, 30), sample(2, 1_200, 10)],
            [sample(1, 2_000, 20), sample(1, 2_500, 40)],  # two samples: their mean
        ],
    )
    source = NvmlSource()
    assert source.sample()[0].process_utilization == {1: 0.3, 2: 0.1}
    assert source.sample()[0].process_utilization == pytest.approx({1: 0.3})
    assert fake.asked == [0, 1_200]  # the first: all the driver keeps; then the newest seen


def test_not_found_means_no_process_ran_and_moves_the_period_on(monkeypatch) -> None:
    fake = FakeNvml(monkeypatch, [error(pynvml.NVML_ERROR_NOT_FOUND), [sample(1, 10**17, 50)]])
    source = NvmlSource()
    before = time.time_ns() // 1000
    assert source.sample()[0].process_utilization == {}  # every process's share is 0
    after = time.time_ns() // 1000
    assert source.sample()[0].process_utilization == {1: 0.5}
    assert before <= fake.asked[1] <= after  # the idle period is not counted again


@pytest.mark.parametrize(
    "code", [pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND]
)
def test_a_driver_without_per_process_figures_is_not_asked_again(monkeypatch, code) -> None:
    fake = FakeNvml(monkeypatch, [error(code)])
    source = NvmlSource()
    first, second = source.sample()[0], source.sample()[0]
    assert first.process_utilization is None and second.process_utilization is None
    assert first.utilization_ratio == 0.5  # the GPU's utilisation is still reported
    assert len(fake.asked) == 1


def test_a_failed_query_falls_back_for_that_sample_only(monkeypatch) -> None:
    fake = FakeNvml(monkeypatch, [error(pynvml.NVML_ERROR_UNKNOWN), [sample(1, 5_000, 70)]])
    source = NvmlSource()
    assert source.sample()[0].process_utilization is None
    assert source.sample()[0].process_utilization == {1: 0.7}
    assert fake.asked == [0, 0]  # the failed query did not move the period


def test_a_process_appearing_between_size_query_and_read_is_retried(monkeypatch) -> None:
    fake = FakeNvml(
        monkeypatch, [error(pynvml.NVML_ERROR_INSUFFICIENT_SIZE), [sample(3, 9_000, 25)]]
    )
    assert NvmlSource().sample()[0].process_utilization == {3: 0.25}
    assert fake.asked == [0, 0]


def test_the_watchdogs_memory_sample_leaves_the_period_alone(monkeypatch) -> None:
    fake = FakeNvml(monkeypatch, [[sample(1, 4_000, 60)]])
    source = NvmlSource()
    looked = source.sample_memory()[0]
    assert looked.memory_used_bytes == 10 and [p.pid for p in looked.processes] == [1]
    assert looked.process_utilization is None and looked.utilization_ratio is None
    assert fake.asked == [] and fake.rates_asked == 0
    assert source.sample()[0].process_utilization == {1: 0.6}
    assert fake.asked == [0]
