"""The watchdog: the decision alone, and stopping real over-limit processes on the mock GPU."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from monitor_helpers import (
    GPU0,
    GPU1,
    MIB,
    cgroup_text,
    container_id,
    hold,
    pod,
    release,
    sampler,
    share,
    write_config,
    write_proc,
)

from gpushare.monitor.attribution import Usage
from gpushare.monitor.cgroup import ContainerRef
from gpushare.monitor.pods import Container, StaticPodSource, containers_of
from gpushare.monitor.watchdog import EVENT_REASON_STOPPED, Watchdog, decide, kill_if_owned


def _container(exclusive: bool = False, limit_mib: int = 1024) -> Container:
    (only,) = containers_of(pod("p", {"main": [share(GPU0, 0, limit_mib, 0, exclusive)]}))
    return only


def _usage(used_mib: int, **kw) -> Usage:
    return Usage(kw.pop("container", None) or _container(), GPU0, used_mib * MIB, **kw)


KEY = (_container().pod_uid, "main", GPU0)


def test_over_the_limit_waits_out_the_grace_period() -> None:
    first = decide([_usage(2000)], {}, now=100.0, grace_s=30, tolerance_bytes=0)
    assert first.stop == () and [v.used_bytes for v in first.over] == [2000 * MIB]
    assert first.over_since == {KEY: 100.0}
    later = decide([_usage(2000)], first.over_since, now=129.9, grace_s=30, tolerance_bytes=0)
    assert later.stop == () and later.over_since == {KEY: 100.0}
    due = decide([_usage(2000)], later.over_since, now=130.0, grace_s=30, tolerance_bytes=0)
    (verdict,) = due.stop
    assert (verdict.used_bytes, verdict.limit_bytes, verdict.over_for_s) == (
        2000 * MIB,
        1024 * MIB,
        30.0,
    )
    assert due.over_since == {}  # stopped: a new episode starts from scratch


def test_one_look_under_the_limit_resets_the_clock() -> None:
    first = decide([_usage(2000)], {}, now=0.0, grace_s=30, tolerance_bytes=0)
    under = decide([_usage(1000)], first.over_since, now=20.0, grace_s=30, tolerance_bytes=0)
    assert under.over_since == {} and under.stop == () and under.over == ()
    again = decide([_usage(2000)], under.over_since, now=40.0, grace_s=30, tolerance_bytes=0)
    assert again.stop == () and again.over_since == {KEY: 40.0}


def test_tolerance_exclusive_and_unknown_are_never_stopped() -> None:
    cases = [
        ([_usage(1024 + 200)], 256 * MIB),  # within the tolerance
        ([_usage(5000, container=_container(exclusive=True))], 0),  # the GPU is its own
        ([_usage(5000, unknown=True)], 0),  # the driver did not say how much
    ]
    for usage, tolerance in cases:
        decision = decide(usage, {}, now=0.0, grace_s=0, tolerance_bytes=tolerance)
        assert decision.stop == () and decision.over == (), usage


def test_a_process_of_another_cgroup_is_not_killed(proc_root: Path) -> None:
    victim = subprocess.Popen(["sleep", "60"])
    try:
        write_proc(proc_root, victim.pid, "0::/system.slice/other.service\n")
        owner = ContainerRef("8f4b2c1e-5d6a-4b7c-9e8f-0a1b2c3d4e5f", "0" * 64)
        assert kill_if_owned(proc_root, victim.pid, owner) is False
        assert victim.poll() is None
        assert kill_if_owned(proc_root, 2**22 + 1, owner) is False  # no such pid
    finally:
        victim.kill()
        victim.wait()


class Events:
    def __init__(self) -> None:
        self.recorded: list[tuple[str, str, str, str]] = []

    def record(self, container: Container, reason: str, message: str) -> None:
        self.recorded.append((container.pod, container.name, reason, message))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def node(native_build: Path, tmp_path: Path, proc_root: Path):
    """Real processes on the mock GPUs, mapped to containers by a fixture /proc:

    greedy (1 GiB share) has two processes, one holding 1.5 GiB and a context, one a context;
    modest (1 GiB share) 100 MiB and a context; whole (GPU1, exclusive) 3 GiB; a host process
    in no container holds 2 GiB on GPU0."""
    config = write_config(tmp_path / "mock.json")
    pods = [
        pod("greedy", {"main": [share(GPU0, 0, 1024)]}),
        pod("modest", {"main": [share(GPU0, 0, 1024)]}),
        pod("whole", {"main": [share(GPU1, 1, 8192, 100, exclusive=True)]}),
    ]
    processes = {
        "greedy": hold(config, 0, 1536),
        "greedy2": hold(config, 0, 0),
        "modest": hold(config, 0, 100),
        "whole": hold(config, 1, 3072),
        "host": hold(config, 0, 2048),
    }
    for name, process in processes.items():
        if name == "host":
            write_proc(proc_root, process.pid, "0::/system.slice/render.service\n")
        else:
            write_proc(proc_root, process.pid, cgroup_text("default", name.rstrip("2"), "main"))
    yield config, StaticPodSource(pods), processes
    release(list(processes.values()))


def test_stops_the_over_limit_container_and_nothing_else(node, proc_root: Path) -> None:
    config, source, processes = node
    events, clock = Events(), Clock()
    watchdog = Watchdog(
        sampler(config),
        source.containers,
        proc_root,
        events=events,
        grace_s=30,
        tolerance_bytes=0,
        clock=clock,
    )
    assert watchdog.tick() == ()  # over, but the grace period has just begun
    assert watchdog.over() == {(source.containers()[0].pod_uid, "main", GPU0)}
    clock.now += 30
    (verdict,) = watchdog.tick()
    assert verdict.container.pod == "greedy"
    # greedy's two processes: 1536 MiB + two 300 MiB contexts against 1024 MiB.
    assert verdict.used_bytes == (1536 + 600) * MIB and verdict.limit_bytes == 1024 * MIB
    for name in ("greedy", "greedy2"):
        assert processes[name].wait(timeout=10) == -9  # SIGKILL
    for name in ("modest", "whole", "host"):
        assert processes[name].poll() is None, name
    ((pod_name, container, reason, message),) = events.recorded
    assert (pod_name, container, reason) == ("greedy", "main", EVENT_REASON_STOPPED)
    assert "used 2.09 GiB of GPU" in message and "limit of 1.00 GiB for 30 s" in message
    pids = sorted([processes["greedy"].pid, processes["greedy2"].pid])
    assert f"stopped its GPU processes {pids} (SIGKILL)" in message
    assert watchdog.stops() == {("default", "greedy", "main"): 1}
    clock.now += 30
    assert watchdog.tick() == ()  # the killed processes are gone from NVML's list
    assert watchdog.over() == set()


def test_dry_run_only_reports(node, proc_root: Path) -> None:
    config, source, processes = node
    events, clock = Events(), Clock()
    watchdog = Watchdog(
        sampler(config),
        source.containers,
        proc_root,
        events=events,
        grace_s=0,
        tolerance_bytes=0,
        dry_run=True,
        clock=clock,
    )
    (verdict,) = watchdog.tick()
    assert verdict.container.pod == "greedy"
    assert all(process.poll() is None for process in processes.values())
    ((_, _, _, message),) = events.recorded
    assert "dry run: processes" in message and "not stopped" in message
    assert watchdog.stops() == {}


def test_a_pid_that_moved_to_another_cgroup_is_spared(node, proc_root: Path) -> None:
    # The cgroup is read again after the pid is pinned: a process that no longer belongs to
    # the container (what a reused pid looks like) is left alone.
    _, source, processes = node
    greedy = processes["greedy"]
    owner = ContainerRef(source.containers()[0].pod_uid, container_id("default/greedy/main"))
    write_proc(proc_root, greedy.pid, "0::/system.slice/other.service\n")
    assert kill_if_owned(proc_root, greedy.pid, owner) is False
    assert greedy.poll() is None
    write_proc(proc_root, greedy.pid, cgroup_text("default", "greedy", "main"))
    assert kill_if_owned(proc_root, greedy.pid, owner) is True
    assert greedy.wait(timeout=10) == -9
