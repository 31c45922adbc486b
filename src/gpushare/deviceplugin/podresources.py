"""kubelet's own record of which container holds which device IDs, and the thread that reads it.

kubelet's pod resources API (``v1.PodResourcesLister/List`` on
/var/lib/kubelet/pod-resources/kubelet.sock) lists every active pod's containers with the
device IDs each holds, per resource. kubelet records a container's IDs as Allocate returns, so
shortly after the plugin serves an Allocate the list says which container got that decision.
``Reconciler`` lists it after Allocates (retrying with backoff while some served ID set is not
reported yet) and every ``interval_s`` as a safety net, and hands the result to the plugin
(``DevicePlugin.reconcile``), which rewrites the annotations of swapped pods. The socket missing
or failing never reaches Allocate: it is logged once, and tried again later.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

import grpc

from gpushare import protocol
from gpushare.deviceplugin.podresources_v1 import api_pb2, api_pb2_grpc
from gpushare.deviceplugin.swaps import Held

log = logging.getLogger("gpushare.deviceplugin")

DEFAULT_SOCKET = Path(protocol.KUBELET_POD_RESOURCES_SOCKET)
LIST_TIMEOUT_S = 5.0
MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # the list covers every pod on the node
INTERVAL_S = 30.0  # the safety net: a look even when nothing was served
RETRY_MIN_S = 0.1  # after an Allocate: kubelet records the IDs once Allocate has returned
RETRY_MAX_S = 5.0


class PodResourcesError(RuntimeError):
    """kubelet's pod resources API could not be read; the message is one line."""


def held_devices(
    response: api_pb2.ListPodResourcesResponse, resources: Iterable[str]
) -> list[Held]:
    """The device IDs of ``resources`` that each container holds, from a List response."""
    wanted = set(resources)
    found: list[Held] = []
    for pod in response.pod_resources:
        key = f"{pod.namespace or 'default'}/{pod.name}"
        for container in pod.containers:
            for devices in container.devices:
                if devices.resource_name in wanted and devices.device_ids:
                    found.append(
                        Held(
                            key,
                            container.name,
                            devices.resource_name,
                            frozenset(devices.device_ids),
                        )
                    )
    return found


class PodResourcesClient:
    """``List`` on kubelet's pod resources socket."""

    def __init__(self, socket: Path = DEFAULT_SOCKET, timeout_s: float = LIST_TIMEOUT_S) -> None:
        self.socket = socket
        self.timeout_s = timeout_s

    def list(self) -> api_pb2.ListPodResourcesResponse:
        """kubelet's current record; PodResourcesError if it cannot be read."""
        if not self.socket.is_socket():
            raise PodResourcesError(f"{self.socket}: no such socket")
        options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
        try:
            with grpc.insecure_channel(f"unix:{self.socket}", options=options) as channel:
                stub = api_pb2_grpc.PodResourcesListerStub(channel)
                return stub.List(api_pb2.ListPodResourcesRequest(), timeout=self.timeout_s)
        except grpc.RpcError as error:
            detail = error.details() if isinstance(error, grpc.Call) else str(error)
            raise PodResourcesError(f"{self.socket}: List: {detail or error}") from None


class Reconciler:
    """Lists kubelet's pod resources after Allocates and periodically, until ``stop()``.

    ``reconcile(held)`` applies one look and returns how many served ID sets are still
    unreported; while any are, the next look comes after a backoff (0.1 s doubling to 5 s),
    else after ``interval_s`` or the next ``wake()``.
    """

    def __init__(
        self,
        client: PodResourcesClient,
        resources: Iterable[str],
        reconcile: Callable[[list[Held]], int],
        interval_s: float = INTERVAL_S,
    ) -> None:
        self.client = client
        self.resources = tuple(resources)
        self.reconcile = reconcile
        self.interval_s = interval_s
        self.stopping = threading.Event()
        self._wake = threading.Event()
        self._failing = False
        self.thread = threading.Thread(target=self._run, name="pod-resources", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self._wake.set()

    def wake(self) -> None:
        """A decision was served: look soon."""
        self._wake.set()

    def look(self) -> int | None:
        """One look; the unreported count, or None if kubelet's record could not be read."""
        try:
            held = held_devices(self.client.list(), self.resources)
        except PodResourcesError as error:
            if not self._failing:
                log.warning("kubelet pod resources: %s; trying again later", error)
                self._failing = True
            return None
        if self._failing:
            log.info("kubelet pod resources: readable again")
            self._failing = False
        return self.reconcile(held)

    def _run(self) -> None:
        delay = self.interval_s
        while not self.stopping.is_set():
            if self._wake.wait(delay):
                self._wake.clear()
                delay = RETRY_MIN_S
                # kubelet records the IDs when Allocate has returned: give it that moment.
                if self.stopping.wait(RETRY_MIN_S):
                    return
            elif self.stopping.is_set():
                return
            try:
                unreported = self.look()
            except Exception:  # a bug here must not end the thread: Allocate goes on
                log.exception("kubelet pod resources: reconciling failed")
                unreported = None
            if unreported:
                delay = min(max(delay * 2, RETRY_MIN_S), RETRY_MAX_S)
            elif unreported is None:
                delay = min(max(delay * 2, RETRY_MIN_S), self.interval_s)
            else:
                delay = self.interval_s
