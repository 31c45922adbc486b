"""The device plugin's pure parts: inventory and the 4 MiB limit, matching, the health rule,
limits files, and the per-container files on the host."""

from __future__ import annotations

import os
import time

import grpc
import pytest
from deviceplugin_helpers import make_pod, start_harness, stop_harness
from deviceplugin_peer import DeviceStream

from gpushare import protocol
from gpushare.deviceplugin import matching
from gpushare.deviceplugin.discovery import Gpu, model_name
from gpushare.deviceplugin.files import ContainerFiles
from gpushare.deviceplugin.health import HealthTracker
from gpushare.deviceplugin.inventory import GRPC_MAX_MESSAGE_BYTES, Inventory, InventoryError
from gpushare.deviceplugin.response import limits_text

MEM = protocol.RESOURCE_GPU_MEMORY


def gpus(count: int, memory_mib: int) -> tuple[Gpu, ...]:
    return tuple(
        Gpu(f"GPU-{i:08d}-0000-0000-0000-000000000000", i, "H200", memory_mib, i % 2, f"0:{i}")
        for i in range(count)
    )


def test_eight_h200_in_mib_units_are_refused_with_the_numbers():
    with pytest.raises(InventoryError) as raised:
        Inventory(gpus(8, 141 * 1024), memory_mib_per_unit=1)
    message = str(raised.value)
    assert message.startswith(f"{MEM}: 1155072 devices need a ")
    assert "under gRPC's 4 MiB limit; use a larger memory unit (GiB)" in message


def test_eight_h200_in_gib_units_are_1128_devices():
    inventory = Inventory(gpus(8, 141 * 1024))
    assert len(inventory.devices[MEM]) == 1128
    assert len(inventory.devices[protocol.RESOURCE_GPU_CORE]) == 800
    assert len(inventory.devices[protocol.RESOURCE_GPU_COUNT]) == 8


def test_largest_mib_list_crosses_real_grpc_in_one_message(short_dir):
    """8 x 16 GiB in MiB units: 131,072 devices, under 4 MiB, through a default client."""
    node_gpus = list(gpus(8, 16 * 1024))
    harness = start_harness(short_dir, node_gpus, unit_mib=1)
    try:
        stream = harness.kubelet.stream(MEM)  # default client options: 4 MiB receive limit
        devices = stream.lists[-1]
        assert len(devices) == 8 * 16 * 1024
        size = harness.plugin.inventory.list_response(MEM, {}).ByteSize()
        assert 2 * 1024 * 1024 < size < GRPC_MAX_MESSAGE_BYTES
        pod = make_pod(
            "big",
            {"c": {MEM: 16384}},
            {"c": [protocol.ShareInfo(node_gpus[5].uuid, 5, 16384, 0)]},
            1,
        )
        harness.pods.items.append(pod)
        response = harness.kubelet.admit(MEM, 16384)
        assert response.envs[protocol.ENV_NVIDIA_VISIBLE_DEVICES] == node_gpus[5].uuid
    finally:
        stop_harness(harness)


def test_a_list_over_the_limit_is_what_a_default_client_refuses(short_dir):
    """Why the budget: past 4 MiB a kubelet-like client drops the stream."""
    node_gpus = list(gpus(2, 200 * 1024))
    inventory = Inventory(tuple(node_gpus), 1, budget_bytes=64 * 1024 * 1024)
    assert inventory.list_response(MEM, {}).ByteSize() > GRPC_MAX_MESSAGE_BYTES
    harness = start_harness(short_dir, node_gpus, unit_mib=1024)
    try:
        harness.plugin.inventory = inventory  # what the budget check would have refused
        stream = DeviceStream(harness.peer.stub(MEM))
        stream.thread.join(timeout=20)
        assert not stream.thread.is_alive()
        assert stream.error is not None
        assert stream.error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert stream.lists == []
    finally:
        stop_harness(harness)


def test_unit_ids_belong_to_their_gpu():
    inventory = Inventory(gpus(2, 2048))
    assert [i for i, _ in inventory.devices[MEM]] == ["0-0", "0-1", "1-0", "1-1"]
    assert inventory.gpu_of(MEM, "1-1") == 1
    assert inventory.gpu_of(MEM, "1-2") is None
    assert inventory.gpu_of(MEM, "x") is None
    assert inventory.gpu_of(protocol.RESOURCE_GPU_CORE, "1-63") == 1


def test_model_names():
    assert model_name("NVIDIA H200") == "H200"
    assert model_name("Tesla T4") == "T4"
    assert model_name("NVIDIA A100-SXM4-80GB") == "A100-SXM4-80GB"


def test_matching_order_is_oldest_assumption_then_name_then_place():
    node_gpus = list(gpus(2, 16384))
    one = [protocol.ShareInfo(node_gpus[0].uuid, 0, 1024, 0)]
    pods = [
        make_pod("z", {"c": {MEM: 1}}, {"c": one}, 5),
        make_pod("b", {"i": {MEM: 1}, "c": {MEM: 1}}, {"i": one, "c": one}, 3, init=("i",)),
        make_pod("a", {"c": {MEM: 1}}, {"c": one}, 3),
    ]
    pending = matching.pending_containers(pods, "node-a", 1024)
    assert [(p.key, p.container) for p in pending.containers] == [
        ("ns/a", "c"),
        ("ns/b", "i"),
        ("ns/b", "c"),
        ("ns/z", "c"),
    ]
    assert pending.by_pod["uid-b"] == frozenset({"i", "c"})
    taken = {("uid-a", "c"), ("uid-b", "i")}
    assert matching.choose(pending, MEM, 1, taken).key == "ns/b"
    assert matching.choose(pending, MEM, 2) is None


def test_malformed_requests_are_reported_not_matched():
    node_gpus = list(gpus(1, 16384))
    one = {"c": [protocol.ShareInfo(node_gpus[0].uuid, 0, 1024, 0)]}
    pod = make_pod("bad", {"c": {MEM: 1}}, one, 1)
    pod["spec"]["containers"][0]["resources"]["limits"][MEM] = "1Gi"
    excl = make_pod("excl", {"c": {protocol.RESOURCE_GPU_COUNT: 1}}, one, 1)
    odd = make_pod(
        "odd", {"c": {MEM: 1}}, one, None, annotations={protocol.ANNOTATION_ASSUME_TIME: "\u00b2"}
    )
    pending = matching.pending_containers([pod, excl, odd], "node-a", 1024)
    assert pending.containers == ()
    assert pending.problems == (
        "ns/bad: container c: gpushare.io/gpu-mem must be a whole number, got '1Gi'",
        "ns/excl: container c: gpushare.io/gpu 1 but its allocation has 1",
        "ns/odd: annotation gpushare.io/assume-time must be ns since the epoch",
    )


def test_health_rule():
    tracker = HealthTracker(["a", "b"], recovery_s=10)
    assert not tracker.xid("a", 13, now=0)  # application error
    assert tracker.xid("a", 79, now=1)
    assert not tracker.xid("a", 79, now=5)  # already unhealthy: the clock restarts
    assert tracker.healthy() == {"a": False, "b": True}
    assert tracker.due_for_probe(now=14) == []
    assert tracker.due_for_probe(now=15) == ["a"]
    assert not tracker.probed("a", ok=False)
    assert tracker.probed("a", ok=True)
    assert tracker.healthy() == {"a": True, "b": True}
    assert tracker.xid(None, 48, now=20)  # no GPU named: all of them
    assert tracker.healthy() == {"a": False, "b": False}


def test_limits_file_follows_docs_isolation_format():
    shares = (
        protocol.ShareInfo("GPU-b", 5, 3072, 25),  # in the container: index 1 (PCI order)
        protocol.ShareInfo("GPU-a", 3, 2048, 25),
    )
    assert limits_text(shares).splitlines()[1:] == [
        "state_dir=/var/run/gpushare",
        "memory_limit_bytes=3072MiB",
        "memory_limit_bytes.0=2048MiB",
        "memory_limit_bytes.1=3072MiB",
        "core_limit_percent=25",
    ]
    full = (protocol.ShareInfo("GPU-a", 0, 1024, 100),)
    assert limits_text(full).splitlines()[-1] == "core_limit_percent=0"


def test_files_of_gone_pods_are_removed(tmp_path):
    files = ContainerFiles(tmp_path)
    limits, state = files.prepare("uid-1", "c", "x=1\n")
    files.prepare("uid-2", "c", "x=1\n")
    assert oct(state.stat().st_mode & 0o7777) == "0o1777"
    assert oct(limits.stat().st_mode & 0o777) == "0o444"
    assert files.collect({"uid-1"}) == []  # uid-2 is young: kept for a grace period
    old = time.time() - 3600
    os.utime(tmp_path / "containers" / "uid-2", (old, old))
    assert files.collect({"uid-1"}) == ["uid-2"]
    assert (tmp_path / "containers" / "uid-1" / "c" / "limits.conf").exists()
    assert not (tmp_path / "containers" / "uid-2").exists()
