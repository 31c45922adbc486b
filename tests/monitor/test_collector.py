"""The metrics of one scrape, from GPU samples, pods, state files and a fixture /proc."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from monitor_helpers import GPU0, GPU1, MIB, NODE, cgroup_text, node_object, pod, share, write_proc
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpushare.monitor import statefile
from gpushare.monitor.collector import METRICS, MonitorCollector
from gpushare.monitor.nvml import GpuProcess, GpuSample
from gpushare.monitor.pods import StaticPodSource

GPU2 = "GPU-22222222-2222-2222-2222-222222222222"
Samples = dict[str, dict[frozenset[tuple[str, str]], float]]


def gpu(uuid: str, index: int, *processes: tuple[int, int], util: float | None = 0.5, **kw):
    fields = dict(
        index=index,
        uuid=uuid,
        name="NVIDIA H200",
        responding=True,
        memory_total_bytes=8192 * MIB,
        memory_used_bytes=sum(p[1] for p in processes),
        utilization_ratio=util,
        temperature_celsius=45.0,
        power_watts=120.0,
        processes=tuple(GpuProcess(pid, used) for pid, used in processes),
    )
    fields.update(kw)
    return GpuSample(**fields)


def scrape(collector: MonitorCollector) -> Samples:
    registry = CollectorRegistry()
    registry.register(collector)
    out: Samples = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            out.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    matches = [v for k, v in samples.get(name, {}).items() if set(labels.items()) <= set(k)]
    assert len(matches) == 1, f"{name} {labels}: {matches} in {samples.get(name)}"
    return matches[0]


def absent(samples: Samples, name: str, **labels: str) -> bool:
    return not [k for k in samples.get(name, {}) if set(labels.items()) <= set(k)]


@pytest.fixture
def node(tmp_path: Path, proc_root: Path):
    """GPU0 shared by a (2 GiB, 30 % core) and b (1 GiB); GPU1 exclusive to c; GPU2 idle."""
    pods = [
        pod("a", {"main": [share(GPU0, 0, 2048, 30)]}),
        pod("b", {"main": [share(GPU0, 0, 1024)]}, namespace="team"),
        pod("c", {"train": [share(GPU1, 1, 8192, 100, exclusive=True)]}),
        pod("d", {"main": [share(GPU0, 0, 512)]}, started=False),
        pod("done", {"main": [share(GPU0, 0, 512)]}, phase="Succeeded"),
    ]
    write_proc(proc_root, 101, cgroup_text("default", "a", "main"))
    write_proc(proc_root, 102, cgroup_text("default", "a", "main", style="v1-cgroupfs"))
    write_proc(proc_root, 201, cgroup_text("team", "b", "main"))
    write_proc(proc_root, 301, cgroup_text("default", "c", "train"))
    write_proc(proc_root, 999, "0::/system.slice/some-daemon.service\n")
    root = tmp_path / "states"
    a_dir = statefile.container_dir(root, pods[0]["metadata"]["uid"], "main")
    a_dir.mkdir(parents=True)
    (a_dir / statefile.FILE_NAME).write_bytes(
        statefile.encode([(2048 * MIB, 700 * MIB)], [(7, 1, [700 * MIB])], refused=3)
    )
    b_dir = statefile.container_dir(root, pods[1]["metadata"]["uid"], "main")
    b_dir.mkdir(parents=True)
    (b_dir / statefile.FILE_NAME).write_bytes(b"not a state file")
    gpus = [
        gpu(GPU0, 0, (101, 400 * MIB), (102, 300 * MIB), (201, 100 * MIB), (999, 50 * MIB)),
        gpu(GPU1, 1, (301, 6000 * MIB), util=0.9),
        gpu(GPU2, 2, util=None, temperature_celsius=None, power_watts=None),
    ]
    source = StaticPodSource(pods, node_object({GPU1: False}))
    return MonitorCollector(
        NODE, lambda: gpus, source, state_root=root, proc_root=proc_root, watchdog=None
    )


def test_gpu_series(node: MonitorCollector) -> None:
    s = scrape(node)
    assert value(s, "gpushare_gpu_memory_total_bytes", gpu_uuid=GPU0) == 8192 * MIB
    assert value(s, "gpushare_gpu_memory_used_bytes", gpu_uuid=GPU0) == 850 * MIB
    assert value(s, "gpushare_gpu_memory_allocated_bytes", gpu_uuid=GPU0) == 3584 * MIB
    assert value(s, "gpushare_gpu_memory_unattributed_bytes", gpu_uuid=GPU0) == 50 * MIB
    assert value(s, "gpushare_gpu_utilization_ratio", gpu_uuid=GPU1) == 0.9
    assert value(s, "gpushare_gpu_temperature_celsius", gpu_uuid=GPU0) == 45
    assert value(s, "gpushare_gpu_power_watts", gpu_uuid=GPU0) == 120
    labels = {"node": NODE, "gpu_uuid": GPU0, "gpu_index": "0", "gpu_model": "NVIDIA H200"}
    assert value(s, "gpushare_gpu_containers", **labels) == 3  # a, b and the unstarted d
    assert value(s, "gpushare_gpu_containers", gpu_uuid=GPU2) == 0


def test_optional_fields_the_gpu_lacks_are_left_out(node: MonitorCollector) -> None:
    s = scrape(node)
    for name in (
        "gpushare_gpu_utilization_ratio",
        "gpushare_gpu_temperature_celsius",
        "gpushare_gpu_power_watts",
    ):
        assert absent(s, name, gpu_uuid=GPU2)


def test_mode_is_one_of_shared_exclusive_idle(node: MonitorCollector) -> None:
    s = scrape(node)
    for uuid, mode in ((GPU0, "shared"), (GPU1, "exclusive"), (GPU2, "idle")):
        for name in ("shared", "exclusive", "idle"):
            expected = 1.0 if name == mode else 0.0
            assert value(s, "gpushare_gpu_mode", gpu_uuid=uuid, mode=name) == expected


def test_health_comes_from_the_node_annotation(node: MonitorCollector) -> None:
    s = scrape(node)
    assert value(s, "gpushare_gpu_healthy", gpu_uuid=GPU0) == 1
    assert value(s, "gpushare_gpu_healthy", gpu_uuid=GPU1) == 0


def test_a_gpu_that_does_not_answer_is_unhealthy(proc_root: Path) -> None:
    lost = gpu(GPU0, 0, responding=False)
    collector = MonitorCollector(
        NODE, lambda: [lost], StaticPodSource([]), state_root=None, proc_root=proc_root
    )
    s = scrape(collector)
    assert value(s, "gpushare_gpu_healthy", gpu_uuid=GPU0) == 0
    assert absent(s, "gpushare_gpu_memory_used_bytes", gpu_uuid=GPU0)


def test_container_memory_series(node: MonitorCollector) -> None:
    s = scrape(node)
    a = {"namespace": "default", "pod": "a", "container": "main", "gpu_uuid": GPU0}
    b = {"namespace": "team", "pod": "b", "container": "main", "gpu_uuid": GPU0}
    assert value(s, "gpushare_container_memory_allocated_bytes", **a) == 2048 * MIB
    assert value(s, "gpushare_container_memory_limit_bytes", **a) == 2048 * MIB
    assert value(s, "gpushare_container_state_memory_used_bytes", **a) == 700 * MIB
    assert value(s, "gpushare_container_nvml_memory_used_bytes", **a) == 700 * MIB  # 2 processes
    assert value(s, "gpushare_container_nvml_memory_used_bytes", **b) == 100 * MIB
    assert absent(s, "gpushare_container_state_memory_used_bytes", **b)  # its file is bad
    c = {"pod": "c", "container": "train", "gpu_uuid": GPU1}
    assert value(s, "gpushare_container_nvml_memory_used_bytes", **c) == 6000 * MIB


def test_state_file_limit_is_the_limit_when_it_differs(tmp_path: Path, proc_root: Path) -> None:
    the_pod = pod("a", {"main": [share(GPU0, 0, 2048)]})
    directory = statefile.container_dir(tmp_path, the_pod["metadata"]["uid"], "main")
    directory.mkdir(parents=True)
    (directory / statefile.FILE_NAME).write_bytes(statefile.encode([(1024 * MIB, 0)]))
    collector = MonitorCollector(
        NODE,
        lambda: [gpu(GPU0, 0)],
        StaticPodSource([the_pod]),
        state_root=tmp_path,
        proc_root=proc_root,
    )
    s = scrape(collector)
    assert value(s, "gpushare_container_memory_limit_bytes", pod="a") == 1024 * MIB
    assert value(s, "gpushare_container_memory_allocated_bytes", pod="a") == 2048 * MIB


def test_multi_gpu_container_reads_each_gpu_at_its_container_index(
    tmp_path: Path, proc_root: Path
) -> None:
    # Shares on node GPUs 2 and 0: inside the container they are devices 1 and 0.
    the_pod = pod("m", {"main": [share(GPU2, 2, 1024), share(GPU0, 0, 1024)]})
    directory = statefile.container_dir(tmp_path, the_pod["metadata"]["uid"], "main")
    directory.mkdir(parents=True)
    (directory / statefile.FILE_NAME).write_bytes(
        statefile.encode([(1024 * MIB, 11 * MIB), (1024 * MIB, 22 * MIB)])
    )
    collector = MonitorCollector(
        NODE,
        lambda: [gpu(GPU0, 0), gpu(GPU2, 2)],
        StaticPodSource([the_pod]),
        state_root=tmp_path,
        proc_root=proc_root,
    )
    s = scrape(collector)
    assert value(s, "gpushare_container_state_memory_used_bytes", gpu_uuid=GPU0) == 11 * MIB
    assert value(s, "gpushare_container_state_memory_used_bytes", gpu_uuid=GPU2) == 22 * MIB


def test_unstarted_and_ended_containers(node: MonitorCollector) -> None:
    s = scrape(node)
    # d has no container ID yet: its allocation shows, its processes cannot be recognised.
    assert value(s, "gpushare_container_memory_allocated_bytes", pod="d") == 512 * MIB
    assert absent(s, "gpushare_container_nvml_memory_used_bytes", pod="d")
    for name in s:
        assert absent(s, name, pod="done")


def test_compute_series(node: MonitorCollector) -> None:
    s = scrape(node)
    assert value(s, "gpushare_container_compute_limit_ratio", pod="a") == 0.3
    assert value(s, "gpushare_container_compute_limit_ratio", pod="b") == 1.0  # no limit
    # c is alone on GPU1: the GPU's utilisation is its own. GPU0 has several users and no
    # per-process figures: no series rather than a guess.
    assert value(s, "gpushare_container_compute_utilization_ratio", pod="c") == 0.9
    assert absent(s, "gpushare_container_compute_utilization_ratio", pod="a")


def test_per_process_utilisation_is_summed_per_container(proc_root: Path) -> None:
    pods = [pod("a", {"main": [share(GPU0, 0, 1024)]}), pod("b", {"main": [share(GPU0, 0, 1024)]})]
    write_proc(proc_root, 1, cgroup_text("default", "a", "main"))
    write_proc(proc_root, 2, cgroup_text("default", "a", "main"))
    write_proc(proc_root, 3, cgroup_text("default", "b", "main"))
    sample = gpu(GPU0, 0, (1, MIB), (2, MIB), (3, MIB), process_utilization={1: 0.2, 2: 0.1})
    collector = MonitorCollector(
        NODE, lambda: [sample], StaticPodSource(pods), state_root=None, proc_root=proc_root
    )
    s = scrape(collector)
    assert value(s, "gpushare_container_compute_utilization_ratio", pod="a") == pytest.approx(0.3)
    assert value(s, "gpushare_container_compute_utilization_ratio", pod="b") == 0.0


def test_counters_and_state_file_errors(node: MonitorCollector, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="gpushare.monitor"):
        s = scrape(node)
        scrape(node)
    assert value(s, "gpushare_container_refused_allocations_total", pod="a") == 3
    assert value(s, "gpushare_container_watchdog_stops_total", pod="a") == 0
    assert value(s, "gpushare_monitor_state_file_errors", node=NODE) == 1
    problems = [r.getMessage() for r in caplog.records if "truncated" in r.getMessage()]
    assert len(problems) == 1, problems  # logged once, not at every scrape


def test_every_metric_is_exposed_with_its_labels(node: MonitorCollector) -> None:
    s = scrape(node)
    for spec in METRICS:
        assert s.get(spec.name), f"{spec.name} has no series"
        for labels in s[spec.name]:
            assert {k for k, _ in labels} == set(spec.labels), spec.name
