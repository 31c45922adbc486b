"""Fixtures for tests against a real local control plane (`gpushare cluster`).

``cluster`` (session scope) starts etcd, kube-apiserver and kube-scheduler with 4 simulated
8-GPU nodes in a temporary state dir and stops them at the end of the session, whatever the
tests did; it then checks that no process of that state dir is left. The processes are also
tied to the test process (PR_SET_PDEATHSIG), so even a killed pytest leaves none behind.

The binaries come from scripts/k8s-binaries (built on first use, which takes long) or from
GPUSHARE_K8S_BIN_DIR. If they cannot be had the tests fail; they do not skip.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient, Client, KubeConfig
from lightkube.resources.core_v1 import Namespace, Pod

from gpushare.cluster import ClusterError, ClusterInfo, NodeSpec, down, up
from gpushare.cluster.binaries import find_bin_dir
from gpushare.cluster.processes import processes_with, stop

FIXTURE_NODES = NodeSpec(count=4, gpus_per_node=8, gpu_model="H200")


@pytest.fixture(scope="session")
def k8s_bin_dir() -> Path:
    """The folder with etcd, kube-apiserver and kube-scheduler; a test failure without it."""
    try:
        return find_bin_dir()
    except ClusterError as error:
        problem = str(error)
    pytest.fail(
        f"the Kubernetes binaries are missing and could not be built: {problem} "
        "(run scripts/k8s-binaries, or set GPUSHARE_K8S_BIN_DIR)",
        pytrace=False,
    )


def assert_no_processes_left(state_dir: Path) -> None:
    """Fail if any process still runs from ``state_dir``; kill it first so none outlives us."""
    leftovers = processes_with(str(state_dir))
    if leftovers:
        stop(leftovers, str(state_dir), timeout=2)
        pytest.fail(f"processes of {state_dir} still ran after `down`: pids {leftovers}")


@pytest.fixture(scope="session")
def no_processes_left() -> Callable[[Path], None]:
    """``assert_no_processes_left``, for tests that run a cluster of their own."""
    return assert_no_processes_left


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory, k8s_bin_dir: Path) -> Iterator[ClusterInfo]:
    state_dir = tmp_path_factory.mktemp("cluster") / "state"
    try:
        yield up(state_dir, FIXTURE_NODES, bin_dir=k8s_bin_dir, tie_to_parent=True)
    finally:
        down(state_dir, timeout=10)
        assert_no_processes_left(state_dir)
        assert not state_dir.exists()


@pytest.fixture(scope="session")
def kube(cluster: ClusterInfo) -> Iterator[Client]:
    """A client of the cluster, as its admin."""
    client = Client(config=KubeConfig.from_file(cluster.kubeconfig), field_manager="tests")
    yield client
    client.close()


@pytest.fixture
def namespace(kube: Client, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for one test; its pods are deleted afterwards.

    Without kube-controller-manager a deleted namespace stays Terminating (no namespace
    controller empties it), so the pods are deleted first, at once (no kubelet confirms).
    """
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"t-{base}-{secrets.token_hex(3)}"
    kube.create(Namespace.from_dict({"metadata": {"name": name}}))
    try:
        yield name
    finally:
        for pod in kube.list(Pod, namespace=name):
            kube.delete(Pod, pod.metadata.name, namespace=name, grace_period=0)
        kube.delete(Namespace, name)


def wait_for(
    kubeconfig: Path,
    resource: Any,
    name: str,
    predicate: Callable[[Any], bool],
    *,
    namespace: str | None = None,
    timeout: float = 60,
) -> Any:
    """Watch ``resource`` ``name`` until ``predicate(obj)`` holds; the object, or a failure.

    A watch without a resourceVersion starts with the object's current state, so a change
    that happened before the watch began is seen too.
    """
    last: list[Any] = []

    async def watch() -> Any:
        client = AsyncClient(config=KubeConfig.from_file(kubeconfig))
        try:
            async with asyncio.timeout(timeout):
                async for _, obj in client.watch(
                    resource, namespace=namespace, fields={"metadata.name": name}
                ):
                    last[:] = [obj]
                    if predicate(obj):
                        return obj
        finally:
            await client.close()

    try:
        return asyncio.run(watch())
    except TimeoutError:
        state = last[0].to_dict() if last else "never seen"
        pytest.fail(f"{resource.__name__} {name}: condition not met in {timeout} s; last: {state}")


@pytest.fixture(scope="session")
def cli_env(k8s_bin_dir: Path) -> dict[str, str]:
    """The environment for running `gpushare cluster` as a command: binaries found at once."""
    return {**os.environ, "GPUSHARE_K8S_BIN_DIR": str(k8s_bin_dir)}


@pytest.fixture
def watch_until(cluster: ClusterInfo) -> Callable[..., Any]:
    """``wait_for`` on the session's cluster."""

    def wait(resource: Any, name: str, predicate: Callable[[Any], bool], **kwargs: Any) -> Any:
        return wait_for(cluster.kubeconfig, resource, name, predicate, **kwargs)

    return wait
