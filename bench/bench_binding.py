"""CPU per Binding call: the extender's BindingClient (urllib3) against a lightkube client.

Run: .venv/bin/python bench/bench_binding.py [--pods 1500] [--threads 64]

The extender posts one Binding per pod it places, dozens at once. This starts a local cluster
(`gpushare cluster up --no-extender`, 10 nodes, a temporary state dir, `down` in a `finally`),
creates pods no scheduler takes (schedulerName "nobody"), and binds them from --threads
threads, half through lightkube's generic client (the way the extender posted Bindings
before extender/binding.py), half through BindingClient, each with the annotations a bind
writes. It reports this process's CPU time (user + system) per Binding and the wall time:
the CPU is what the extender spends per pod outside its verbs.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from lightkube import Client, KubeConfig
from lightkube.models.core_v1 import ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Pod, PodBinding

from bench_extender_e2e import gpushare
from gpushare import protocol
from gpushare.cluster.binaries import find_bin_dir
from gpushare.extender.binding import BindingClient

ANNOTATIONS = {
    protocol.ANNOTATION_ALLOCATION: protocol.encode_allocation(
        {"main": [protocol.ShareInfo("GPU-0", 0, 1024, 0)]}
    ),
    protocol.ANNOTATION_ASSUME_TIME: "1",
    protocol.ANNOTATION_PHASE: protocol.PHASE_ASSUMED,
}
NODES = 10
Binder = Callable[[str, str, str, str, dict[str, str]], None]  # namespace, name, uid, node, ...


def lightkube_binder(config: KubeConfig) -> Binder:
    """A Binding through lightkube's generic client (the response, a Status, is not decoded)."""
    generic = Client(config=config, field_manager="bench")._client

    def bind(namespace: str, name: str, uid: str, node: str, annotations: dict[str, str]) -> None:
        binding = PodBinding(
            metadata=ObjectMeta(name=name, namespace=namespace, uid=uid, annotations=annotations),
            target=ObjectReference(kind="Node", name=node, apiVersion="v1"),
        )
        request = generic.prepare_request(
            "post", res=PodBinding, obj=binding, name=name, namespace=namespace
        )
        request.response_type = None
        generic.handle_response(
            "post", generic.send(generic.build_adapter_request(request)), request
        )

    return bind


def measure(
    bind: Binder,
    namespace: str,
    pods: list[tuple[str, str]],
    threads: int,
) -> tuple[float, float]:
    """(CPU ms per Binding, wall s) for binding ``pods`` (name, uid) from ``threads`` threads."""

    def one(index: int) -> None:
        name, uid = pods[index]
        bind(namespace, name, uid, f"node-{index % NODES:04d}", ANNOTATIONS)

    cpu, wall = time.process_time(), time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(len(pods))))
    return 1000 * (time.process_time() - cpu) / len(pods), time.perf_counter() - wall


def create_pods(client: Client, namespace: str, count: int) -> list[tuple[str, str]]:
    client.create(Namespace.from_dict({"metadata": {"name": namespace}}))

    def create(index: int) -> tuple[str, str]:
        name = f"p{index:05d}"
        pod = Pod.from_dict(
            {
                "metadata": {"name": name, "namespace": namespace},
                "spec": {
                    "schedulerName": "nobody",
                    "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
                },
            }
        )
        return name, client.create(pod).metadata.uid

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(create, range(count)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=1500, help="Bindings per client")
    parser.add_argument("--threads", type=int, default=64)
    options = parser.parse_args()
    env = {**os.environ, "GPUSHARE_K8S_BIN_DIR": str(find_bin_dir())}
    with tempfile.TemporaryDirectory(prefix="bench-binding-") as tmp:
        where = ("--state-dir", str(Path(tmp) / "cluster"))
        try:
            gpushare(env, "up", *where, "--nodes", str(NODES), "--no-extender")
            config = KubeConfig.from_file(Path(tmp) / "cluster" / "kubeconfig")
            client = Client(config=config, field_manager="bench")
            bindings = BindingClient(config.get(), options.threads)
            results = {}
            for label, bind in (
                ("lightkube (httpx)", lightkube_binder(config)),
                ("BindingClient (urllib3)", bindings.bind),
            ):
                namespace = "bench-" + label.split()[0].lower()
                pods = create_pods(client, namespace, options.pods)
                results[label] = measure(bind, namespace, pods, options.threads)
            bindings.close()
        finally:
            try:
                gpushare(env, "down", *where)
            except RuntimeError as error:
                print(error, file=sys.stderr)
    print(
        f"{options.pods} Bindings per client from {options.threads} threads, "
        f"{os.cpu_count()} CPU(s)"
    )
    print(f"{'client':<26} {'CPU ms/Binding':>15} {'wall s':>8}")
    for label, (cpu_ms, wall_s) in results.items():
        print(f"{label:<26} {cpu_ms:>15.3f} {wall_s:>8.2f}")


if __name__ == "__main__":
    main()
