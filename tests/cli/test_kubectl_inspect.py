"""`kubectl-gpushare inspect` against the local control plane, pods placed by the extender."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import Client
from lightkube.resources.core_v1 import Pod

from gpushare import protocol
from gpushare.cli import kubectl

ROOT = Path(__file__).resolve().parents[2]
COMMAND = ROOT / ".venv" / "bin" / "kubectl-gpushare"
GIB = 1024
NODES = ["gpu-node-00", "gpu-node-01"]  # 2 T4 (16 GiB) each: EXTENDER_NODES


def gpu_pod(name: str, annotations: dict[str, str] | None = None, **limits: int) -> Pod:
    names = {
        "mem": protocol.RESOURCE_GPU_MEMORY,
        "core": protocol.RESOURCE_GPU_CORE,
        "gpu": protocol.RESOURCE_GPU_COUNT,
    }
    resources = {names[k]: str(v) for k, v in limits.items()}
    return Pod.from_dict(
        {
            "metadata": {"name": name, "annotations": annotations or {}},
            "spec": {
                "containers": [
                    {"name": "main", "image": "busybox", "resources": {"limits": resources}}
                ]
            },
        }
    )


def place(kube: Client, ewatch, namespace: str, pod: Pod) -> tuple[str, list[dict[str, Any]]]:
    kube.create(pod, namespace=namespace)
    bound = ewatch(
        Pod, pod.metadata.name, lambda p: bool(p.spec.nodeName), namespace=namespace, timeout=30
    )
    allocation = json.loads(bound.metadata.annotations[protocol.ANNOTATION_ALLOCATION])
    return bound.spec.nodeName, allocation["main"]


def inspect(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    return subprocess.run(
        [str(COMMAND), "inspect", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def cells(line: str) -> list[str]:
    return re.split(r"\s{2,}", line.strip())


def gib(mib: int) -> str:
    text = f"{mib / GIB:.1f}"
    return text[:-2] if text.endswith(".0") else text


@pytest.fixture
def placed(ekube: Client, ewatch, ens: str) -> dict[str, Any]:
    """Four pods placed by the extender and one bound to gpu-node-01 without it."""
    pods = {
        "a": gpu_pod("a", mem=6),
        "b": gpu_pod("b", mem=4, core=30),
        "whole": gpu_pod("whole", gpu=1),
        "pair": gpu_pod("pair", {protocol.ANNOTATION_GPU_COUNT: "2"}, mem=8),
    }
    per_gpu = {node: [0, 0] for node in NODES}
    shares_of: dict[str, tuple[str, list[dict[str, Any]]]] = {}
    for name, pod in pods.items():
        node, shares = place(ekube, ewatch, ens, pod)
        shares_of[name] = (node, shares)
        for share in shares:
            per_gpu[node][share["index"]] += share["memoryMiB"]
    raw = gpu_pod("raw", mem=3)
    raw.spec.nodeName = NODES[1]  # bound at creation: the extender never placed it
    ekube.create(raw, namespace=ens)
    pending = {NODES[0]: 0, NODES[1]: 3 * GIB}
    return {"per_gpu": per_gpu, "pending": pending, "shares": shares_of, "namespace": ens}


def test_table_matches_the_placements(extender_cluster, placed) -> None:
    result = inspect(extender_cluster.info.kubeconfig)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert cells(lines[0]) == [
        "NAME",
        "IPADDRESS",
        "GPU0(Allocated/Total)",
        "GPU1(Allocated/Total)",
        "PENDING(Allocated)",
        "GPU Memory(GiB)",
    ]
    allocated = 0
    for line, node in zip(lines[1:3], NODES, strict=True):
        g0, g1 = placed["per_gpu"][node]
        pending = placed["pending"][node]
        node_allocated = g0 + g1 + pending
        allocated += node_allocated
        assert cells(line) == [
            node,
            "-",  # simulated nodes have no InternalIP
            f"{gib(g0)}/16",
            f"{gib(g1)}/16",
            gib(pending),
            f"{gib(node_allocated)}/32",
        ]
    assert set(lines[3]) == {"-"}
    assert lines[4] == "Allocated/Total GPU Memory In Cluster(GiB):"
    assert lines[5] == f"{gib(allocated)}/64 ({round(100 * allocated / (64 * GIB))}%)"
    assert allocated == (6 + 4 + 16 + 8 + 3) * GIB
    assert len(lines) == 6


def test_json_agrees_with_the_extenders_ledger(extender_cluster, placed) -> None:
    result = inspect(extender_cluster.info.kubeconfig, "-o", "json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    cache = extender_cluster.cache
    with cache.lock:
        ledger = {node: [0, 0] for node in NODES}
        for node in NODES:
            for allocation in cache.ledger.node_allocations(node):
                for share in allocation.gpu_shares:
                    ledger[node][share.index] += share.memory_mib
    for node in data["nodes"]:
        assert [g["allocatedMiB"] for g in node["gpus"]] == ledger[node["name"]]
        assert [g["allocatedMiB"] for g in node["gpus"]] == placed["per_gpu"][node["name"]]
        assert node["pendingMiB"] == placed["pending"][node["name"]]
    whole_node, (whole,) = placed["shares"]["whole"]
    (node,) = [n for n in data["nodes"] if n["name"] == whole_node]
    assert node["gpus"][whole["index"]]["exclusive"] is True
    pods = {p["name"]: p for n in data["nodes"] for p in n["pods"]}
    assert set(pods) == {"a", "b", "whole", "pair", "raw"}
    assert pods["pair"]["gpus"] == {"0": 4 * GIB, "1": 4 * GIB}
    assert pods["raw"] == {
        "namespace": placed["namespace"],
        "name": "raw",
        "gpus": {},
        "pendingMiB": 3 * GIB,
        "exclusive": False,
    }
    yaml_result = inspect(extender_cluster.info.kubeconfig, "-o", "yaml")
    assert yaml.safe_load(yaml_result.stdout) == data


def test_details_list_each_pods_share(extender_cluster, placed) -> None:
    result = inspect(extender_cluster.info.kubeconfig, "-d")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    namespace = placed["namespace"]
    for node in NODES:
        assert f"NAME:       {node}\nIPADDRESS:  -\n" in text
    rows = {cells(line)[0]: cells(line) for line in text.splitlines() if namespace in line}
    for name, (_, shares) in placed["shares"].items():
        on_gpu = {share["index"]: share["memoryMiB"] for share in shares}
        expected = [gib(on_gpu.get(i, 0)) for i in (0, 1)]
        if name == "whole":
            expected = [f"{c} (exclusive)" if c != "0" else c for c in expected]
        assert rows[name] == [name, namespace, *expected, "0"], name
    assert rows["raw"] == ["raw", namespace, "0", "0", "3"]
    assert text.endswith("Allocated/Total GPU Memory In Cluster(GiB):\n37/64 (58%)\n")


def test_unknown_node_and_bad_kubeconfig_are_one_line_errors(extender_cluster, tmp_path) -> None:
    result = inspect(extender_cluster.info.kubeconfig, "no-such-node")
    assert result.returncode == 1
    assert result.stderr == "kubectl gpushare: error: not gpushare nodes: no-such-node\n"
    missing = tmp_path / "absent.kubeconfig"
    result = inspect(missing)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith("kubectl gpushare: error: cannot list nodes and pods: ")
    assert str(missing) in result.stderr and result.stderr.count("\n") == 1
    result = inspect(extender_cluster.info.kubeconfig, "--context", "elsewhere")
    assert result.returncode == 1
    assert result.stderr == (
        "kubectl gpushare: error: cannot list nodes and pods: Context 'elsewhere' not found\n"
    )


def test_nodes_and_pods_are_listed_once_each(monkeypatch, tmp_path) -> None:
    calls: list[str] = []

    class Listing(list):
        resourceVersion = "1"

    class FakeClient:
        def __init__(self, **_: object) -> None:
            pass

        def list(self, resource: Any, **kwargs: Any) -> Listing:
            calls.append(resource.__name__)
            return Listing()

        def close(self) -> None:
            pass

    import lightkube

    monkeypatch.setattr(lightkube, "Client", FakeClient)
    monkeypatch.setattr(lightkube.KubeConfig, "from_file", staticmethod(lambda path: object()))
    assert kubectl.main(["inspect", "-d", "--kubeconfig", str(tmp_path / "k")]) == 0
    assert sorted(calls) == ["Node", "Pod"]
