"""The devices each gpushare resource advertises to kubelet, and the size of that list.

kubelet counts devices; the extender does the real accounting. So each resource advertises as
many devices as the node has units, and kubelet's count can never refuse what the extender
placed: ``gpushare.io/gpu-mem`` one device per memory unit of each GPU (GiB by default),
``gpushare.io/gpu-core`` 100 per GPU, ``gpushare.io/gpu`` one per GPU (its UUID, with its NUMA
node for kubelet's topology manager). A unit device's ID is ``<gpu index>-<unit>`` in hex; it
belongs to that GPU only for health: when the GPU fails its units turn unhealthy, so kubelet's
allocatable shrinks with the node's healthy capacity.

ListAndWatch sends the whole list in one message, and kubelet's gRPC client accepts at most
4 MiB. Unit devices carry no topology and short IDs (about 17 bytes each on the wire), so a
list holds about 240,000 of them: any node in GiB units, 8 x 16 GiB GPUs in MiB units, not
8 x 141 GiB in MiB units (1,155,072 devices, 19 MB). A node whose list would not fit is refused
at start with a one-line error that names the resource, the count and the size.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gpushare import protocol
from gpushare.deviceplugin.discovery import Gpu
from gpushare.deviceplugin.v1beta1 import api_pb2

GRPC_MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # gRPC's default receive limit, kubelet's client's
LIST_BUDGET_BYTES = GRPC_MAX_MESSAGE_BYTES - 64 * 1024  # headroom below it


class InventoryError(ValueError):
    """The node's devices cannot be advertised as configured; one line, says why."""


@dataclass(frozen=True, slots=True)
class Inventory:
    """Every resource's device IDs and the GPU index each belongs to."""

    gpus: tuple[Gpu, ...]
    memory_mib_per_unit: int = protocol.MIB_PER_GIB
    budget_bytes: int = LIST_BUDGET_BYTES
    devices: dict[str, tuple[tuple[str, int], ...]] = field(init=False)
    ids: dict[str, frozenset[str]] = field(init=False)  # every resource's device IDs

    def __post_init__(self) -> None:
        if self.memory_mib_per_unit <= 0:
            raise InventoryError(f"memory unit must be > 0 MiB, got {self.memory_mib_per_unit}")
        memory = tuple(
            (f"{gpu.index:x}-{unit:x}", gpu.index)
            for gpu in self.gpus
            for unit in range(gpu.memory_mib // self.memory_mib_per_unit)
        )
        core = tuple(
            (f"{gpu.index:x}-{unit:x}", gpu.index)
            for gpu in self.gpus
            for unit in range(protocol.CORE_PER_GPU)
        )
        whole = tuple((gpu.uuid, gpu.index) for gpu in self.gpus)
        object.__setattr__(
            self,
            "devices",
            {
                protocol.RESOURCE_GPU_MEMORY: memory,
                protocol.RESOURCE_GPU_CORE: core,
                protocol.RESOURCE_GPU_COUNT: whole,
            },
        )
        object.__setattr__(
            self, "ids", {r: frozenset(i for i, _ in d) for r, d in self.devices.items()}
        )
        worst = {gpu.uuid: False for gpu in self.gpus}  # "Unhealthy" is the longer word
        for resource in self.devices:
            size = self.list_response(resource, worst).ByteSize()
            if size > self.budget_bytes:
                raise InventoryError(
                    f"{resource}: {len(self.devices[resource])} devices need a "
                    f"{size}-byte ListAndWatch message, over the {self.budget_bytes}-byte "
                    f"budget under gRPC's 4 MiB limit; use a larger memory unit (GiB)"
                )

    def gpu_of(self, resource: str, device_id: str) -> int | None:
        """The index of the GPU a device belongs to, None for an ID this node never had."""
        if resource == protocol.RESOURCE_GPU_COUNT:
            return next((i for uuid, i in self.devices[resource] if uuid == device_id), None)
        head, _, tail = device_id.partition("-")
        try:
            index, unit = int(head, 16), int(tail, 16)
        except ValueError:
            return None
        gpu = next((g for g in self.gpus if g.index == index), None)
        if gpu is None or unit < 0:
            return None
        per_gpu = (
            gpu.memory_mib // self.memory_mib_per_unit
            if resource == protocol.RESOURCE_GPU_MEMORY
            else protocol.CORE_PER_GPU
        )
        return index if unit < per_gpu else None

    def list_response(
        self, resource: str, healthy: dict[str, bool]
    ) -> api_pb2.ListAndWatchResponse:
        """The ListAndWatch message for ``resource``, given each GPU's health by UUID."""
        by_index = {gpu.index: healthy.get(gpu.uuid, True) for gpu in self.gpus}
        word = {True: protocol.DEVICE_HEALTHY, False: protocol.DEVICE_UNHEALTHY}
        response = api_pb2.ListAndWatchResponse()
        if resource == protocol.RESOURCE_GPU_COUNT:
            numa = {gpu.index: gpu.numa for gpu in self.gpus}
            for uuid, index in self.devices[resource]:
                device = response.devices.add(ID=uuid, health=word[by_index[index]])
                if numa[index] >= 0:
                    device.topology.nodes.add(ID=numa[index])
            return response
        response.devices.extend(
            api_pb2.Device(ID=device_id, health=word[by_index[index]])
            for device_id, index in self.devices[resource]
        )
        return response


def pick_ids(available: Iterable[str], must_include: Sequence[str], size: int) -> list[str]:
    """``size`` IDs: those that must be included, then the first others available."""
    chosen = list(dict.fromkeys(must_include))[:size]
    taken = set(chosen)
    for device_id in available:
        if len(chosen) >= size:
            break
        if device_id not in taken:
            chosen.append(device_id)
            taken.add(device_id)
    return chosen
