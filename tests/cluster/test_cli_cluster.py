"""`gpushare cluster up|down|status` as a person runs them, on a cluster of its own."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpushare.cluster import ClusterError, NodeSpec, down, up
from gpushare.cluster.processes import processes_with


def gpushare(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpushare.cli.main", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        check=False,
    )


@pytest.fixture
def state_dir(tmp_path: Path, no_processes_left: Callable[[Path], None]) -> Iterator[Path]:
    """A state dir whose cluster is torn down after the test, whatever happened."""
    path = tmp_path / "state"
    try:
        yield path
    finally:
        down(path, timeout=10)
        no_processes_left(path)


def pids(state_dir: Path) -> dict[str, int]:
    state = json.loads((state_dir / "state.json").read_text())
    return {name: record["pid"] for name, record in state["processes"].items()}


def test_up_status_up_kill_up_down(cli_env: dict[str, str], state_dir: Path) -> None:
    where = ("--state-dir", str(state_dir))

    started = time.monotonic()
    first = gpushare(cli_env, "cluster", "up", *where, "--nodes", "2", "--gpus-per-node", "4")
    assert first.returncode == 0, first.stderr
    assert time.monotonic() - started < 60
    kubeconfig = state_dir / "kubeconfig"
    assert f"kubeconfig: {kubeconfig}" in first.stdout
    assert first.stdout.rstrip().splitlines()[-1] == f"export KUBECONFIG={kubeconfig}"
    assert kubeconfig.is_file()

    status = gpushare(cli_env, "cluster", "status", *where)
    assert status.returncode == 0, status.stdout + status.stderr
    assert "running" in status.stdout and "2 (2 Ready)" in status.stdout
    before = pids(state_dir)
    assert "extender" in before  # `cluster up` runs the extender unless --no-extender
    for name, pid in before.items():
        assert f"pid {pid}" in status.stdout, name

    # A second `up` is harmless: it says so and changes nothing.
    again = gpushare(cli_env, "cluster", "up", *where)
    assert again.returncode == 0, again.stderr
    assert "already up" in again.stdout
    assert pids(state_dir) == before

    # Kill everything as a crash would; `status` says so, the next `up` recovers.
    for pid in before.values():
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while processes_with(str(state_dir)) and time.monotonic() < deadline:
        time.sleep(0.05)
    dead = gpushare(cli_env, "cluster", "status", *where)
    assert dead.returncode != 0
    assert "NOT running" in dead.stdout and "DEAD" in dead.stdout

    recovered = gpushare(cli_env, "cluster", "up", *where, "--nodes", "3")
    assert recovered.returncode == 0, recovered.stderr
    assert "replaced a stale one" in recovered.stdout
    assert "stale cluster" in recovered.stderr
    after = pids(state_dir)
    assert set(after.values()).isdisjoint(before.values())
    status = gpushare(cli_env, "cluster", "status", *where)
    assert status.returncode == 0 and "3 (3 Ready)" in status.stdout

    stopped = gpushare(cli_env, "cluster", "down", *where)
    assert stopped.returncode == 0, stopped.stderr
    # etcd, kube-apiserver, the gpushare extender, kube-scheduler, the heartbeat.
    assert "stopped 5 process(es)" in stopped.stdout
    assert not state_dir.exists()
    assert processes_with(str(state_dir)) == []

    gone = gpushare(cli_env, "cluster", "status", *where)
    assert gone.returncode != 0 and "not running" in gone.stdout
    assert gpushare(cli_env, "cluster", "down", *where).returncode == 0  # idempotent


def test_malformed_node_list_is_one_line_and_starts_nothing(
    cli_env: dict[str, str], state_dir: Path
) -> None:
    csv = state_dir.parent / "nodes.csv"
    csv.write_text("sn,cpu_milli,memory_mib,gpu,model\nn-0,64000,262144,two,T4\n")
    result = gpushare(
        cli_env, "cluster", "up", "--state-dir", str(state_dir), "--node-list", str(csv)
    )
    assert result.returncode != 0
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("gpushare cluster up: error: ")
    assert "row 2: gpu must be a whole number, got 'two'" in result.stderr
    assert not state_dir.exists()


def test_port_in_use_is_one_line(cli_env: dict[str, str], state_dir: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = gpushare(
            cli_env, "cluster", "up", "--state-dir", str(state_dir), "--apiserver-port", str(port)
        )
    assert result.returncode != 0
    assert result.stderr == (
        f"gpushare cluster up: error: --apiserver-port {port}: port already in use on 127.0.0.1\n"
    )
    assert not state_dir.exists()


def test_missing_binaries_are_one_line(cli_env: dict[str, str], state_dir: Path) -> None:
    env = {**cli_env, "GPUSHARE_K8S_BIN_DIR": str(state_dir.parent / "no-such-dir")}
    result = gpushare(env, "cluster", "up", "--state-dir", str(state_dir))
    assert result.returncode != 0
    assert result.stderr.count("\n") == 1, result.stderr
    assert "GPUSHARE_K8S_BIN_DIR" in result.stderr and "is not a folder" in result.stderr


def test_a_component_that_fails_to_start_stops_the_rest(
    k8s_bin_dir: Path, tmp_path: Path, no_processes_left: Callable[[Path], None]
) -> None:
    """kube-apiserver exits at once: `up` says so in one line, stops etcd, keeps the logs;
    the next `down` cleans up."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "etcd").symlink_to(k8s_bin_dir / "etcd")
    (fake / "kube-scheduler").symlink_to(k8s_bin_dir / "kube-scheduler")
    shutil.copy("/bin/false", fake / "kube-apiserver")
    state_dir = tmp_path / "state"
    try:
        with pytest.raises(ClusterError, match="kube-apiserver exited with status 1") as error:
            up(state_dir, NodeSpec(count=1), bin_dir=fake, say=lambda _: None)
        assert "\n" not in str(error.value)
        assert processes_with(str(state_dir)) == []
        assert (state_dir / "logs" / "etcd.log").is_file()
    finally:
        down(state_dir)
        no_processes_left(state_dir)
    assert not state_dir.exists()


def test_go_missing_is_one_line(tmp_path: Path) -> None:
    """An empty cache and no Go: the build cannot start, and `up` says why in one line."""
    tools = tmp_path / "path"
    tools.mkdir()
    for folder in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(folder):
            continue
        for entry in os.scandir(folder):
            target = tools / entry.name
            if entry.name not in ("go", "gofmt") and not target.exists():
                target.symlink_to(entry.path)
    env = {k: v for k, v in os.environ.items() if k != "GPUSHARE_K8S_BIN_DIR"}
    env |= {"PATH": str(tools), "GPUSHARE_K8S_CACHE": str(tmp_path / "cache")}
    state_dir = tmp_path / "state"
    result = gpushare(env, "cluster", "up", "--state-dir", str(state_dir))
    assert result.returncode != 0
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("gpushare cluster up: error: cannot get the Kubernetes")
    assert "Go is not installed" in result.stderr
    assert not state_dir.exists()
