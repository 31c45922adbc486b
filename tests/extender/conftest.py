"""A local control plane whose kube-scheduler calls a gpushare extender run in this process.

The cluster helpers come from tests/cluster/conftest.py (loaded by path: two conftest
modules cannot both be imported as ``conftest``). Its session ``cluster`` runs without the
extender; ``extender_cluster`` here is a second one, small, with the extender's entry in
kube-scheduler's configuration pointing at a free port where the extender serves.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client, KubeConfig
from lightkube.resources.core_v1 import Namespace, Pod

from gpushare import protocol
from gpushare.cluster import ClusterInfo, NodeSpec, down, up
from gpushare.cluster.processes import free_port
from gpushare.extender.binding import BindingClient
from gpushare.extender.cache import ClusterCache
from gpushare.extender.nudge import CapacityNudger
from gpushare.extender.server import BIND_THREADS, Extender, make_server, serve_in_thread
from gpushare.extender.watch import KubeBinder, Watcher

_spec = importlib.util.spec_from_file_location(
    "gpushare_cluster_fixtures", Path(__file__).parents[1] / "cluster" / "conftest.py"
)
assert _spec is not None and _spec.loader is not None
cluster_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cluster_fixtures)
k8s_bin_dir = cluster_fixtures.k8s_bin_dir


@pytest.fixture(scope="session")
def cluster_helpers() -> Any:
    """tests/cluster/conftest.py as a module: wait_for, assert_no_processes_left."""
    return cluster_fixtures


# 2 nodes of 2 T4 (16 GiB): small enough that tests can fill GPUs and nodes.
EXTENDER_NODES = NodeSpec(count=2, gpus_per_node=2, gpu_model="T4")


@dataclass
class ExtenderCluster:
    info: ClusterInfo
    cache: ClusterCache
    extender: Extender
    nudger: CapacityNudger


@pytest.fixture(scope="session")
def extender_cluster(
    tmp_path_factory: pytest.TempPathFactory, k8s_bin_dir: Path
) -> Iterator[ExtenderCluster]:
    state_dir = tmp_path_factory.mktemp("extender-cluster") / "state"
    port = free_port()
    url = f"http://127.0.0.1:{port}{protocol.EXTENDER_PATH_PREFIX}"
    cache = ClusterCache()
    client: Client | None = None
    watcher: Watcher | None = None
    nudger: CapacityNudger | None = None
    httpd = None
    try:
        info = up(
            state_dir,
            EXTENDER_NODES,
            bin_dir=k8s_bin_dir,
            extender=True,
            extender_url=url,
            tie_to_parent=True,
        )
        config = KubeConfig.from_file(info.kubeconfig)
        client = Client(config=config, field_manager="extender")
        binder = KubeBinder(client, BindingClient(config.get(), BIND_THREADS))
        nudger = CapacityNudger(binder.annotate_node)
        cache.on_freed = nudger.freed
        nudger.start()
        extender = Extender(cache, binder, None, nudger)
        httpd = make_server(extender, "127.0.0.1", port)
        serve_in_thread(httpd)
        watcher = Watcher(client, cache, resync_s=30)
        watcher.start()
        deadline = time.monotonic() + 30
        while not (cache.ready and len(cache.ledger) == EXTENDER_NODES.count):
            assert time.monotonic() < deadline, "the extender's cache did not sync"
            time.sleep(0.05)
        yield ExtenderCluster(info, cache, extender, nudger)
    finally:
        if watcher is not None:
            watcher.stop()
        if nudger is not None:
            nudger.stop()
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        down(state_dir, timeout=10)
        cluster_fixtures.assert_no_processes_left(state_dir)
        if client is not None:
            client.close()


@pytest.fixture(scope="session")
def ekube(extender_cluster: ExtenderCluster) -> Iterator[Client]:
    client = Client(
        config=KubeConfig.from_file(extender_cluster.info.kubeconfig), field_manager="tests"
    )
    yield client
    client.close()


@pytest.fixture
def ens(ekube: Client, extender_cluster: ExtenderCluster, request) -> Iterator[str]:
    """A namespace for one test; its pods are deleted afterwards and the cache lets go."""
    name = f"x-{request.node.name.lower().replace('_', '-')[:40].strip('-')}"
    ekube.create(Namespace.from_dict({"metadata": {"name": name}}))
    try:
        yield name
    finally:
        for item in ekube.list(Pod, namespace=name):
            ekube.delete(Pod, item.metadata.name, namespace=name, grace_period=0)
        ekube.delete(Namespace, name)
        deadline = time.monotonic() + 10
        while any(key.startswith(f"{name}/") for key in extender_cluster.cache.pods):
            assert time.monotonic() < deadline, "the extender did not see the pods go"
            time.sleep(0.05)


@pytest.fixture
def ewatch(extender_cluster: ExtenderCluster) -> Callable[..., Any]:
    def wait(resource: Any, name: str, predicate: Callable[[Any], bool], **kwargs: Any) -> Any:
        return cluster_fixtures.wait_for(
            extender_cluster.info.kubeconfig, resource, name, predicate, **kwargs
        )

    return wait
