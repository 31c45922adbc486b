"""Fixtures for the native tests: build the mock CUDA driver/NVML, write configs, run programs."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NATIVE = ROOT / "native"
SANITIZERS = {
    "asan": "-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all",
}


def _mock_targets(build: str) -> list[str]:
    programs = sorted(p.stem for p in (NATIVE / "tests").glob("mock_*.c"))
    return [f"{build}/mock/libcuda.so.1", f"{build}/mock/libnvidia-ml.so.1"] + [
        f"{build}/tests/{name}" for name in programs
    ]


def _make(build: str, san_flags: str = "") -> Path:
    # Only the mock and its test programs: the interception library (native/src) has its own
    # tests, and a change there must not break these.
    args = ["make", "-C", str(NATIVE), "--no-print-directory", f"BUILD={build}"]
    if san_flags:
        args.append(f"SAN_FLAGS={san_flags}")
    result = subprocess.run(
        args + _mock_targets(build), capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        pytest.fail(f"native build failed:\n{result.stdout}\n{result.stderr}")
    return NATIVE / build


@pytest.fixture(scope="session")
def native_build() -> Path:
    """native/build with the mock libraries and the mock_* test programs, built once."""
    return _make("build")


@pytest.fixture(scope="session")
def native_asan_build() -> Path:
    """The same under AddressSanitizer + UBSan, in native/build/asan."""
    return _make("build/asan", SANITIZERS["asan"])


DEFAULT_DEVICES = [
    {
        "name": "NVIDIA H200",
        "uuid": "GPU-12345678-1234-1234-1234-123456789abc",
        "memory_mib": 1024,
        "sm_count": 132,
        "context_overhead_mib": 300,
        "kernel_time_us": 1000,
    },
    {
        "name": "NVIDIA A100-SXM4-80GB",
        "uuid": "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
        "memory_mib": 2048,
        "sm_count": 108,
    },
]


@pytest.fixture
def mock_config(tmp_path: Path) -> Callable[..., Path]:
    """Writes a mock config into tmp_path; returns its path. Defaults: DEFAULT_DEVICES."""

    def write(devices: list[dict] | None = None, **top: object) -> Path:
        path = tmp_path / "mock.json"
        body = {"driver_version": 12080, "devices": devices or DEFAULT_DEVICES}
        body.update(top)
        path.write_text(json.dumps(body))
        return path

    return write


def mock_env(build: Path, config: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHARE_")}
    if config is not None:
        env["GPUSHARE_MOCK_CONFIG"] = str(config)
    env["LD_LIBRARY_PATH"] = str(build / "mock")
    return env


@pytest.fixture
def run_mock(native_build: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """run_mock(program, *args, config=path, build=...) -> CompletedProcess (text, captured)."""

    def run(
        program: str, *args: str, config: Path | None, build: Path | None = None, timeout=20
    ) -> subprocess.CompletedProcess[str]:
        base = build or native_build
        return subprocess.run(
            [str(base / "tests" / program), *args],
            env=mock_env(base, config),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    return run


@pytest.fixture
def popen_mock(native_build: Path) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """popen_mock(program, *args, config=path): a running program with stdin/stdout pipes."""
    started: list[subprocess.Popen[str]] = []

    def start(program: str, *args: str, config: Path) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [str(native_build / "tests" / program), *args],
            env=mock_env(native_build, config),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.communicate()
