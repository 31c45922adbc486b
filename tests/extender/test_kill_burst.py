"""SIGKILL the extender (a `gpushare extender` process) in the middle of a burst of pods.

After a restart and once every pod has settled (bound, or unschedulable with a reason),
the invariant is checked over all pod annotations: no GPU holds more than its capacity, an
exclusive GPU holds one pod, every bound pod has its allocation, and no pod is lost (a
pending pod could not fit anywhere in what is left).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from lightkube import AsyncClient, Client, KubeConfig
from lightkube.resources.core_v1 import Namespace, Pod

from gpushare import protocol
from gpushare.cluster import NodeSpec, down, up
from gpushare.cluster.processes import free_port

# 5 nodes of 8 T4 (16 GiB): 40 GPUs. 10 exclusive pods take 10 of them; 490 shares of 1 GiB
# meet 30 x 16 = 480 GiB, so about ten stay pending: capacity is contended to the end.
NODES = NodeSpec(count=5, gpus_per_node=8, gpu_model="T4", pods_per_node=250)
GPU_MIB = 16 * 1024
BURST = 500
EXCLUSIVE = 10
KILL_AFTER_BOUND = 120
SETTLE_TIMEOUT_S = 240


def _pod(index: int) -> Pod:
    exclusive = index % (BURST // EXCLUSIVE) == 0
    limits = (
        {protocol.RESOURCE_GPU_COUNT: "1"} if exclusive else {protocol.RESOURCE_GPU_MEMORY: "1"}
    )
    return Pod.from_dict(
        {
            "metadata": {"name": f"b{index:03d}"},
            "spec": {
                "containers": [
                    {"name": "main", "image": "busybox", "resources": {"limits": limits}}
                ]
            },
        }
    )


def _settled(pod: Pod) -> bool:
    if pod.spec.nodeName:
        return True
    conditions = (pod.status.conditions if pod.status else None) or []
    return any(
        c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
        for c in conditions
    )


def _watch_until(
    kubeconfig: Path, namespace: str, done: Callable[[dict[str, Pod]], bool], timeout: float
) -> dict[str, Pod]:
    """Watch the namespace's pods until ``done(pods by name)``; the pods, or a failure.

    The deadline holds even when no event comes: lightkube's watch reconnects by itself when
    the server ends it, so it runs under an asyncio timeout rather than a check per event.
    """
    pods: dict[str, Pod] = {}

    async def watch() -> None:
        client = AsyncClient(config=KubeConfig.from_file(kubeconfig))
        try:
            async with asyncio.timeout(timeout):
                # A watch without a version starts with every pod's current state.
                async for kind, obj in client.watch(Pod, namespace=namespace):
                    if kind == "DELETED":
                        pods.pop(obj.metadata.name, None)
                    else:
                        pods[obj.metadata.name] = obj
                    if done(pods):
                        return
        finally:
            await client.close()

    try:
        asyncio.run(watch())
    except TimeoutError:
        pending = sorted(n for n, p in pods.items() if not _settled(p))
        states = {n: _state(pods[n]) for n in pending[:5]}
        pytest.fail(
            f"not settled in {timeout} s: {len(pods)} pods seen, unsettled {pending[:10]}; "
            f"first states: {states}"
        )
    return pods


def _state(pod: Pod) -> list[tuple[str, str, str | None]]:
    conditions = (pod.status.conditions if pod.status else None) or []
    return [(c.type, c.status, c.reason) for c in conditions]


@pytest.fixture(scope="module")
def kill_cluster(tmp_path_factory: pytest.TempPathFactory, k8s_bin_dir: Path, cluster_helpers):
    state_dir = tmp_path_factory.mktemp("kill-cluster") / "state"
    url = f"http://127.0.0.1:{free_port()}{protocol.EXTENDER_PATH_PREFIX}"
    try:
        info = up(
            state_dir,
            NODES,
            bin_dir=k8s_bin_dir,
            extender=True,
            extender_url=url,
            tie_to_parent=True,
        )
        yield info, url, state_dir.parent
    finally:
        down(state_dir, timeout=10)
        cluster_helpers.assert_no_processes_left(state_dir)


def _start_extender(kubeconfig: Path, url: str, log: Path) -> subprocess.Popen:
    with log.open("ab") as sink:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpushare.cli.main",
                "extender",
                f"--kubeconfig={kubeconfig}",
                f"--url={url}",
                "--log-level=WARNING",
            ],
            stdout=sink,
            stderr=sink,
        )


@pytest.fixture
def extender_process(kill_cluster) -> Iterator[Callable[[], subprocess.Popen]]:
    info, url, work = kill_cluster
    started: list[subprocess.Popen] = []

    def start() -> subprocess.Popen:
        started.append(_start_extender(info.kubeconfig, url, work / "extender.log"))
        return started[-1]

    yield start
    for process in started:
        if process.poll() is None:
            process.terminate()
            process.wait(10)


def test_sigkill_in_a_burst_loses_nothing_and_allocates_nothing_twice(
    kill_cluster, extender_process
) -> None:
    info, _, work = kill_cluster
    kube = Client(config=KubeConfig.from_file(info.kubeconfig), field_manager="tests")
    namespace = "burst"
    kube.create(Namespace.from_dict({"metadata": {"name": namespace}}))
    began = time.monotonic()
    first = extender_process()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: kube.create(_pod(i), namespace=namespace), range(BURST)))

    def enough_bound(pods: dict[str, Pod]) -> bool:
        return sum(bool(p.spec.nodeName) for p in pods.values()) >= KILL_AFTER_BOUND

    _watch_until(info.kubeconfig, namespace, enough_bound, 120)
    first.kill()  # SIGKILL
    assert first.wait(10) == -9
    extender_process()
    pods = _watch_until(
        info.kubeconfig,
        namespace,
        lambda pods: len(pods) == BURST and all(map(_settled, pods.values())),
        SETTLE_TIMEOUT_S,
    )
    elapsed = time.monotonic() - began
    kube.close()

    used: dict[str, int] = {}  # GPU uuid: MiB held by shares
    exclusive: dict[str, list[str]] = {}  # GPU uuid: pods holding it whole
    shared_by: dict[str, list[str]] = {}
    pending: list[str] = []
    for name, pod in pods.items():
        annotations = pod.metadata.annotations or {}
        if not pod.spec.nodeName:
            pending.append(name)
            continue
        assert protocol.ANNOTATION_ALLOCATION in annotations, f"{name} bound with no allocation"
        allocation = protocol.decode_allocation(annotations[protocol.ANNOTATION_ALLOCATION])
        assert set(allocation) == {"main"}
        for share in allocation["main"]:
            assert share.uuid.startswith("GPU-")
            if share.exclusive:
                exclusive.setdefault(share.uuid, []).append(name)
            else:
                used[share.uuid] = used.get(share.uuid, 0) + share.memory_mib
                shared_by.setdefault(share.uuid, []).append(name)
    for uuid, holders in exclusive.items():
        assert len(holders) == 1 and uuid not in used, f"GPU {uuid} exclusive to {holders}"
    for uuid, mib in used.items():
        assert mib <= GPU_MIB, f"GPU {uuid}: {mib} MiB allocated over {GPU_MIB}"
    # Nothing lost: a pod pending now could not fit in what is left.
    total_gpus = NODES.count * NODES.gpus_per_node
    free_whole = total_gpus - len(exclusive) - len(used)
    free_share = free_whole > 0 or any(mib < GPU_MIB for mib in used.values())
    for name in pending:
        wants_whole = name in {f"b{i:03d}" for i in range(0, BURST, BURST // EXCLUSIVE)}
        assert not (free_whole if wants_whole else free_share), (
            f"{name} pending though it fits; log: {(work / 'extender.log').read_text()[-2000:]}"
        )
    bound = BURST - len(pending)
    print(
        f"\n{BURST} pods, SIGKILL after {KILL_AFTER_BOUND} bound: {bound} bound, "
        f"{len(pending)} pending, settled in {elapsed:.1f} s"
    )
    assert bound >= BURST - 20
