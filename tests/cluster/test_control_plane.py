"""The session's control plane: processes, simulated nodes, and the real kube-scheduler."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from lightkube import Client
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Node, Pod

from gpushare import protocol
from gpushare.cluster import ClusterInfo, configs, heartbeat, nodes, pki, status
from gpushare.cluster.pki import load as load_pki

PAUSE_IMAGE = "registry.k8s.io/pause:3.10"  # never pulled: no kubelet runs


def test_fixture_comes_up(cluster: ClusterInfo) -> None:
    found = status(cluster.state_dir)
    assert found.running, found
    assert set(found.alive) == {"etcd", "kube-apiserver", "kube-scheduler", "heartbeat"}
    assert (found.nodes_total, found.nodes_ready) == (4, 4)
    assert cluster.apiserver_url.startswith("https://127.0.0.1:")


def test_apiserver_refuses_anonymous_requests(cluster: ClusterInfo) -> None:
    context = ssl.create_default_context(cafile=str(load_pki(cluster.state_dir / "pki").ca.cert))
    try:
        urllib.request.urlopen(f"{cluster.apiserver_url}/api/v1/nodes", context=context)
    except urllib.error.HTTPError as error:
        assert error.code == 401
    else:
        raise AssertionError("an anonymous request was answered")


def test_nodes_ready_with_gpu_capacity(kube: Client) -> None:
    nodes = list(kube.list(Node, labels={protocol.LABEL_SIMULATED: "true"}))
    assert sorted(n.metadata.name for n in nodes) == [f"gpu-node-{i:02d}" for i in range(4)]
    for node in nodes:
        conditions = {c.type: c.status for c in node.status.conditions}
        assert conditions["Ready"] == "True"
        assert conditions["MemoryPressure"] == "False"
        assert not node.spec.taints  # nothing keeps pods off a simulated node
        expected = {
            "cpu": "64",
            "memory": "512Gi",
            "pods": "110",
            "gpushare.io/gpu-mem": str(8 * 141),
            "gpushare.io/gpu-core": "800",
            "gpushare.io/gpu": "8",
        }
        assert node.status.capacity == expected
        assert node.status.allocatable == expected
        assert node.metadata.labels[protocol.LABEL_ENABLED] == "true"
        assert node.metadata.labels[protocol.LABEL_GPU_MODEL] == "H200"
        gpus = protocol.decode_gpus(node.metadata.annotations[protocol.ANNOTATION_GPUS])
        assert [g.index for g in gpus] == list(range(8))
        assert {(g.model, g.memory_mib, g.healthy) for g in gpus} == {("H200", 141 * 1024, True)}
        assert [g.numa for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
        assert len({g.uuid for g in gpus}) == 8 and all(g.uuid.startswith("GPU-") for g in gpus)


def test_node_leases_are_renewed(kube: Client, watch_until: Callable[..., Any]) -> None:
    lease = kube.get(Lease, "gpu-node-00", namespace=protocol.NODE_LEASE_NAMESPACE)
    assert lease.spec.holderIdentity == "gpu-node-00"
    assert lease.spec.leaseDurationSeconds == protocol.NODE_LEASE_DURATION_S
    assert lease.metadata.ownerReferences[0].kind == "Node"
    first = lease.spec.renewTime
    # The heartbeat renews every 10 s.
    watch_until(
        Lease,
        "gpu-node-00",
        lambda obj: obj.spec.renewTime > first,
        namespace=protocol.NODE_LEASE_NAMESPACE,
        timeout=30,
    )


def _pod(name: str, requests: dict[str, str]) -> Pod:
    return Pod.from_dict(
        {
            "metadata": {"name": name},
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "image": PAUSE_IMAGE,
                        "resources": {"requests": requests, "limits": requests},
                    }
                ]
            },
        }
    )


def _condition(pod: Pod, kind: str) -> Any:
    for condition in (pod.status.conditions or []) if pod.status else []:
        if condition.type == kind:
            return condition
    return None


def test_plain_pod_is_scheduled_onto_a_simulated_node(
    kube: Client, namespace: str, watch_until: Callable[..., Any]
) -> None:
    kube.create(_pod("plain", {"cpu": "100m", "memory": "64Mi"}), namespace=namespace)
    pod = watch_until(Pod, "plain", lambda p: bool(p.spec.nodeName), namespace=namespace)
    assert pod.spec.nodeName.startswith("gpu-node-")
    assert _condition(pod, "PodScheduled").status == "True"
    assert pod.status.phase == "Pending"  # bound, never started: no kubelet


def test_scheduler_counts_gpushare_resources_without_the_extender(
    kube: Client, namespace: str, watch_until: Callable[..., Any]
) -> None:
    """Without the extender the scheduler treats gpushare.io/* as ordinary node resources."""
    kube.create(_pod("fits", {"gpushare.io/gpu-mem": "1000"}), namespace=namespace)
    kube.create(_pod("too-big", {"gpushare.io/gpu-mem": "2000"}), namespace=namespace)
    assert watch_until(Pod, "fits", lambda p: bool(p.spec.nodeName), namespace=namespace)

    def unschedulable(pod: Pod) -> bool:
        condition = _condition(pod, "PodScheduled")
        return condition is not None and condition.reason == "Unschedulable"

    pod = watch_until(Pod, "too-big", unschedulable, namespace=namespace)
    assert "Insufficient gpushare.io/gpu-mem" in _condition(pod, "PodScheduled").message


def test_real_scheduler_accepts_the_project_config_with_the_extender(
    k8s_bin_dir: Path, tmp_path: Path
) -> None:
    """kube-scheduler validates deploy/scheduler/kube-scheduler-config.yaml (extender included)
    and writes out the result, without connecting anywhere."""
    kubeconfig = tmp_path / "kubeconfig"
    made = pki.create(tmp_path / "pki")
    configs.write_kubeconfig(kubeconfig, "https://127.0.0.1:1", made.ca.cert, "s", made.scheduler)
    config = tmp_path / "config.yaml"
    out = tmp_path / "out.yaml"
    for extender in (True, False):
        config.write_text(configs.render_scheduler_config(kubeconfig, extender=extender))
        result = subprocess.run(
            [str(k8s_bin_dir / "kube-scheduler"), f"--config={config}", f"--write-config-to={out}"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr[-2000:]
        written = yaml.safe_load(out.read_text())
        if extender:
            (entry,) = written["extenders"]
            assert entry["urlPrefix"].endswith(protocol.EXTENDER_PATH_PREFIX)
            assert [r["name"] for r in entry["managedResources"]] == list(
                protocol.SCHEDULER_MANAGED_RESOURCES
            )
        else:
            assert not written.get("extenders")


def test_heartbeat_refreshes_ready_condition(cluster: ClusterInfo, kube: Client) -> None:
    """What the heartbeat does each minute: a newer heartbeat time, the same transition time."""

    def ready(node: Node) -> Any:
        return next(c for c in node.status.conditions if c.type == "Ready")

    before = ready(kube.get(Node, "gpu-node-01"))
    time.sleep(1.1)  # heartbeat times have whole seconds

    async def refresh() -> None:
        client = nodes.client_for(cluster.kubeconfig)
        try:
            await heartbeat.refresh_status(client, ["gpu-node-01"])
        finally:
            await client.close()

    asyncio.run(refresh())
    after = ready(kube.get(Node, "gpu-node-01"))
    assert after.status == "True" and after.reason == "KubeletReady"
    assert after.lastHeartbeatTime > before.lastHeartbeatTime
    assert after.lastTransitionTime == before.lastTransitionTime
