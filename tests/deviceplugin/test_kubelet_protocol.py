"""The device plugin driven by a kubelet peer over unix sockets: registration, ListAndWatch,
GetPreferredAllocation, Allocate (shared, exclusive, identical pods, bad pods), kubelet
restarts and GPU health, all through the real v1beta1 protocol; NVML is the mock's."""

from __future__ import annotations

import grpc
import pytest
from deviceplugin_helpers import (
    GPU_MEMORY_MIB,
    NODE,
    NUMA,
    make_pod,
    share,
    start_harness,
    stop_harness,
)
from deviceplugin_peer import wait_until

from gpushare import protocol
from gpushare.deviceplugin.v1beta1 import api_pb2

MEM = protocol.RESOURCE_GPU_MEMORY
CORE = protocol.RESOURCE_GPU_CORE
GPU = protocol.RESOURCE_GPU_COUNT


def mounts(response: api_pb2.ContainerAllocateResponse) -> dict[str, tuple[str, bool]]:
    return {m.container_path: (m.host_path, m.read_only) for m in response.mounts}


def test_registers_each_resource_on_its_own_socket(harness):
    requests = harness.peer.wait_registered(3)
    assert {r.resource_name: r.endpoint for r in requests} == protocol.DEVICE_PLUGIN_SOCKETS
    assert {r.version for r in requests} == {"v1beta1"}
    preferred = {r.resource_name: r.options.get_preferred_allocation_available for r in requests}
    assert preferred == {MEM: True, GPU: True, CORE: False}
    for resource in (MEM, CORE, GPU):
        assert harness.peer.endpoint(resource).is_socket()
        options = harness.peer.stub(resource).GetDevicePluginOptions(api_pb2.Empty())
        assert not options.pre_start_required


def test_list_and_watch_advertises_every_unit(harness, nvml):
    mem = harness.kubelet.stream(MEM).lists[-1]
    core = harness.kubelet.stream(CORE).lists[-1]
    whole = harness.kubelet.stream(GPU)
    assert len(mem) == 4 * GPU_MEMORY_MIB // 1024  # GiB units
    assert len(core) == 4 * 100
    assert set(whole.lists[-1]) == {gpu.uuid for gpu in nvml.gpus}
    assert set(mem.values()) == set(core.values()) == {protocol.DEVICE_HEALTHY}
    assert whole.topology == {gpu.uuid: [NUMA[gpu.index]] for gpu in nvml.gpus}


def test_discovery_through_nvml(nvml):
    assert nvml.driver == "580.65.06"
    assert [g.index for g in nvml.gpus] == [0, 1, 2, 3]
    assert {g.model for g in nvml.gpus} == {"H200"}
    assert {g.memory_mib for g in nvml.gpus} == {GPU_MEMORY_MIB}
    assert [g.numa for g in nvml.gpus] == list(NUMA)
    assert [g.nvlink_peers for g in nvml.gpus] == [(1,), (0,), (3,), (2,)]
    assert len({g.pci_bus_id for g in nvml.gpus}) == 4


def test_shared_container_gets_its_slice(harness, nvml):
    decision = [share(nvml.gpus, 2, 4096, core=30)]
    harness.pods.items.append(make_pod("p", {"main": {MEM: 4, CORE: 30}}, {"main": decision}, 5))
    response = harness.kubelet.admit(MEM, 4)
    core = harness.kubelet.admit(CORE, 30)
    assert core == api_pb2.ContainerAllocateResponse()  # gpu-core is counted, not served
    assert response.envs[protocol.ENV_NVIDIA_VISIBLE_DEVICES] == nvml.gpus[2].uuid
    assert response.envs[protocol.ENV_GPUSHARE_POD] == "ns/p"
    found = mounts(response)
    container_dir = harness.host_root / "containers" / "uid-p" / "main"
    assert found == {
        protocol.CONTAINER_LIBRARY_PATH: ("/opt/gpushare/libgpushare.so", True),
        protocol.CONTAINER_LD_SO_PRELOAD: (str(harness.host_root / "ld.so.preload"), True),
        protocol.CONTAINER_LIMITS_PATH: (str(container_dir / "limits.conf"), True),
        protocol.CONTAINER_STATE_DIR: (str(container_dir / "state"), False),
    }
    assert (harness.host_root / "ld.so.preload").read_text() == (
        protocol.CONTAINER_LIBRARY_PATH + "\n"
    )
    limits = (container_dir / "limits.conf").read_text().splitlines()
    assert "memory_limit_bytes.0=4096MiB" in limits
    assert "core_limit_percent=30" in limits
    assert f"state_dir={protocol.CONTAINER_STATE_DIR}" in limits
    assert (container_dir / "state").is_dir()
    assert harness.pods.allocated == [("ns", "p", "uid-p")]


def test_multi_gpu_and_multi_container_pod(harness, nvml):
    allocation = {
        "setup": [share(nvml.gpus, 0, 1024)],
        "train": [share(nvml.gpus, 0, 2048), share(nvml.gpus, 1, 2048)],
    }
    pod = make_pod("multi", {"setup": {MEM: 1}, "train": {MEM: 4}}, allocation, 7, init=("setup",))
    harness.pods.items.append(pod)
    setup = harness.kubelet.admit(MEM, 1)
    assert harness.pods.allocated == []  # one of two containers served: still assumed
    train = harness.kubelet.admit(MEM, 4)
    assert setup.envs[protocol.ENV_NVIDIA_VISIBLE_DEVICES] == nvml.gpus[0].uuid
    assert train.envs[protocol.ENV_NVIDIA_VISIBLE_DEVICES] == (
        f"{nvml.gpus[0].uuid},{nvml.gpus[1].uuid}"
    )
    limits = harness.host_root / "containers" / "uid-multi" / "train" / "limits.conf"
    lines = limits.read_text().splitlines()
    assert "memory_limit_bytes.0=2048MiB" in lines and "memory_limit_bytes.1=2048MiB" in lines
    assert "core_limit_percent=0" in lines  # no compute limit asked
    assert harness.pods.allocated == [("ns", "multi", "uid-multi")]


def test_two_identical_pods_each_get_their_own_decision(harness, nvml):
    older = make_pod("older", {"c": {MEM: 2}}, {"c": [share(nvml.gpus, 1, 2048)]}, 100)
    newer = make_pod("newer", {"c": {MEM: 2}}, {"c": [share(nvml.gpus, 3, 2048)]}, 200)
    harness.pods.items.extend([newer, older])
    kubelet = harness.kubelet
    # kubelet asks its preference for both before allocating either; the plugin chooses the
    # oldest assumption first and its choice travels in the device IDs it prefers.
    first = kubelet.preferred(MEM, 2)
    kubelet.in_use.setdefault(MEM, set()).update(first)  # as kubelet would, admitting
    second = kubelet.preferred(MEM, 2)
    assert not set(first) & set(second)
    # Allocate in the other order: each set of IDs still gets the decision made for it.
    second_response = kubelet.allocate(MEM, second)
    first_response = kubelet.allocate(MEM, first)
    assert first_response.envs[protocol.ENV_NVIDIA_VISIBLE_DEVICES] == nvml.gpus[1].uuid
    assert second_response.envs[protocol.ENV_NVIDIA_VISIBLE_DEVICES] == nvml.gpus[3].uuid
    assert sorted(harness.pods.allocated) == [
        ("ns", "newer", "uid-newer"),
        ("ns", "older", "uid-older"),
    ]


def test_without_preferred_allocation_the_oldest_assumption_goes_first(harness, nvml):
    harness.pods.items.extend(
        [
            make_pod("b", {"c": {MEM: 3}}, {"c": [share(nvml.gpus, 0, 3072)]}, 20),
            make_pod("a", {"c": {MEM: 3}}, {"c": [share(nvml.gpus, 2, 3072)]}, 10),
        ]
    )
    available = harness.kubelet.available(MEM)
    one = harness.kubelet.allocate(MEM, available[:3])
    two = harness.kubelet.allocate(MEM, available[3:6])
    assert one.envs[protocol.ENV_NVIDIA_VISIBLE_DEVICES] == nvml.gpus[2].uuid  # a: older
    assert two.envs[protocol.ENV_NVIDIA_VISIBLE_DEVICES] == nvml.gpus[0].uuid
    with pytest.raises(grpc.RpcError) as raised:  # both served: a third is never guessed
        harness.kubelet.allocate(MEM, available[6:9])
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_exclusive_container_gets_the_gpus_in_its_annotation(harness, nvml):
    decision = [
        protocol.ShareInfo(nvml.gpus[i].uuid, i, GPU_MEMORY_MIB, 100, exclusive=True)
        for i in (3, 1)
    ]
    harness.pods.items.append(make_pod("x", {"c": {GPU: 2}}, {"c": decision}, 9))
    preferred = harness.kubelet.preferred(GPU, 2)
    assert preferred == [nvml.gpus[3].uuid, nvml.gpus[1].uuid]
    response = harness.kubelet.allocate(GPU, preferred)
    assert response.envs[protocol.ENV_NVIDIA_VISIBLE_DEVICES] == (
        f"{nvml.gpus[3].uuid},{nvml.gpus[1].uuid}"
    )
    assert protocol.CONTAINER_LIMITS_PATH not in mounts(response)  # whole GPUs: no slice
    assert harness.pods.allocated == [("ns", "x", "uid-x")]


def test_exclusive_container_without_preference_still_gets_its_annotated_gpus(harness, nvml):
    decision = [protocol.ShareInfo(nvml.gpus[2].uuid, 2, GPU_MEMORY_MIB, 100, exclusive=True)]
    harness.pods.items.append(make_pod("x", {"c": {GPU: 1}}, {"c": decision}, 9))
    response = harness.kubelet.allocate(GPU, [nvml.gpus[0].uuid])  # kubelet's own pick
    assert response.envs[protocol.ENV_NVIDIA_VISIBLE_DEVICES] == nvml.gpus[2].uuid


@pytest.mark.parametrize(
    ("strategies", "env", "device_mounts", "cdi"),
    [
        (("volume-mounts",), protocol.NVIDIA_DEVICE_LIST_VOLUME_DIR, True, False),
        (("cdi",), None, False, True),
        (("envvar", "cdi"), "uuid", False, True),
    ],
)
def test_device_list_strategies(nvml, short_dir, strategies, env, device_mounts, cdi):
    uuid = nvml.gpus[1].uuid
    pod = make_pod("p", {"c": {MEM: 1}}, {"c": [share(nvml.gpus, 1, 1024)]}, 1)
    harness = start_harness(short_dir, nvml.gpus, strategies=strategies, pods=[pod])
    try:
        response = harness.kubelet.admit(MEM, 1)
    finally:
        stop_harness(harness)
    expected_env = uuid if env == "uuid" else env
    assert response.envs.get(protocol.ENV_NVIDIA_VISIBLE_DEVICES) == expected_env
    device_path = f"{protocol.NVIDIA_DEVICE_LIST_VOLUME_DIR}/{uuid}"
    assert (mounts(response).get(device_path) == ("/dev/null", True)) is device_mounts
    assert [d.name for d in response.cdi_devices] == ([f"nvidia.com/gpu={uuid}"] if cdi else [])


def test_nothing_matches_is_a_clear_error_and_no_guess(harness, nvml):
    good = {"c": [share(nvml.gpus, 0, 2048)]}
    harness.pods.items.extend(
        [
            make_pod("missing", {"c": {MEM: 2}}, None, 1),
            make_pod(
                "notjson",
                {"c": {MEM: 2}},
                None,
                2,
                annotations={protocol.ANNOTATION_ALLOCATION: "{"},
            ),
            make_pod("notime", {"c": {MEM: 2}}, good, None),
            make_pod("wrongsize", {"c": {MEM: 3}}, good, 4),
            make_pod("othernode", {"c": {MEM: 2}}, good, 5, node="node-b"),
            make_pod("done", {"c": {MEM: 2}}, good, 6, phase=protocol.PHASE_ALLOCATED),
        ]
    )
    with pytest.raises(grpc.RpcError) as raised:
        harness.kubelet.admit(MEM, 2)
    error = raised.value
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    message = error.details()
    assert message.startswith(
        f"gpushare: no pod assumed on node {NODE} has a container waiting for 2 {MEM}"
    )
    assert "ns/missing: annotation gpushare.io/allocation is missing" in message
    assert "ns/notjson: gpushare.io/allocation: not JSON" in message
    assert "ns/notime: annotation gpushare.io/assume-time must be ns" in message
    assert "ns/wrongsize: container c: gpushare.io/gpu-mem 3 (3072 MiB)" in message
    assert "othernode" not in message and "done" not in message
    assert "\n" not in message
    assert not (harness.host_root / "containers").exists()
    assert harness.pods.allocated == []


def test_unknown_device_ids_are_refused(harness):
    with pytest.raises(grpc.RpcError) as raised:
        harness.kubelet.allocate(MEM, ["9-0", "zz"])
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "are not devices of node node-a" in raised.value.details()


def test_pre_start_container_is_a_no_op(harness):
    response = harness.peer.stub(MEM).PreStartContainer(
        api_pb2.PreStartContainerRequest(devices_ids=["0-0"])
    )
    assert response == api_pb2.PreStartContainerResponse()


def test_reregisters_and_serves_after_kubelet_restarts(harness, nvml):
    old_stream = harness.kubelet.stream(MEM)
    harness.peer.restart()
    harness.peer.wait_registered(6)
    assert harness.lifecycle.wait_registered(2, timeout_s=10)
    for resource in (MEM, CORE, GPU):
        assert harness.peer.endpoint(resource).is_socket()
    old_stream.thread.join(timeout=10)
    assert not old_stream.thread.is_alive()  # the old stream ended with the old servers
    harness.kubelet.streams.clear()
    harness.pods.items.append(
        make_pod("after", {"c": {MEM: 1}}, {"c": [share(nvml.gpus, 3, 1024)]}, 1)
    )
    response = harness.kubelet.admit(MEM, 1)
    assert response.envs[protocol.ENV_NVIDIA_VISIBLE_DEVICES] == nvml.gpus[3].uuid


def test_gpu_turns_unhealthy_on_a_critical_xid_and_comes_back(nvml, short_dir):
    harness = start_harness(short_dir, nvml.gpus, recovery_s=0.2)
    try:
        mem = harness.kubelet.stream(MEM)
        whole = harness.kubelet.stream(GPU)
        failed = nvml.gpus[1].uuid
        nvml.set_retirement_pending(1, True)  # a double-bit ECC error: needs a reset
        nvml.inject_xid(1, 48)
        down = mem.wait(lambda d: d["1-0"] == protocol.DEVICE_UNHEALTHY)
        assert {i for i, h in down.items() if h == protocol.DEVICE_UNHEALTHY} == {
            f"1-{u:x}" for u in range(GPU_MEMORY_MIB // 1024)
        }
        whole.wait(lambda d: d[failed] == protocol.DEVICE_UNHEALTHY)
        wait_until(
            lambda: [g.healthy for g in harness.pods.gpus] == [True, False, True, True],
            10,
            "the node annotation to mark GPU 1 unhealthy",
        )
        probes = harness.monitor.probes
        wait_until(lambda: harness.monitor.probes >= probes + 3, 10, "three failed probes")
        assert mem.lists[-1]["1-0"] == protocol.DEVICE_UNHEALTHY  # still needs its reset
        nvml.set_retirement_pending(1, False)  # reset done
        mem.wait(lambda d: set(d.values()) == {protocol.DEVICE_HEALTHY})
        whole.wait(lambda d: d[failed] == protocol.DEVICE_HEALTHY)
        wait_until(
            lambda: all(g.healthy for g in harness.pods.gpus), 10, "the annotation to recover"
        )
    finally:
        nvml.set_retirement_pending(1, False)
        stop_harness(harness)


def test_application_xids_leave_the_gpu_healthy(nvml, short_dir):
    harness = start_harness(short_dir, nvml.gpus, recovery_s=0.2)
    try:
        mem = harness.kubelet.stream(MEM)
        updates = len(mem.lists)
        nvml.inject_xid(2, 31)  # a program's page fault
        nvml.inject_xid(2, 13)
        nvml.inject_xid(0, 79)  # GPU 0 fell off the bus: critical
        mem.wait(lambda d: d["0-0"] == protocol.DEVICE_UNHEALTHY)
        wait_until(lambda: harness.monitor.events >= 3, 10, "all three events")
        assert all(
            h == protocol.DEVICE_HEALTHY for i, h in mem.lists[-1].items() if i.startswith("2-")
        )
        assert len(mem.lists) == updates + 1  # one change: GPU 0's
    finally:
        stop_harness(harness)


def test_state_directories_of_gone_pods_are_removed(nvml, short_dir):
    pod = make_pod("gone", {"c": {MEM: 1}}, {"c": [share(nvml.gpus, 0, 1024)]}, 1)
    done = make_pod("done", {"c": {MEM: 1}}, {"c": [share(nvml.gpus, 0, 1024)]}, 2)
    stay = make_pod("stay", {"c": {MEM: 1}}, {"c": [share(nvml.gpus, 1, 1024)]}, 3)
    harness = start_harness(
        short_dir, nvml.gpus, pods=[pod, done, stay], gc_interval_s=0.05, gc_grace_s=0
    )
    try:
        for _ in range(3):
            harness.kubelet.admit(MEM, 1)
        containers = harness.host_root / "containers"
        names = ["uid-done", "uid-gone", "uid-stay"]
        assert sorted(p.name for p in containers.iterdir()) == names
        with harness.pods.lock:
            harness.pods.items.remove(pod)  # the pod is deleted from the node
            done["status"]["phase"] = "Succeeded"  # its containers have exited for good
        wait_until(lambda: not (containers / "uid-gone").exists(), 10, "uid-gone removed")
        wait_until(lambda: not (containers / "uid-done").exists(), 10, "uid-done removed")
        assert (containers / "uid-stay" / "c" / "limits.conf").exists()
    finally:
        stop_harness(harness)


def test_allocate_with_other_ids_than_preferred_still_serves_the_preferred_choice(harness, nvml):
    harness.pods.items.extend(
        [
            make_pod("first", {"c": {MEM: 2}}, {"c": [share(nvml.gpus, 0, 2048)]}, 1),
            make_pod("second", {"c": {MEM: 2}}, {"c": [share(nvml.gpus, 3, 2048)]}, 2),
        ]
    )
    preferred = harness.kubelet.preferred(MEM, 2)  # chooses "first"
    other = [i for i in harness.kubelet.available(MEM) if i not in preferred][:2]
    response = harness.kubelet.allocate(MEM, other)  # kubelet picked its own IDs
    assert response.envs[protocol.ENV_NVIDIA_VISIBLE_DEVICES] == nvml.gpus[0].uuid
    assert harness.pods.allocated == [("ns", "first", "uid-first")]
