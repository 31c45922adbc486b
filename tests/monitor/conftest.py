"""Fixtures for the monitor's tests: the native build (mock NVML and CUDA, the interception
library's testing build, the C programs) and a fixture /proc root."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from monitor_helpers import NATIVE

PROGRAMS = ["intercept_worker", "intercept_alloc", "mock_hold", "mock_procutil"]


@pytest.fixture(scope="session")
def native_build() -> Path:
    """native/build with the mock libraries, the testing library and the programs, built once."""
    targets = ["build/mock/libcuda.so.1", "build/mock/libnvidia-ml.so.1"]
    targets += ["build/testing/libgpushare.so"] + [f"build/tests/{p}" for p in PROGRAMS]
    result = subprocess.run(
        ["make", "-C", str(NATIVE), "--no-print-directory", "BUILD=build", *targets],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(f"native build failed:\n{result.stdout}\n{result.stderr}")
    return NATIVE / "build"


@pytest.fixture
def proc_root(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    root.mkdir()
    return root


# The extender's local control plane (tests/extender/conftest.py, loaded by path and
# re-exported) for the tests of the monitor's API server side: the pod watch and Events.
_spec = importlib.util.spec_from_file_location(
    "gpushare_extender_fixtures_for_monitor",
    Path(__file__).parents[1] / "extender" / "conftest.py",
)
assert _spec is not None and _spec.loader is not None
_extender = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _extender  # its dataclasses look their module up
_spec.loader.exec_module(_extender)

k8s_bin_dir = _extender.k8s_bin_dir
extender_cluster = _extender.extender_cluster
ekube = _extender.ekube
ens = _extender.ens
ewatch = _extender.ewatch
