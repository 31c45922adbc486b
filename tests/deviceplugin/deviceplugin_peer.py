"""A kubelet as the device plugin sees it: the Registration service on kubelet.sock and a
device plugin client per registered resource, over unix sockets, speaking v1beta1; and, on a
socket of its own, the pod resources API (v1 PodResourcesLister) reporting the device IDs the
simulated kubelet allocated to each pod's container.

``restart()`` does what a restarting kubelet does to the directory: its socket goes away with
every plugin socket in it, and a new kubelet.sock (another inode) appears.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from gpushare import protocol
from gpushare.deviceplugin.podresources_v1 import api_pb2 as pr_pb2
from gpushare.deviceplugin.podresources_v1 import api_pb2_grpc as pr_grpc
from gpushare.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc


def wait_until(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """Polls ``predicate`` until it is truthy (returns it) or fails the test at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


class _Registration(api_pb2_grpc.RegistrationServicer):
    def __init__(self, peer: KubeletPeer) -> None:
        self.peer = peer

    def Register(self, request, context):
        with self.peer.changed:
            self.peer.registrations.append(request)
            self.peer.changed.notify_all()
        return api_pb2.Empty()


class _PodResources(pr_grpc.PodResourcesListerServicer):
    def __init__(self, peer: KubeletPeer) -> None:
        self.peer = peer

    def List(self, request, context):
        with self.peer.changed:
            self.peer.lists += 1
            held = {pod: dict(containers) for pod, containers in self.peer.held.items()}
        response = pr_pb2.ListPodResourcesResponse()
        for (namespace, name), containers in sorted(held.items()):
            pod = response.pod_resources.add(name=name, namespace=namespace)
            for container, devices in sorted(containers.items()):
                entry = pod.containers.add(name=container)
                for resource, ids in sorted(devices.items()):
                    entry.devices.add(resource_name=resource, device_ids=ids)
        return response


class DeviceStream:
    """A ListAndWatch stream read by a thread into ``lists`` (each a {id: health} dict)."""

    def __init__(self, stub: api_pb2_grpc.DevicePluginStub) -> None:
        self.lists: list[dict[str, str]] = []
        self.topology: dict[str, list[int]] = {}
        self.error: grpc.RpcError | None = None  # how the stream ended, if it failed
        self.changed = threading.Condition()
        self.call = stub.ListAndWatch(api_pb2.Empty())
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for response in self.call:
                devices = {d.ID: d.health for d in response.devices}
                with self.changed:
                    self.topology = {
                        d.ID: [n.ID for n in d.topology.nodes] for d in response.devices
                    }
                    self.lists.append(devices)
                    self.changed.notify_all()
        except grpc.RpcError as error:  # cancelled, or the plugin went away
            self.error = error

    def wait(self, predicate: Callable[[dict[str, str]], bool], timeout_s: float = 10) -> dict:
        """The first list (latest first) for which ``predicate`` holds, waiting for one."""
        with self.changed:
            ok = self.changed.wait_for(
                lambda: bool(self.lists) and predicate(self.lists[-1]), timeout_s
            )
            assert ok, f"no matching device list; last: {self._summary()}"
            return self.lists[-1]

    def _summary(self) -> str:
        if not self.lists:
            return "none"
        last = self.lists[-1]
        bad = sorted(i for i, h in last.items() if h != protocol.DEVICE_HEALTHY)
        return f"{len(last)} devices, unhealthy {bad[:5]}"

    def close(self) -> None:
        self.call.cancel()


class KubeletPeer:
    """kubelet's side of the device plugin protocol in a directory of unix sockets."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.registrations: list[api_pb2.RegisterRequest] = []
        self.changed = threading.Condition()
        self.server: grpc.Server | None = None
        self.channels: list[grpc.Channel] = []
        # (namespace, name) -> container -> resource -> device IDs, as kubelet records them
        self.held: dict[tuple[str, str], dict[str, dict[str, list[str]]]] = {}
        self.lists = 0  # pod resources List calls answered
        self.pod_resources_server: grpc.Server | None = None
        self.start()

    @property
    def socket(self) -> Path:
        return self.directory / protocol.KUBELET_SOCKET_NAME

    def start(self) -> None:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        api_pb2_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port(f"unix:{self.socket}")
        server.start()
        self.server = server

    def stop(self) -> None:
        self.stop_pod_resources()
        if self.server is not None:
            self.server.stop(0).wait()
            self.server = None
        for channel in self.channels:
            channel.close()
        self.channels = []

    @property
    def pod_resources_socket(self) -> Path:
        return self.directory.parent / "pod-resources" / "kubelet.sock"

    def serve_pod_resources(self) -> None:
        """Starts the pod resources API on its socket (kubelet's is a directory of its own)."""
        self.pod_resources_socket.parent.mkdir(exist_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pr_grpc.add_PodResourcesListerServicer_to_server(_PodResources(self), server)
        server.add_insecure_port(f"unix:{self.pod_resources_socket}")
        server.start()
        self.pod_resources_server = server

    def stop_pod_resources(self) -> None:
        if self.pod_resources_server is not None:
            self.pod_resources_server.stop(0).wait()
            self.pod_resources_server = None

    def record(self, pod: str, container: str, resource: str, ids: list[str]) -> None:
        """As kubelet's device manager once Allocate has returned: ``pod`` (namespace/name)'s
        ``container`` holds ``ids`` of ``resource``."""
        namespace, _, name = pod.partition("/")
        with self.changed:
            containers = self.held.setdefault((namespace, name), {})
            containers.setdefault(container, {})[resource] = list(ids)

    def restart(self) -> None:
        """As kubelet restarting: every socket in the directory goes, kubelet.sock comes back."""
        self.stop()
        for path in self.directory.glob("*.sock"):
            path.unlink()
        self.start()

    def wait_registered(self, count: int, timeout_s: float = 10) -> list[api_pb2.RegisterRequest]:
        with self.changed:
            ok = self.changed.wait_for(lambda: len(self.registrations) >= count, timeout_s)
            assert ok, f"{len(self.registrations)} registrations, expected {count}"
            return list(self.registrations)

    def endpoint(self, resource: str) -> Path:
        with self.changed:
            request = next(r for r in reversed(self.registrations) if r.resource_name == resource)
        return self.directory / request.endpoint

    def stub(self, resource: str) -> api_pb2_grpc.DevicePluginStub:
        channel = grpc.insecure_channel(f"unix:{self.endpoint(resource)}")
        self.channels.append(channel)
        return api_pb2_grpc.DevicePluginStub(channel)


class SimulatedKubelet:
    """Admits containers the way kubelet's device manager does, one resource at a time:
    GetPreferredAllocation (when the plugin offers it and there is a choice) from the healthy
    devices not yet in use, then Allocate with the devices chosen."""

    def __init__(self, peer: KubeletPeer) -> None:
        self.peer = peer
        self.streams: dict[str, DeviceStream] = {}
        self.in_use: dict[str, set[str]] = {}

    def stream(self, resource: str) -> DeviceStream:
        if resource not in self.streams:
            self.streams[resource] = DeviceStream(self.peer.stub(resource))
            self.streams[resource].wait(lambda devices: bool(devices))
        return self.streams[resource]

    def available(self, resource: str) -> list[str]:
        devices = self.stream(resource).lists[-1]
        used = self.in_use.setdefault(resource, set())
        return [i for i, h in devices.items() if h == protocol.DEVICE_HEALTHY and i not in used]

    def preferred(self, resource: str, size: int) -> list[str]:
        stub = self.peer.stub(resource)
        request = api_pb2.PreferredAllocationRequest()
        request.container_requests.add(
            available_deviceIDs=self.available(resource), allocation_size=size
        )
        return list(stub.GetPreferredAllocation(request).container_responses[0].deviceIDs)

    def allocate(
        self, resource: str, ids: list[str], pod: str | None = None, container: str = ""
    ) -> api_pb2.ContainerAllocateResponse:
        """Allocate; with ``pod`` (namespace/name) the IDs are then recorded as that pod's
        ``container``'s in the pod resources API, as kubelet does."""
        stub = self.peer.stub(resource)
        request = api_pb2.AllocateRequest()
        request.container_requests.add(devices_ids=ids)
        response = stub.Allocate(request)
        self.in_use.setdefault(resource, set()).update(ids)
        if pod is not None:
            self.peer.record(pod, container, resource, ids)
        return response.container_responses[0]

    def admit(
        self, resource: str, size: int, pod: str | None = None, container: str = ""
    ) -> api_pb2.ContainerAllocateResponse:
        options = self.peer.stub(resource).GetDevicePluginOptions(api_pb2.Empty())
        available = self.available(resource)
        if options.get_preferred_allocation_available and size < len(available):
            ids = self.preferred(resource, size)
        else:
            ids = available[:size]
        return self.allocate(resource, ids, pod, container)

    def close(self) -> None:
        for stream in self.streams.values():
            stream.close()
