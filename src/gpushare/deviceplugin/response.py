"""What kubelet passes to the container runtime for one served container (pure).

The GPUs reach the container the way the NVIDIA container runtime is configured to take them
(``DeviceListStrategy``): ``envvar`` sets NVIDIA_VISIBLE_DEVICES to the UUIDs;
``volume-mounts`` sets it to /var/run/nvidia-container-devices and mounts /dev/null at
/var/run/nvidia-container-devices/<uuid> for each GPU (what the runtime reads when
``accept-nvidia-visible-devices-as-volume-mounts`` is on); ``cdi`` names the CDI devices
``nvidia.com/gpu=<uuid>``. A shared container also gets the interception library, an
/etc/ld.so.preload that names it, its read-only limits file and its own state directory.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpushare import protocol
from gpushare.deviceplugin.matching import Pending
from gpushare.deviceplugin.v1beta1 import api_pb2

STRATEGY_ENVVAR = "envvar"
STRATEGY_VOLUME_MOUNTS = "volume-mounts"
STRATEGY_CDI = "cdi"
STRATEGIES = (STRATEGY_ENVVAR, STRATEGY_VOLUME_MOUNTS, STRATEGY_CDI)
MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class HostPaths:
    """Where a served container's files are on the host."""

    library: str  # the interception library (native/build/libgpushare.so, installed)
    ld_so_preload: str  # a file whose one line is protocol.CONTAINER_LIBRARY_PATH
    limits: str  # this container's limits file
    state_dir: str  # this container's state directory


def limits_text(shares: tuple[protocol.ShareInfo, ...]) -> str:
    """The limits file (docs/isolation.md, "Limits") for a container with these shares.

    Inside the container NVML and CUDA number its GPUs in PCI bus order, which is the
    order of their indices on the host (NVML's order there too), so index i is the i-th share
    by host index. The default limit (every index) is the per-GPU slice too, so a container
    that sees more GPUs than its own still gets no more than a slice on any of them.
    """
    shares = tuple(sorted(shares, key=lambda share: share.index))
    lines = [
        "# written by gpushare device-plugin; read-only in the container",
        f"state_dir={protocol.CONTAINER_STATE_DIR}",
        f"memory_limit_bytes={max(share.memory_mib for share in shares)}MiB",
    ]
    lines += [
        f"memory_limit_bytes.{index}={share.memory_mib}MiB" for index, share in enumerate(shares)
    ]
    cores = {share.core for share in shares}
    core = max(cores) if cores else 0
    lines.append(f"core_limit_percent={core if 0 < core < protocol.CORE_PER_GPU else 0}")
    return "\n".join(lines) + "\n"


def container_response(
    decision: Pending, strategies: tuple[str, ...], paths: HostPaths | None
) -> api_pb2.ContainerAllocateResponse:
    """The response for ``decision``'s container; ``paths`` None for an exclusive one."""
    uuids = [share.uuid for share in decision.shares]
    response = api_pb2.ContainerAllocateResponse()
    response.envs[protocol.ENV_GPUSHARE_POD] = decision.key
    if STRATEGY_ENVVAR in strategies:
        response.envs[protocol.ENV_NVIDIA_VISIBLE_DEVICES] = ",".join(uuids)
    if STRATEGY_VOLUME_MOUNTS in strategies:
        response.envs[protocol.ENV_NVIDIA_VISIBLE_DEVICES] = protocol.NVIDIA_DEVICE_LIST_VOLUME_DIR
        for uuid in uuids:
            response.mounts.add(
                container_path=f"{protocol.NVIDIA_DEVICE_LIST_VOLUME_DIR}/{uuid}",
                host_path="/dev/null",
                read_only=True,
            )
    if STRATEGY_CDI in strategies:
        for uuid in uuids:
            response.cdi_devices.add(name=f"{protocol.NVIDIA_CDI_KIND}={uuid}")
    if paths is not None:
        response.mounts.add(
            container_path=protocol.CONTAINER_LIBRARY_PATH, host_path=paths.library, read_only=True
        )
        response.mounts.add(
            container_path=protocol.CONTAINER_LD_SO_PRELOAD,
            host_path=paths.ld_so_preload,
            read_only=True,
        )
        response.mounts.add(
            container_path=protocol.CONTAINER_LIMITS_PATH, host_path=paths.limits, read_only=True
        )
        response.mounts.add(
            container_path=protocol.CONTAINER_STATE_DIR, host_path=paths.state_dir, read_only=False
        )
    return response
