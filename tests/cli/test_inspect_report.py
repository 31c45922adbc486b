"""The inspect report from hand-made nodes and pods: per GPU, pending, node and cluster."""

from __future__ import annotations

from typing import Any

from gpushare import protocol
from gpushare.monitor.inspect import amount, build_report, detail_rows, summary_rows, to_json
from gpushare.protocol import GpuInfo, ShareInfo

GIB = 1024


def node(name: str, gpus: int, memory_gib: int = 16, ip: str | None = None, **kw: Any):
    inventory = [
        GpuInfo(f"GPU-{name}-{i}", i, "T4", memory_gib * GIB, 0, i not in kw.get("sick", ()))
        for i in range(gpus)
    ]
    addresses = [{"type": "Hostname", "address": name}]
    if ip:
        addresses.append({"type": "InternalIP", "address": ip})
    return {
        "metadata": {
            "name": name,
            "labels": {protocol.LABEL_ENABLED: "true"} if kw.get("enabled", True) else {},
            "annotations": {protocol.ANNOTATION_GPUS: protocol.encode_gpus(inventory)},
        },
        "status": {"addresses": addresses},
    }


def pod(name: str, node_name: str | None, shares: dict[str, list[ShareInfo]] | None, **kw: Any):
    annotations = {}
    if shares is not None:
        annotations[protocol.ANNOTATION_ALLOCATION] = protocol.encode_allocation(shares)
    limits = {protocol.RESOURCE_GPU_MEMORY: str(kw["mem"])} if "mem" in kw else {}
    if "gpu" in kw:
        limits[protocol.RESOURCE_GPU_COUNT] = str(kw["gpu"])
    return {
        "metadata": {
            "name": name,
            "namespace": kw.get("ns", "default"),
            "annotations": annotations,
        },
        "spec": {
            **({"nodeName": node_name} if node_name else {}),
            "containers": [{"name": "main", "resources": {"limits": limits}}],
        },
        "status": {"phase": kw.get("phase", "Running")},
    }


def s(node_name: str, index: int, gib: int, exclusive: bool = False) -> ShareInfo:
    return ShareInfo(f"GPU-{node_name}-{index}", index, gib * GIB, 0, exclusive)


NODES = [
    node("b-node", 2, ip="10.0.0.2"),
    node("a-node", 4, ip="10.0.0.1"),
    node("cpu", 0, enabled=False),
]
PODS = [
    pod("p1", "a-node", {"main": [s("a-node", 0, 6)]}),
    pod("p2", "a-node", {"main": [s("a-node", 0, 4)], "side": [s("a-node", 1, 2)]}),
    pod("whole", "b-node", {"main": [s("b-node", 1, 16, exclusive=True)]}),
    pod("split", "b-node", {"main": [s("b-node", 0, 1), s("b-node", 1, 0)]}, ns="team"),
    pod("raw", "a-node", None, mem=3),  # bound without the extender: pending
    pod("raw-gpu", "b-node", None, gpu=1),  # a whole GPU, bound without the extender
    pod("waiting", None, None, mem=5),  # not bound: no node's
    pod("done", "a-node", {"main": [s("a-node", 2, 8)]}, phase="Succeeded"),
    pod("cpu-only", "a-node", None),
]


def test_per_gpu_node_and_cluster_totals() -> None:
    report = build_report(NODES, PODS)
    assert [n.name for n in report.nodes] == ["a-node", "b-node"]  # sorted, GPU nodes only
    a, b = report.nodes
    assert [g.allocated_mib for g in a.gpus] == [10 * GIB, 2 * GIB, 0, 0]
    assert a.pending_mib == 3 * GIB and a.allocated_mib == 15 * GIB and a.total_mib == 64 * GIB
    assert [g.allocated_mib for g in b.gpus] == [1 * GIB, 16 * GIB]
    assert b.pending_mib == 16 * GIB  # a whole GPU of the node's size
    assert [g.exclusive for g in b.gpus] == [False, True]
    assert report.allocated_mib == 48 * GIB and report.total_mib == 96 * GIB
    assert report.percent == 50


def test_summary_table_rows() -> None:
    header, rows = summary_rows(build_report(NODES, PODS))
    assert header == [
        "NAME",
        "IPADDRESS",
        "GPU0(Allocated/Total)",
        "GPU1(Allocated/Total)",
        "GPU2(Allocated/Total)",
        "GPU3(Allocated/Total)",
        "PENDING(Allocated)",
        "GPU Memory(GiB)",
    ]
    assert rows == [
        ["a-node", "10.0.0.1", "10/16", "2/16", "0/16", "0/16", "3", "15/64"],
        ["b-node", "10.0.0.2", "1/16", "16/16", "-", "-", "16", "33/32"],
    ]


def test_detail_rows_show_each_pods_share() -> None:
    report = build_report(NODES, PODS)
    header, rows = detail_rows(report.nodes[1])
    assert header == [
        "NAME",
        "NAMESPACE",
        "GPU0(Allocated)",
        "GPU1(Allocated)",
        "PENDING(Allocated)",
    ]
    assert rows == [
        ["raw-gpu", "default", "0", "0", "16"],
        ["whole", "default", "0", "16 (exclusive)", "0"],
        ["split", "team", "1", "0", "0"],
    ]
    _, rows = detail_rows(report.nodes[0], unit="MiB")
    assert rows[0] == ["p1", "default", "6144", "0", "0", "0", "0"]
    assert rows[1] == ["p2", "default", "4096", "2048", "0", "0", "0"]


def test_json_shape() -> None:
    data = to_json(build_report(NODES, PODS, only={"b-node"}))
    assert [n["name"] for n in data["nodes"]] == ["b-node"]
    (b,) = data["nodes"]
    assert b["gpus"][1] == {
        "index": 1,
        "uuid": "GPU-b-node-1",
        "model": "T4",
        "allocatedMiB": 16 * GIB,
        "totalMiB": 16 * GIB,
        "healthy": True,
        "exclusive": True,
    }
    assert (data["allocatedMiB"], data["totalMiB"], data["percent"]) == (33 * GIB, 32 * GIB, 103)
    assert b["pods"][2] == {
        "namespace": "team",
        "name": "split",
        "gpus": {"0": 1024, "1": 0},
        "pendingMiB": 0,
        "exclusive": False,
    }


def test_bad_node_annotation_is_reported_not_fatal() -> None:
    broken = node("x", 1)
    broken["metadata"]["annotations"][protocol.ANNOTATION_GPUS] = "{oops"
    bare = node("y", 1)
    del bare["metadata"]["annotations"][protocol.ANNOTATION_GPUS]
    report = build_report([broken, bare], [pod("p", "x", None, mem=2)])
    assert report.nodes[0].problem is not None and "not JSON" in report.nodes[0].problem
    assert report.nodes[1].problem == f"no {protocol.ANNOTATION_GPUS} annotation"
    assert report.nodes[0].pending_mib == 2 * GIB and report.total_mib == 0
    assert report.percent == 0


def test_amounts() -> None:
    assert [amount(m, "GiB") for m in (0, 1024, 1536, 1100)] == ["0", "1", "1.5", "1.1"]
    assert amount(1536, "MiB") == "1536"
