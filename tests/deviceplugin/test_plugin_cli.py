"""`gpushare device-plugin` as a process: NVML through the mock (LD_LIBRARY_PATH), a kubelet
peer, an API server that cannot be reached, SIGTERM; and bad input."""

from __future__ import annotations

import json
import signal
import subprocess

import grpc
import pytest
from deviceplugin_helpers import (
    build_mock,
    command,
    mock_devices,
    plugin_env,
    unreachable_kubeconfig,
)
from deviceplugin_peer import KubeletPeer, SimulatedKubelet

from gpushare import protocol

MEM = protocol.RESOURCE_GPU_MEMORY


def test_serves_through_an_api_outage_and_stops_on_sigterm(short_dir):
    build_mock()
    config = short_dir / "mock.json"
    config.write_text(json.dumps({"devices": mock_devices("node-z", 2, 8192, "T4")}))
    plugin_dir = short_dir / "dp"
    plugin_dir.mkdir()
    peer = KubeletPeer(plugin_dir)
    process = subprocess.Popen(
        command(
            "--node-name",
            "node-z",
            "--kubeconfig",
            str(unreachable_kubeconfig(short_dir / "kubeconfig")),
            "--device-plugin-dir",
            str(plugin_dir),
            "--host-state-dir",
            str(short_dir / "host"),
        ),
        env=plugin_env(config),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    kubelet = SimulatedKubelet(peer)
    try:
        requests = peer.wait_registered(3, timeout_s=30)
        assert {r.resource_name for r in requests} == set(protocol.MANAGED_RESOURCES)
        assert len(kubelet.stream(MEM).lists[-1]) == 2 * 8
        assert set(kubelet.stream(protocol.RESOURCE_GPU_COUNT).lists[-1]) == {
            d["uuid"] for d in mock_devices("node-z", 2, 8192, "T4")
        }
        with pytest.raises(grpc.RpcError) as raised:
            kubelet.admit(MEM, 2)
        assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "(the API server is unreachable)" in raised.value.details()
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    finally:
        kubelet.close()
        peer.stop()
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, stderr
    assert "stopped" in stderr.splitlines()[-1]
    assert "Traceback" not in stderr
    assert not list(plugin_dir.glob("gpushare-*.sock"))  # its sockets went with it


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--device-list-strategy", "magic"], "--device-list-strategy 'magic': expected some of"),
        (["--device-list-strategy", "envvar,volume-mounts"], "exclude each other"),
        (["--ignored-xids", "13,x"], "--ignored-xids '13,x': expected comma-separated"),
        (["--recovery-s", "-1"], "--recovery-s must be >= 0"),
        (["--device-plugin-dir", "/nonexistent"], "--device-plugin-dir /nonexistent: not a"),
        (
            ["--device-plugin-dir", "/tmp", "--library-host-path", "/nonexistent.so"],
            "--library-host-path /nonexistent.so: no such file",
        ),
    ],
)
def test_bad_options_are_one_line_errors(short_dir, args, problem):
    result = subprocess.run(
        command("--node-name", "n", *args),
        env=plugin_env(None),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("gpushare device-plugin: error: ")
    assert problem in result.stderr


def test_missing_node_name_and_missing_nvml_are_one_line_errors(short_dir):
    env = plugin_env(None)
    env.pop("NODE_NAME", None)
    result = subprocess.run(
        command(), env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 2
    assert "--node-name (or $NODE_NAME) is required" in result.stderr
    build_mock()
    result = subprocess.run(
        command(
            "--node-name",
            "n",
            "--device-plugin-dir",
            str(short_dir),
            "--kubeconfig",
            str(unreachable_kubeconfig(short_dir / "kubeconfig")),
        ),
        env=env,  # no GPUSHARE_MOCK_CONFIG: the mock NVML cannot start
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("gpushare device-plugin: error: NVML: cannot initialise")
    assert "Traceback" not in result.stderr
