"""Serving kubelet: one gRPC server and registration per resource, and the plugin's lifecycle.

Each resource gets its own unix socket in the device plugin directory and registers it with
kubelet (``Register`` on kubelet.sock). kubelet deletes the plugin sockets when it restarts and
recreates kubelet.sock, so the lifecycle loop watches the directory: when kubelet.sock is a new
file (another inode) or one of our sockets is gone, the servers are restarted on fresh sockets
and registered again. Registration that fails (kubelet not up yet) is retried with backoff.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from concurrent import futures
from pathlib import Path

import grpc

from gpushare import protocol
from gpushare.deviceplugin.files import GC_GRACE_S
from gpushare.deviceplugin.service import DevicePlugin, ResourceService
from gpushare.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

log = logging.getLogger("gpushare.deviceplugin")

POLL_S = 0.2  # how often the directory is looked at
REGISTER_TIMEOUT_S = 5.0
BACKOFF_MAX_S = 10.0
GC_INTERVAL_S = 60.0
WORKERS_PER_RESOURCE = 8


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return (stat.st_ino, stat.st_ctime_ns)


class Servers:
    """The three resources' gRPC servers on their unix sockets."""

    def __init__(self, plugin: DevicePlugin, directory: Path, resources: Iterable[str]) -> None:
        self.plugin = plugin
        self.directory = directory
        self.resources = tuple(resources)
        self.servers: list[grpc.Server] = []

    def socket(self, resource: str) -> Path:
        return self.directory / protocol.DEVICE_PLUGIN_SOCKETS[resource]

    def start(self) -> None:
        for resource in self.resources:
            path = self.socket(resource)
            path.unlink(missing_ok=True)
            server = grpc.server(
                futures.ThreadPoolExecutor(
                    max_workers=WORKERS_PER_RESOURCE, thread_name_prefix=f"grpc-{resource}"
                ),
                options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)],
            )
            api_pb2_grpc.add_DevicePluginServicer_to_server(
                ResourceService(self.plugin, resource), server
            )
            server.add_insecure_port(f"unix:{path}")
            server.start()
            self.servers.append(server)

    def stop(self, grace_s: float = 1.0) -> None:
        for server in self.servers:
            server.stop(grace_s).wait()
        self.servers = []
        for resource in self.resources:
            self.socket(resource).unlink(missing_ok=True)

    def all_present(self) -> bool:
        return all(self.socket(resource).exists() for resource in self.resources)

    def register(self) -> None:
        """Registers every resource with kubelet; grpc.RpcError if kubelet refuses or is away."""
        kubelet = self.directory / protocol.KUBELET_SOCKET_NAME
        with grpc.insecure_channel(f"unix:{kubelet}") as channel:
            stub = api_pb2_grpc.RegistrationStub(channel)
            for resource in self.resources:
                service = ResourceService(self.plugin, resource)
                stub.Register(
                    api_pb2.RegisterRequest(
                        version=protocol.DEVICE_PLUGIN_API_VERSION,
                        endpoint=protocol.DEVICE_PLUGIN_SOCKETS[resource],
                        resource_name=resource,
                        options=service.options(),
                    ),
                    timeout=REGISTER_TIMEOUT_S,
                )
        log.info("registered %s with kubelet", ", ".join(self.resources))


class Lifecycle:
    """Runs the servers until ``stop()``: re-registers after kubelet restarts, collects files."""

    def __init__(
        self,
        plugin: DevicePlugin,
        directory: Path,
        resources: Iterable[str] = protocol.MANAGED_RESOURCES,
        gc_interval_s: float = GC_INTERVAL_S,
        gc_grace_s: float = GC_GRACE_S,
    ) -> None:
        self.plugin = plugin
        self.servers = Servers(plugin, directory, resources)
        self.kubelet_socket = directory / protocol.KUBELET_SOCKET_NAME
        self.gc_interval_s = gc_interval_s
        self.gc_grace_s = gc_grace_s
        self.stopping = threading.Event()
        self.registrations = 0  # successful registrations of all resources (for tests, logs)
        self.registered = threading.Condition()

    def stop(self) -> None:
        self.stopping.set()

    def wait_registered(self, count: int, timeout_s: float) -> bool:
        """True once ``count`` registrations have succeeded (within ``timeout_s``)."""
        with self.registered:
            return self.registered.wait_for(lambda: self.registrations >= count, timeout_s)

    def run(self) -> None:
        self.servers.start()
        registered_to: tuple[int, int] | None = None
        backoff = POLL_S
        next_try = 0.0
        next_gc = 0.0
        clock = self.plugin.clock
        try:
            while not self.stopping.is_set():
                now = clock()
                kubelet = _identity(self.kubelet_socket)
                if registered_to is not None and (
                    kubelet != registered_to or not self.servers.all_present()
                ):
                    log.warning("kubelet restarted (or our sockets went); serving again")
                    self.servers.stop(grace_s=0)
                    self.servers.start()
                    registered_to = None
                    next_try = 0.0
                if registered_to is None and kubelet is not None and now >= next_try:
                    try:
                        self.servers.register()
                    except grpc.RpcError as error:
                        log.warning("registering with kubelet: %s", error.details() or error)
                        backoff = min(backoff * 2, BACKOFF_MAX_S)
                        next_try = now + backoff
                    else:
                        registered_to = kubelet
                        backoff = POLL_S
                        with self.registered:
                            self.registrations += 1
                            self.registered.notify_all()
                if now >= next_gc:
                    self._collect()
                    next_gc = now + self.gc_interval_s
                self.stopping.wait(POLL_S)
        finally:
            self.plugin.stop()
            self.servers.stop()

    def _collect(self) -> None:
        """Removes state directories of pods gone from the node (only with a live view)."""
        self.plugin.forget_gone()
        if not self.plugin.pods.synced():
            return
        for uid in self.plugin.files.collect(self.plugin.live_uids(), self.gc_grace_s):
            log.info("removed the files of pod %s (gone)", uid)
