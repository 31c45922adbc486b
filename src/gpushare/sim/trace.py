"""Reading the Alibaba cluster-trace-gpu-v2023 node and pod lists into model objects.

Every problem is reported as one line naming the file, the row and what is wrong: these files
come from users, who should not have to read a traceback to fix them.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gpushare.model import Gpu, Node, Request

MILLI_PER_GPU = 1000
# The trace gives GPU shares, not sizes: every simulated GPU has this much memory, so that one
# thousandth of a GPU is exactly 16 MiB and shares stay exact integers.
SIM_GPU_MEMORY_MIB = 16 * MILLI_PER_GPU

DATA_DIR = Path(__file__).resolve().parents[3] / "data" / "alibaba-gpu-v2023"
DEFAULT_NODES = DATA_DIR / "openb_node_list_gpu_node.csv"
DEFAULT_PODS = DATA_DIR / "openb_pod_list_default.csv"

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec")


class TraceError(ValueError):
    """A trace file that cannot be used; the message names the file, row and problem."""


@dataclass(frozen=True, slots=True)
class TracePod:
    """A pod of the trace: its request and the GPU it asks for, in GPUs (for arrival)."""

    request: Request
    requested_gpu_milli: int  # GPU count times thousandths of a GPU on each

    @property
    def requested_gpus(self) -> float:
        return self.requested_gpu_milli / MILLI_PER_GPU


@dataclass(frozen=True, slots=True)
class _NodeType:
    models: frozenset[str]
    gpu_count: int
    cpu_milli: int
    memory_mib: int


def _rows(path: Path, columns: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    if path.is_dir():
        raise TraceError(f"{path}: is a folder, not a CSV file")
    if not path.is_file():
        raise TraceError(f"{path}: no such file")
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise TraceError(f"{path}: cannot read: {error.strerror}") from None
    try:
        text = raw.decode("utf-8-sig")  # spreadsheets often save UTF-8 with a byte order mark
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise TraceError(f"{path}: row {line}: not UTF-8 text") from None
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        header = reader.fieldnames or []
        missing = [c for c in columns if c not in header]
        if missing:
            raise TraceError(f"{path}: missing column(s) {', '.join(missing)}")
        for row in reader:
            # Row numbers as a spreadsheet shows them: the header is row 1, blank rows count.
            row_number = reader.line_num
            if None in row or any(row.get(c) is None for c in columns):
                raise TraceError(f"{path}: row {row_number}: wrong number of fields")
            yield row_number, row
    except csv.Error as error:
        raise TraceError(f"{path}: not a valid CSV file: {error}") from None


def _count(path: Path, row_number: int, row: dict[str, str], column: str) -> int:
    text = row[column].strip()
    try:
        value = int(text)
    except ValueError:
        raise TraceError(
            f"{path}: row {row_number}: {column} must be a whole number, got {text!r}"
        ) from None
    if value < 0:
        raise TraceError(f"{path}: row {row_number}: {column} must not be negative, got {value}")
    return value


def load_nodes(path: Path) -> list[Node]:
    nodes: list[Node] = []
    seen: set[str] = set()
    for row_number, row in _rows(path, NODE_COLUMNS):
        name = row["sn"].strip()
        if not name:
            raise TraceError(f"{path}: row {row_number}: sn (node name) is empty")
        if name in seen:
            raise TraceError(f"{path}: row {row_number}: node {name} appears twice")
        seen.add(name)
        gpu_count = _count(path, row_number, row, "gpu")
        model = row["model"].strip()
        if gpu_count and not model:
            raise TraceError(f"{path}: row {row_number}: node {name} has GPUs but no model")
        gpus = tuple(
            Gpu(index=i, uuid=f"GPU-{name}-{i}", model=model, memory_mib=SIM_GPU_MEMORY_MIB)
            for i in range(gpu_count)
        )
        nodes.append(
            Node(
                name=name,
                gpus=gpus,
                cpu_milli=_count(path, row_number, row, "cpu_milli"),
                memory_mib=_count(path, row_number, row, "memory_mib"),
            )
        )
    if not nodes:
        raise TraceError(f"{path}: no nodes")
    if not any(node.gpus for node in nodes):
        raise TraceError(f"{path}: no node has a GPU")
    return nodes


def trace_request(
    name: str,
    cpu_milli: int,
    memory_mib: int,
    gpu_count: int,
    gpu_milli: int,
    allowed_models: frozenset[str] = frozenset(),
) -> Request:
    """A trace pod as a request: 1000 milli means whole GPUs, less a share of
    ``gpu_milli * 16`` MiB and ``gpu_milli / 10`` percent of compute on each GPU."""
    exclusive = gpu_milli == MILLI_PER_GPU
    return Request(
        name=name,
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        gpu_count=gpu_count,
        memory_mib_per_gpu=0 if exclusive else gpu_milli * SIM_GPU_MEMORY_MIB // MILLI_PER_GPU,
        core_percent_per_gpu=0 if exclusive else -(-gpu_milli * 100 // MILLI_PER_GPU),
        exclusive=exclusive,
        allowed_models=allowed_models,
    )


def load_pods(path: Path, nodes: list[Node]) -> list[TracePod]:
    """Pods as requests; a pod that no node could ever hold is an error, not a failure."""
    models = {gpu.model for node in nodes for gpu in node.gpus}
    # Nodes come in a few types; checking each pod against the types is enough.
    node_types = {
        _NodeType(frozenset(g.model for g in n.gpus), len(n.gpus), n.cpu_milli, n.memory_mib)
        for n in nodes
    }
    pods: list[TracePod] = []
    first_row: dict[str, int] = {}
    for row_number, row in _rows(path, POD_COLUMNS):
        where = f"{path}: row {row_number}"
        name = row["name"].strip() or f"row-{row_number}"
        if name in first_row:
            raise TraceError(f"{where}: pod {name} appears twice (first in row {first_row[name]})")
        first_row[name] = row_number
        cpu_milli = _count(path, row_number, row, "cpu_milli")
        memory_mib = _count(path, row_number, row, "memory_mib")
        gpu_count = _count(path, row_number, row, "num_gpu")
        gpu_milli = _count(path, row_number, row, "gpu_milli")
        allowed = frozenset(m.strip() for m in row["gpu_spec"].split("|") if m.strip())
        if gpu_milli > MILLI_PER_GPU:
            raise TraceError(f"{where}: gpu_milli must be at most 1000, got {gpu_milli}")
        if gpu_count == 0 and gpu_milli:
            raise TraceError(f"{where}: gpu_milli is {gpu_milli} but num_gpu is 0")
        if gpu_count and not gpu_milli:
            raise TraceError(f"{where}: num_gpu is {gpu_count} but gpu_milli is 0")
        if allowed and not allowed & models:
            raise TraceError(
                f"{where}: gpu_spec {row['gpu_spec']!r} names no GPU model of the node list"
            )
        hosts = [t for t in node_types if not allowed or t.models & allowed]
        widest = max(t.gpu_count for t in hosts)
        if gpu_count > widest:
            of_model = f" of model {row['gpu_spec']}" if allowed else ""
            raise TraceError(
                f"{where}: pod {name} asks for {gpu_count} GPUs but no node{of_model} "
                f"has more than {widest}"
            )
        if not any(
            t.cpu_milli >= cpu_milli and t.memory_mib >= memory_mib and t.gpu_count >= gpu_count
            for t in hosts
        ):
            raise TraceError(
                f"{where}: pod {name} asks for {cpu_milli} CPU milli and {memory_mib} MiB "
                "but no node that has its GPUs has that much"
            )
        request = trace_request(name, cpu_milli, memory_mib, gpu_count, gpu_milli, allowed)
        pods.append(TracePod(request, gpu_count * gpu_milli))
    if not pods:
        raise TraceError(f"{path}: no pods")
    if not any(pod.requested_gpu_milli for pod in pods):
        raise TraceError(f"{path}: no pod asks for a GPU, so arrival cannot be measured")
    return pods
