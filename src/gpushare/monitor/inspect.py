"""The cluster's GPU allocation, node by node and GPU by GPU: `kubectl gpushare inspect`.

Pure: takes the cluster's node and pod objects (the Kubernetes JSON shape) and returns the
report the command prints as a table, JSON or YAML. Counted, as the extender counts them: pods
bound to a node (spec.nodeName) that have not ended, by their ``gpushare.io/allocation``
shares. *Pending* is GPU memory that pods bound to the node asked for but that no annotation
places on a GPU (bound without the extender, or an annotation that does not parse); it is
counted in the node's total, as in Alibaba's ``kubectl inspect cgpu``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpushare import protocol
from gpushare.model import Allocation, GpuShare
from gpushare.model.charges import pod_charges


@dataclass(slots=True)
class GpuUse:
    index: int
    uuid: str
    model: str
    total_mib: int
    allocated_mib: int = 0
    healthy: bool = True
    exclusive: bool = False


@dataclass(slots=True)
class PodUse:
    namespace: str
    name: str
    gpus: dict[int, int] = field(default_factory=dict)  # GPU index → MiB
    exclusive: bool = False
    pending_mib: int = 0


@dataclass(slots=True)
class NodeUse:
    name: str
    ip: str
    gpus: list[GpuUse]
    pods: list[PodUse] = field(default_factory=list)
    pending_mib: int = 0
    problem: str | None = None  # the node's annotation could not be read

    @property
    def allocated_mib(self) -> int:
        return sum(gpu.allocated_mib for gpu in self.gpus) + self.pending_mib

    @property
    def total_mib(self) -> int:
        return sum(gpu.total_mib for gpu in self.gpus)


@dataclass(slots=True)
class Report:
    nodes: list[NodeUse]

    @property
    def allocated_mib(self) -> int:
        return sum(node.allocated_mib for node in self.nodes)

    @property
    def total_mib(self) -> int:
        return sum(node.total_mib for node in self.nodes)

    @property
    def percent(self) -> int:
        return round(100 * self.allocated_mib / self.total_mib) if self.total_mib else 0


def node_ip(node: dict[str, Any]) -> str:
    addresses = (node.get("status") or {}).get("addresses") or []
    for kind in ("InternalIP", "ExternalIP"):
        for address in addresses:
            if address.get("type") == kind and address.get("address"):
                return str(address["address"])
    return "-"


def _requested_mib(pod: dict[str, Any], mib_per_unit: int, gpu_mib: int) -> int:
    """What a pod's containers ask for in GPU memory (gpu-mem units, whole GPUs)."""
    total = 0
    spec = pod.get("spec") or {}
    for container in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]:
        resources = container.get("resources") or {}
        asked = resources.get("limits") or resources.get("requests") or {}
        for name, per_unit in (
            (protocol.RESOURCE_GPU_MEMORY, mib_per_unit),
            (protocol.RESOURCE_GPU_COUNT, gpu_mib),
        ):
            value = str(asked.get(name, "0"))
            total += int(value) * per_unit if value.isdigit() else 0
    return total


def pod_shares(
    pod: dict[str, Any], containers: dict[str, list[protocol.ShareInfo]]
) -> list[GpuShare]:
    """What the pod holds on each GPU, as the extender counts it: app containers' shares,
    and what its init containers need beyond them (the max rule, model/charges.py)."""
    key = protocol.pod_key(pod)
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    allocations = {
        name: Allocation(
            f"{key}/{name}",
            node,
            0,
            0,
            tuple(GpuShare(s.uuid, s.index, s.memory_mib, s.core, s.exclusive) for s in group),
        )
        for name, group in containers.items()
    }
    charges = pod_charges(key, node, allocations, protocol.regular_init_names(pod))
    return [share for charge in charges.values() for share in charge.gpu_shares]


def build_report(
    nodes: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    *,
    mib_per_unit: int = protocol.MIB_PER_GIB,
    only: set[str] | None = None,
) -> Report:
    """The allocation of each gpushare node (``only``: these names), from one list of each."""
    result: dict[str, NodeUse] = {}
    for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
        metadata = node.get("metadata") or {}
        name = metadata["name"]
        if (metadata.get("labels") or {}).get(protocol.LABEL_ENABLED) != "true":
            continue
        if only is not None and name not in only:
            continue
        use = NodeUse(name, node_ip(node), [])
        try:
            gpus = protocol.decode_gpus(
                (metadata.get("annotations") or {})[protocol.ANNOTATION_GPUS]
            )
            use.gpus = [
                GpuUse(g.index, g.uuid, g.model, g.memory_mib, healthy=g.healthy)
                for g in sorted(gpus, key=lambda g: g.index)
            ]
        except KeyError:
            use.problem = f"no {protocol.ANNOTATION_GPUS} annotation"
        except protocol.ProtocolError as error:
            use.problem = str(error)
        result[name] = use
    for pod in sorted(pods, key=lambda p: (p["metadata"].get("namespace"), p["metadata"]["name"])):
        metadata = pod.get("metadata") or {}
        use = result.get((pod.get("spec") or {}).get("nodeName") or "")
        if use is None or protocol.pod_ended(pod):
            continue
        by_uuid = {gpu.uuid: gpu for gpu in use.gpus}
        row = PodUse(str(metadata.get("namespace") or "default"), str(metadata["name"]))
        text = (metadata.get("annotations") or {}).get(protocol.ANNOTATION_ALLOCATION)
        shares: list[GpuShare] | None = None
        if text:
            try:
                shares = pod_shares(pod, protocol.decode_allocation(text))
            except protocol.ProtocolError:
                shares = None
        if shares is None or any(share.uuid not in by_uuid for share in shares):
            gpu_mib = max((gpu.total_mib for gpu in use.gpus), default=0)
            row.pending_mib = _requested_mib(pod, mib_per_unit, gpu_mib)
            if row.pending_mib == 0:
                continue  # not a GPU pod
            use.pending_mib += row.pending_mib
        else:
            for share in shares:
                gpu = by_uuid[share.uuid]
                gpu.allocated_mib += share.memory_mib
                gpu.exclusive = gpu.exclusive or share.exclusive
                row.gpus[gpu.index] = row.gpus.get(gpu.index, 0) + share.memory_mib
                row.exclusive = row.exclusive or share.exclusive
            if not row.gpus:
                continue
        use.pods.append(row)
    return Report(list(result.values()))


def to_json(report: Report) -> dict[str, Any]:
    """The report for ``-o json|yaml``: MiB throughout."""
    return {
        "nodes": [
            {
                "name": node.name,
                "ip": node.ip,
                "gpus": [
                    {
                        "index": gpu.index,
                        "uuid": gpu.uuid,
                        "model": gpu.model,
                        "allocatedMiB": gpu.allocated_mib,
                        "totalMiB": gpu.total_mib,
                        "healthy": gpu.healthy,
                        "exclusive": gpu.exclusive,
                    }
                    for gpu in node.gpus
                ],
                "pendingMiB": node.pending_mib,
                "allocatedMiB": node.allocated_mib,
                "totalMiB": node.total_mib,
                "pods": [
                    {
                        "namespace": pod.namespace,
                        "name": pod.name,
                        "gpus": {str(index): mib for index, mib in sorted(pod.gpus.items())},
                        "pendingMiB": pod.pending_mib,
                        "exclusive": pod.exclusive,
                    }
                    for pod in node.pods
                ],
                **({"problem": node.problem} if node.problem else {}),
            }
            for node in report.nodes
        ],
        "allocatedMiB": report.allocated_mib,
        "totalMiB": report.total_mib,
        "percent": report.percent,
    }


def amount(mib: int, unit: str) -> str:
    """MiB in the table's unit: GiB with one decimal at most, or whole MiB."""
    if unit == "MiB":
        return str(mib)
    text = f"{mib / protocol.MIB_PER_GIB:.1f}"
    return text[:-2] if text.endswith(".0") else text


def summary_rows(report: Report, unit: str = "GiB") -> tuple[list[str], list[list[str]]]:
    """The header and rows of the cluster table (one row per node)."""
    width = max((len(node.gpus) for node in report.nodes), default=0)
    header = [
        "NAME",
        "IPADDRESS",
        *[f"GPU{i}(Allocated/Total)" for i in range(width)],
        "PENDING(Allocated)",
        f"GPU Memory({unit})",
    ]
    rows = []
    for node in report.nodes:
        cells = [
            f"{amount(gpu.allocated_mib, unit)}/{amount(gpu.total_mib, unit)}" for gpu in node.gpus
        ]
        cells += ["-"] * (width - len(cells))
        rows.append(
            [
                node.name,
                node.ip,
                *cells,
                amount(node.pending_mib, unit),
                f"{amount(node.allocated_mib, unit)}/{amount(node.total_mib, unit)}",
            ]
        )
    return header, rows


def detail_rows(node: NodeUse, unit: str = "GiB") -> tuple[list[str], list[list[str]]]:
    """The header and rows of one node's pod table (``inspect -d``)."""
    header = ["NAME", "NAMESPACE", *[f"GPU{gpu.index}(Allocated)" for gpu in node.gpus]]
    header.append("PENDING(Allocated)")
    rows = []
    for pod in node.pods:
        cells = [amount(pod.gpus.get(gpu.index, 0), unit) for gpu in node.gpus]
        if pod.exclusive:
            cells = [f"{cell} (exclusive)" if cell != "0" else cell for cell in cells]
        rows.append([pod.name, pod.namespace, *cells, amount(pod.pending_mib, unit)])
    return header, rows
