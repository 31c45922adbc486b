"""`gpushare monitor` as a process: the mock NVML, state files the interception library wrote,
a fixture /proc, pods from a file; scraped directly and by a real Prometheus server."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from monitor_helpers import (
    DEVICES,
    GPU0,
    GPU1,
    MIB,
    NODE,
    cgroup_text,
    hold,
    mock_env,
    node_object,
    pod,
    release,
    share,
    start_monitor,
    write_config,
    write_proc,
)
from prometheus_client.parser import text_string_to_metric_families

from gpushare.cluster.processes import free_port
from gpushare.monitor import statefile

OVERHEAD = 300 * MIB  # as the mock charges a context, so NVML and the state file agree
CHUNK = 256 * MIB
DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "gpushare-dashboard.json"


@dataclass
class Node:
    port: int
    monitor: subprocess.Popen[str]
    processes: dict[str, subprocess.Popen[str]]
    state_used: int  # what the interception library charged container a

    def metrics(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as r:
            text = r.read().decode()
        out: dict[str, list[tuple[dict[str, str], float]]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out.setdefault(sample.name, []).append((sample.labels, sample.value))
        return out


def _one(series: list[tuple[dict[str, str], float]], **labels: str) -> float:
    values = [v for k, v in series if labels.items() <= k.items()]
    assert len(values) == 1, (labels, series)
    return values[0]


def _worker(native_build: Path, config: Path, tmp_path: Path, state_dir: Path, limit_mib: int):
    """intercept_worker with the interception library: allocates CHUNKs until refused."""
    state_dir.parent.mkdir(parents=True, exist_ok=True)  # the device plugin makes ROOT/<uid>
    limits = tmp_path / f"limits-{state_dir.name}-{limit_mib}.conf"
    limits.write_text(
        f"memory_limit_bytes={limit_mib}MiB\ncontext_overhead_bytes={OVERHEAD}\n"
        f"state_dir={state_dir}\n"
    )
    env = mock_env(config)
    env["LD_PRELOAD"] = str(native_build / "testing" / "libgpushare.so")
    env["GPUSHARE_TEST_LIMITS_PATH"] = str(limits)
    worker = subprocess.Popen(
        [str(native_build / "tests" / "intercept_worker"), str(CHUNK)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert worker.stdout is not None and worker.stdin is not None
    line = worker.stdout.readline()
    if line.strip() != "ready":
        worker.kill()
        raise AssertionError(f"intercept_worker: {line!r} {worker.communicate()[1]}")
    worker.stdin.write("go\n")
    worker.stdin.flush()
    worker.stdout.readline()  # count=
    used = int(worker.stdout.readline().split("=")[1])
    return worker, used


@pytest.fixture
def node(native_build: Path, tmp_path: Path, proc_root: Path) -> Iterator[Any]:
    """a: 2 GiB share of GPU0, a process under the interception library (state file);
    b: 1 GiB of GPU0, a plain process; c: GPU1 exclusively; greedy: 512 MiB of GPU0, holding
    more (the watchdog's target when it runs)."""
    config = write_config(tmp_path / "mock.json")
    pods = [
        pod("a", {"main": [share(GPU0, 0, 2048, 30)]}),
        pod("b", {"main": [share(GPU0, 0, 1024)]}, namespace="team"),
        pod("c", {"train": [share(GPU1, 1, 8192, 100, exclusive=True)]}),
        pod("greedy", {"main": [share(GPU0, 0, 512)]}),
    ]
    pods_file = tmp_path / "pods.json"
    pods_file.write_text(json.dumps({"kind": "List", "items": [*pods, node_object()]}))
    state_root = tmp_path / "states"
    a_dir = statefile.container_dir(state_root, pods[0]["metadata"]["uid"], "main")
    worker, used = _worker(native_build, config, tmp_path, a_dir, 2048)
    processes = {
        "a": worker,
        "b": hold(config, 0, 100),
        "c": hold(config, 1, 1000, kernel_us=120_000_000),  # GPU1 busy for the whole test
        "greedy": hold(config, 0, 1024),
    }
    namespaces = {"b": "team"}
    for name, process in processes.items():
        container = "train" if name == "c" else "main"
        write_proc(
            proc_root, process.pid, cgroup_text(namespaces.get(name, "default"), name, container)
        )
    started: list[subprocess.Popen[str]] = []

    def start(*extra: str) -> Node:
        monitor, port = start_monitor(
            [
                "--node-name",
                NODE,
                "--pods-file",
                str(pods_file),
                "--state-root",
                str(state_root),
                "--proc-root",
                str(proc_root),
                *extra,
            ],
            mock_env(config),
        )
        started.append(monitor)
        return Node(port, monitor, processes, used)

    try:
        yield start
    finally:
        for monitor in started:
            monitor.terminate()
            monitor.communicate(timeout=10)
        release(list(processes.values()))


def test_metrics_from_mock_nvml_and_real_state_files(node) -> None:
    agent = node("--watchdog", "off")
    m = agent.metrics()
    gpu0 = {"node": NODE, "gpu_uuid": GPU0, "gpu_index": "0", "gpu_model": "NVIDIA H200"}
    assert _one(m["gpushare_gpu_memory_total_bytes"], **gpu0) == 8192 * MIB
    # NVML (the mock) charges 300 MiB per context plus the allocations.
    a_nvml = 300 * MIB + (agent.state_used - OVERHEAD)
    expected_used = a_nvml + (300 + 100) * MIB + (300 + 1024) * MIB
    assert _one(m["gpushare_gpu_memory_used_bytes"], **gpu0) == expected_used
    assert _one(m["gpushare_gpu_mode"], gpu_uuid=GPU0, mode="shared") == 1
    assert _one(m["gpushare_gpu_mode"], gpu_uuid=GPU1, mode="exclusive") == 1
    assert _one(m["gpushare_gpu_containers"], gpu_uuid=GPU0) == 3
    assert _one(m["gpushare_gpu_temperature_celsius"], gpu_uuid=GPU0) == 45
    assert _one(m["gpushare_gpu_power_watts"], gpu_uuid=GPU0) == 120
    assert _one(m["gpushare_gpu_healthy"], gpu_uuid=GPU1) == 1
    a = {"namespace": "default", "pod": "a", "container": "main", "gpu_uuid": GPU0}
    assert agent.state_used == OVERHEAD + 6 * CHUNK  # 2 GiB: the context and 6 chunks
    assert _one(m["gpushare_container_state_memory_used_bytes"], **a) == agent.state_used
    assert _one(m["gpushare_container_nvml_memory_used_bytes"], **a) == a_nvml
    assert _one(m["gpushare_container_memory_limit_bytes"], **a) == 2048 * MIB
    assert _one(m["gpushare_container_compute_limit_ratio"], **a) == 0.3
    assert _one(m["gpushare_container_refused_allocations_total"], pod="a") == 1
    b = {"namespace": "team", "pod": "b", "gpu_uuid": GPU0}
    assert _one(m["gpushare_container_nvml_memory_used_bytes"], **b) == 400 * MIB
    # c's kernel keeps GPU1 busy: per process, c has what the GPU has (the first scrape's
    # period is the mock's last second, as the GPU's utilisation; asked a moment apart). The
    # containers on GPU0 ran no kernel: 0, each.
    busy = _one(m["gpushare_gpu_utilization_ratio"], gpu_uuid=GPU1)
    assert busy > 0  # the mock averages over its last second: rising since the kernel began
    c_util = _one(m["gpushare_container_compute_utilization_ratio"], pod="c")
    assert c_util == pytest.approx(busy, abs=0.02)
    for name in ("a", "b", "greedy"):
        assert _one(m["gpushare_container_compute_utilization_ratio"], pod=name) == 0
    assert _one(m["gpushare_monitor_state_file_errors"]) == 0
    assert _one(m["gpushare_monitor_pods_synced"]) == 1


def _kernel_runner(native_build: Path, config: Path, mib: int) -> subprocess.Popen[str]:
    """mock_procutil hold: a context and memory on GPU0; runs a kernel when told."""
    runner = subprocess.Popen(
        [str(native_build / "tests" / "mock_procutil"), "hold", "0", str(mib)],
        env=mock_env(config),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert runner.stdout is not None
    line = runner.stdout.readline()
    if not line.startswith("ready"):
        runner.kill()
        raise AssertionError(f"mock_procutil hold: {line!r} {runner.communicate()[1]}")
    return runner


def test_containers_sharing_a_gpu_get_their_own_kernel_time(
    native_build: Path, tmp_path: Path, proc_root: Path
) -> None:
    """x and y share GPU0; between two scrapes x runs 300 ms of kernels and y 100 ms (queued
    on the one timeline): each gets its kernel time over the time between the scrapes."""
    config = tmp_path / "mock.json"
    config.write_text(json.dumps({"utilization_window_ms": 60000, "devices": DEVICES}))
    pods = [pod(name, {"main": [share(GPU0, 0, 1024)]}) for name in ("x", "y")]
    pods_file = tmp_path / "pods.json"
    pods_file.write_text(json.dumps({"kind": "List", "items": [*pods, node_object()]}))
    runners = {name: _kernel_runner(native_build, config, 64) for name in ("x", "y")}
    monitor = None
    try:
        for name, runner in runners.items():
            write_proc(proc_root, runner.pid, cgroup_text("default", name, "main"))
        monitor, port = start_monitor(
            [
                *("--node-name", NODE, "--pods-file", str(pods_file)),
                *("--proc-root", str(proc_root), "--watchdog", "off"),
            ],
            mock_env(config),
        )
        agent = Node(port, monitor, {}, 0)
        name = "gpushare_container_compute_utilization_ratio"

        def shares(m: dict[str, list[tuple[dict[str, str], float]]]) -> dict[str, float]:
            return {pod_name: _one(m[name], pod=pod_name) for pod_name in runners}

        first_start = time.monotonic()
        assert shares(agent.metrics()) == {"x": 0, "y": 0}  # no kernel in the mock's window
        first_end = time.monotonic()
        for pod_name, micros in (("x", 300_000), ("y", 100_000)):
            runners[pod_name].stdin.write(f"run {micros}\n")  # type: ignore[union-attr]
            runners[pod_name].stdin.flush()  # type: ignore[union-attr]
        for runner in runners.values():
            assert runner.stdout.readline().strip() == "ran"  # type: ignore[union-attr]
        second_start = time.monotonic()
        second = shares(agent.metrics())
        second_end = time.monotonic()
        # The period runs from the first scrape's NVML query to the second's.
        longest, shortest = second_end - first_start, second_start - first_end
        assert shortest >= 0.4  # both kernels ran in it, one after the other
        for pod_name, seconds in (("x", 0.3), ("y", 0.1)):
            assert seconds / longest - 0.01 <= second[pod_name] <= seconds / shortest + 0.01
        assert abs(second["x"] - 3 * second["y"]) <= 0.02  # each rounded to a percent
        # The next scrape's period starts at this one: nothing ran since.
        assert shares(agent.metrics()) == {"x": 0, "y": 0}
    finally:
        if monitor is not None:
            monitor.terminate()
            monitor.communicate(timeout=10)
        release(list(runners.values()))


def test_watchdog_in_the_agent_stops_the_greedy_container(node) -> None:
    agent = node("--watchdog", "on", "--grace", "0.3", "--interval", "0.1", "--tolerance-mib", "0")
    greedy = agent.processes["greedy"]
    assert greedy.wait(timeout=30) == -9
    deadline = time.monotonic() + 30
    pause = threading.Event()  # never set: a bounded wait between scrapes
    while True:
        m = agent.metrics()
        stops = _one(m["gpushare_container_watchdog_stops_total"], pod="greedy")
        if stops >= 1:
            break
        assert time.monotonic() < deadline, "the stop never showed in the metrics"
        pause.wait(0.05)
    assert stops == 1
    for name in ("a", "b", "c"):
        assert agent.processes[name].poll() is None, name
    assert _one(m["gpushare_container_watchdog_stops_total"], pod="a") == 0


class Prometheus:
    def __init__(self, tmp_path: Path, target_port: int) -> None:
        binary = shutil.which("prometheus") or "/usr/bin/prometheus"
        if not Path(binary).exists():
            pytest.fail(
                "prometheus is not installed: apt-get install prometheus (Debian's package)",
                pytrace=False,
            )
        self.port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: gpushare-monitor\n"
            f"    static_configs:\n      - targets: ['127.0.0.1:{target_port}']\n"
        )
        self.log = (tmp_path / "prometheus.log").open("w")
        self.process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode(
            {"query": expr}
        )
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]["result"]

    def wait_for(self, expr: str, count: int, deadline_s: float = 60) -> list[dict[str, Any]]:
        """The result of ``expr`` once it has ``count`` series (Prometheus scrapes each 1 s)."""
        deadline = time.monotonic() + deadline_s
        pause = threading.Event()  # never set: a bounded wait between queries
        last: object = None
        while time.monotonic() < deadline:
            assert self.process.poll() is None, "prometheus exited; see prometheus.log"
            try:
                last = self.query(expr)
                if len(last) == count:
                    return last  # type: ignore[return-value]
            except OSError as error:  # not listening yet
                last = error
            pause.wait(0.2)
        pytest.fail(f"{expr}: not {count} series in {deadline_s} s; last: {last}")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=20)
        self.log.close()


def test_prometheus_scrapes_the_expected_series(node, tmp_path: Path) -> None:
    agent = node("--watchdog", "off")
    prometheus = Prometheus(tmp_path, agent.port)
    try:
        up = prometheus.wait_for('up{job="gpushare-monitor"} == 1', 1)
        assert up[0]["metric"]["instance"] == f"127.0.0.1:{agent.port}"
        totals = prometheus.wait_for("gpushare_gpu_memory_total_bytes", 2)
        assert {r["metric"]["gpu_uuid"]: float(r["value"][1]) for r in totals} == {
            GPU0: 8192 * MIB,
            GPU1: 8192 * MIB,
        }
        (used,) = prometheus.wait_for(
            'gpushare_container_state_memory_used_bytes{pod="a",container="main"}', 1
        )
        assert float(used["value"][1]) == agent.state_used
        assert used["metric"]["gpu_uuid"] == GPU0 and used["metric"]["namespace"] == "default"
        modes = prometheus.wait_for("gpushare_gpu_mode == 1", 2)
        assert {r["metric"]["gpu_uuid"]: r["metric"]["mode"] for r in modes} == {
            GPU0: "shared",
            GPU1: "exclusive",
        }
        (refused,) = prometheus.wait_for("gpushare_container_refused_allocations_total", 1)
        assert refused["metric"]["pod"] == "a" and float(refused["value"][1]) == 1
        # Every expression of the Grafana dashboard is valid PromQL that this Prometheus
        # evaluates against the exporter's series (variables set to match everything).
        for expr in dashboard_expressions():
            concrete = expr.replace("$node", ".*").replace("$namespace", ".*")
            concrete = concrete.replace("$__rate_interval", "1m")
            prometheus.query(concrete)
    finally:
        prometheus.stop()


def dashboard_expressions() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"] for p in panels for t in p.get("targets", ()) if t.get("expr")]
