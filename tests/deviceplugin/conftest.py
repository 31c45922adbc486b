"""Fixtures for the device plugin's tests.

NVML: the real binding (pynvml) against the project's mock libnvidia-ml.so.1, preloaded into
this process (RTLD_GLOBAL, so pynvml's dlopen by soname finds it) with one config for the
session: NODE's four GPUs. Health events are injected through the mock's state file.

``harness``: the plugin in this process (its gRPC servers, registration and lifecycle in a
thread) with a fixed pod source, and a kubelet peer over unix sockets.

The local control plane: ``extender_cluster`` and its helpers come from
tests/extender/conftest.py, loaded by path (it loads tests/cluster/conftest.py the same way);
this makes a second session cluster, separate from the extender tests' one.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from deviceplugin_helpers import (
    GPU_MEMORY_MIB,
    NODE,
    Harness,
    Nvml,
    build_mock,
    mock_devices,
    start_harness,
    stop_harness,
)

from gpushare.deviceplugin import discovery

_spec = importlib.util.spec_from_file_location(
    "gpushare_extender_fixtures", Path(__file__).parents[1] / "extender" / "conftest.py"
)
assert _spec is not None and _spec.loader is not None
extender_fixtures = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = extender_fixtures  # its dataclasses look their module up there
_spec.loader.exec_module(extender_fixtures)
k8s_bin_dir = extender_fixtures.k8s_bin_dir
extender_cluster = extender_fixtures.extender_cluster
ekube = extender_fixtures.ekube
ens = extender_fixtures.ens
ewatch = extender_fixtures.ewatch
cluster_helpers = extender_fixtures.cluster_helpers


@pytest.fixture(scope="session")
def nvml() -> Iterator[Nvml]:
    library_path = build_mock()
    directory = Path(tempfile.mkdtemp(prefix="gpushare-dp-nvml-"))
    config = directory / "mock.json"
    config.write_text(
        json.dumps(
            {
                "nvml_driver_version": "580.65.06",
                "devices": mock_devices(NODE, 4, GPU_MEMORY_MIB, "H200"),
            }
        )
    )
    # The mock reads its config once per process, at its first call: the variables are
    # needed only for nvmlInit, and must not leak into other tests' subprocesses.
    saved = {k: os.environ.get(k) for k in ("GPUSHARE_MOCK_CONFIG", "GPUSHARE_MOCK_STATE")}
    os.environ["GPUSHARE_MOCK_CONFIG"] = str(config)
    os.environ["GPUSHARE_MOCK_STATE"] = str(directory / "mock.state")
    try:
        library = ctypes.CDLL(str(library_path), mode=ctypes.RTLD_GLOBAL)
        discovery.init_nvml()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    driver, gpus = discovery.discover()
    try:
        yield Nvml(library, gpus, driver)
    finally:
        discovery.shutdown_nvml()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path: unix socket paths are limited to 107 bytes."""
    directory = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def harness(nvml: Nvml, short_dir: Path) -> Iterator[Harness]:
    started = start_harness(short_dir, nvml.gpus)
    yield started
    stop_harness(started)
