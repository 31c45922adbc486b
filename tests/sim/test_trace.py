"""Reading node and pod lists: the mapping to model objects, and one clear error per bad input."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpushare.model import Node
from gpushare.sim.trace import (
    MILLI_PER_GPU,
    SIM_GPU_MEMORY_MIB,
    TraceError,
    load_nodes,
    load_pods,
)

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model"
POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec"

GOOD_NODES = [
    "node-a,64000,262144,2,P100",
    "node-b,96000,393216,8,V100M32",
    "node-c,32000,131072,0,",
]


def write(tmp_path: Path, name: str, header: str, rows: list[str]) -> Path:
    path = tmp_path / name
    path.write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
    return path


def nodes_file(tmp_path: Path, rows: list[str] | None = None) -> Path:
    return write(tmp_path, "nodes.csv", NODE_HEADER, GOOD_NODES if rows is None else rows)


def pods_file(tmp_path: Path, rows: list[str]) -> Path:
    return write(tmp_path, "pods.csv", POD_HEADER, rows)


@pytest.fixture
def nodes(tmp_path: Path) -> list[Node]:
    return load_nodes(nodes_file(tmp_path))


def trace_error(call, *args) -> str:
    with pytest.raises(TraceError) as caught:
        call(*args)
    message = str(caught.value)
    assert "\n" not in message, "a trace error is one line"
    return message


def assert_row_error(message: str, path: Path, row: int, *fragments: str) -> None:
    assert str(path) in message
    assert re.search(rf"\brow {row}\b", message), message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


# -- good files --------------------------------------------------------------------------------


def test_load_nodes_builds_gpus_with_uuids_models_and_simulated_memory(tmp_path: Path) -> None:
    loaded = load_nodes(nodes_file(tmp_path))

    assert [n.name for n in loaded] == ["node-a", "node-b", "node-c"]
    a, b, c = loaded
    assert (a.cpu_milli, a.memory_mib) == (64000, 262144)
    assert (b.cpu_milli, b.memory_mib) == (96000, 393216)
    assert [g.uuid for g in a.gpus] == ["GPU-node-a-0", "GPU-node-a-1"]
    assert [g.index for g in b.gpus] == list(range(8))
    assert {g.model for g in a.gpus} == {"P100"}
    assert {g.model for g in b.gpus} == {"V100M32"}
    assert all(g.memory_mib == SIM_GPU_MEMORY_MIB for n in loaded for g in n.gpus)
    assert c.gpus == ()
    assert len({g.uuid for n in loaded for g in n.gpus}) == 10


def test_simulated_gpu_memory_makes_a_thousandth_exactly_16_mib() -> None:
    assert SIM_GPU_MEMORY_MIB == 16 * MILLI_PER_GPU == 16000


def test_load_nodes_strips_spaces_around_fields(tmp_path: Path) -> None:
    (node,) = load_nodes(nodes_file(tmp_path, [" node-x , 8000 , 1024 , 1 , T4 "]))
    assert node.name == "node-x"
    assert node.cpu_milli == 8000
    assert [g.model for g in node.gpus] == ["T4"]


def test_load_nodes_ignores_extra_columns(tmp_path: Path) -> None:
    path = write(tmp_path, "n.csv", NODE_HEADER + ",rack", ["node-a,1000,1024,1,T4,r1"])
    (node,) = load_nodes(path)
    assert len(node.gpus) == 1


def test_exclusive_pod_takes_whole_gpus(tmp_path: Path, nodes: list[Node]) -> None:
    (pod,) = load_pods(pods_file(tmp_path, ["p-whole,12000,16384,2,1000,"]), nodes)

    request = pod.request
    assert request.name == "p-whole"
    assert (request.cpu_milli, request.memory_mib) == (12000, 16384)
    assert request.gpu_count == 2
    assert request.exclusive is True
    assert request.memory_mib_per_gpu == 0
    assert request.core_percent_per_gpu == 0
    assert request.allowed_models == frozenset()
    assert pod.requested_gpus == 2.0


@pytest.mark.parametrize(
    ("gpu_milli", "memory_mib_per_gpu", "core_percent"),
    [(500, 8000, 50), (460, 7360, 46), (100, 1600, 10), (1, 16, 1), (999, 15984, 100)],
)
def test_shared_pod_maps_milli_to_memory_and_core(
    tmp_path: Path, nodes: list[Node], gpu_milli: int, memory_mib_per_gpu: int, core_percent: int
) -> None:
    (pod,) = load_pods(pods_file(tmp_path, [f"p,6000,12288,1,{gpu_milli},"]), nodes)

    request = pod.request
    assert request.exclusive is False
    assert request.gpu_count == 1
    assert request.memory_mib_per_gpu == memory_mib_per_gpu == gpu_milli * 16
    assert request.core_percent_per_gpu == core_percent
    assert pod.requested_gpus == pytest.approx(gpu_milli / 1000)


def test_requested_gpus_is_count_times_share(tmp_path: Path, nodes: list[Node]) -> None:
    rows = ["p1,1000,1024,4,250,", "p2,1000,1024,1,1000,", "p3,1000,1024,0,0,", "p4,0,0,3,500,"]
    pods = load_pods(pods_file(tmp_path, rows), nodes)
    assert [p.requested_gpus for p in pods] == [1.0, 1.0, 0.0, 1.5]
    cpu_only = pods[2].request
    assert cpu_only.gpu_count == 0
    assert not cpu_only.exclusive
    assert cpu_only.memory_mib_per_gpu == 0


def test_gpu_spec_lists_allowed_models(tmp_path: Path, nodes: list[Node]) -> None:
    rows = ["p1,1000,1024,1,500,P100|V100M32", "p2,1000,1024,1,500, P100 ", "p3,1000,1024,1,500,"]
    pods = load_pods(pods_file(tmp_path, rows), nodes)
    assert pods[0].request.allowed_models == frozenset({"P100", "V100M32"})
    assert pods[1].request.allowed_models == frozenset({"P100"})
    assert pods[2].request.allowed_models == frozenset()


def test_gpu_spec_with_one_known_model_is_accepted(tmp_path: Path, nodes: list[Node]) -> None:
    (pod,) = load_pods(pods_file(tmp_path, ["p,1000,1024,1,500,P100|H100"]), nodes)
    assert "P100" in pod.request.allowed_models


def test_pod_without_name_is_named_after_its_row(tmp_path: Path, nodes: list[Node]) -> None:
    pods = load_pods(pods_file(tmp_path, ["a,1,1,1,500,", ",1,1,1,500,"]), nodes)
    assert [p.request.name for p in pods] == ["a", "row-3"]


def test_pods_keep_file_order_and_ignore_extra_columns(tmp_path: Path, nodes: list[Node]) -> None:
    path = write(
        tmp_path,
        "pods.csv",
        POD_HEADER + ",qos,pod_phase",
        [f"p{i},1000,1024,1,{100 * (i + 1)},,LS,Running" for i in range(5)],
    )
    pods = load_pods(path, nodes)
    assert [p.request.name for p in pods] == [f"p{i}" for i in range(5)]


def test_pod_may_ask_for_as_many_gpus_as_the_widest_node(tmp_path: Path, nodes: list[Node]) -> None:
    (pod,) = load_pods(pods_file(tmp_path, ["p,1000,1024,8,1000,"]), nodes)
    assert pod.request.gpu_count == 8


def test_trailing_blank_line_is_not_a_row(tmp_path: Path, nodes: list[Node]) -> None:
    path = tmp_path / "pods.csv"
    path.write_text(POD_HEADER + "\np,1000,1024,1,500,\n\n", encoding="utf-8")
    assert len(load_pods(path, nodes)) == 1


def test_file_saved_with_utf8_byte_order_mark_is_read(tmp_path: Path, nodes: list[Node]) -> None:
    # Spreadsheets ("CSV UTF-8" in Excel) start the file with a byte order mark.
    path = tmp_path / "pods.csv"
    path.write_bytes(b"\xef\xbb\xbf" + (POD_HEADER + "\np,1000,1024,1,500,\n").encode())
    (pod,) = load_pods(path, nodes)
    assert pod.request.name == "p"


# -- bad files: the file as a whole --------------------------------------------------------------


def test_missing_file(tmp_path: Path, nodes: list[Node]) -> None:
    missing = tmp_path / "nope.csv"
    message = trace_error(load_nodes, missing)
    assert str(missing) in message and "no such file" in message
    message = trace_error(load_pods, missing, nodes)
    assert str(missing) in message and "no such file" in message


def test_directory_is_reported_as_a_directory(tmp_path: Path) -> None:
    folder = tmp_path / "a-folder.csv"
    folder.mkdir()
    message = trace_error(load_nodes, folder)
    assert str(folder) in message
    # The path exists: saying "no such file" sends the user looking for a typo.
    assert "no such file" not in message
    assert any(word in message for word in ("director", "folder", "not a file")), message


@pytest.mark.parametrize("missing", ["gpu", "model", "sn"])
def test_nodes_missing_one_column(tmp_path: Path, missing: str) -> None:
    columns = NODE_HEADER.split(",")
    keep = [c for c in columns if c != missing]
    values = {"sn": "n", "cpu_milli": "1", "memory_mib": "1", "gpu": "1", "model": "T4"}
    path = write(tmp_path, "nodes.csv", ",".join(keep), [",".join(values[c] for c in keep)])
    message = trace_error(load_nodes, path)
    assert str(path) in message
    assert "missing column" in message and missing in message


def test_pods_missing_several_columns_names_them_all(tmp_path: Path, nodes: list[Node]) -> None:
    path = write(tmp_path, "pods.csv", "name,cpu_milli,memory_mib", ["p,1,1"])
    message = trace_error(load_pods, path, nodes)
    assert str(path) in message and "missing column" in message
    for column in ("num_gpu", "gpu_milli", "gpu_spec"):
        assert column in message


def test_node_list_given_as_pod_list(tmp_path: Path, nodes: list[Node]) -> None:
    message = trace_error(load_pods, nodes_file(tmp_path), nodes)
    assert "missing column" in message and "num_gpu" in message


@pytest.mark.parametrize("content", ["", "\n"])
def test_empty_node_file(tmp_path: Path, content: str) -> None:
    path = tmp_path / "nodes.csv"
    path.write_text(content, encoding="utf-8")
    message = trace_error(load_nodes, path)
    assert str(path) in message
    assert any(p in message for p in ("empty", "missing column", "no nodes")), message


def test_empty_pod_file(tmp_path: Path, nodes: list[Node]) -> None:
    path = tmp_path / "pods.csv"
    path.write_text("", encoding="utf-8")
    message = trace_error(load_pods, path, nodes)
    assert str(path) in message
    assert any(p in message for p in ("empty", "missing column", "no pods")), message


def test_node_file_with_header_only(tmp_path: Path) -> None:
    path = nodes_file(tmp_path, [])
    message = trace_error(load_nodes, path)
    assert str(path) in message and "no nodes" in message


def test_pod_file_with_header_only(tmp_path: Path, nodes: list[Node]) -> None:
    path = pods_file(tmp_path, [])
    message = trace_error(load_pods, path, nodes)
    assert str(path) in message and "no pods" in message


def test_non_utf8_bytes(tmp_path: Path, nodes: list[Node]) -> None:
    path = tmp_path / "pods.csv"
    path.write_bytes((POD_HEADER + "\np1,1,1,1,500,\n").encode() + b"p\xe9,1,1,1,500,\n")
    message = trace_error(load_pods, path, nodes)
    assert str(path) in message and "UTF-8" in message


def test_non_utf8_bytes_name_their_row(tmp_path: Path, nodes: list[Node]) -> None:
    # A Latin-1 'e acute' in row 3 of a small file: the user needs to know which row to fix.
    path = tmp_path / "pods.csv"
    path.write_bytes((POD_HEADER + "\np1,1,1,1,500,\n").encode() + b"caf\xe9,1,1,1,500,\n")
    message = trace_error(load_pods, path, nodes)
    assert_row_error(message, path, 3, "UTF-8")


def test_binary_file(tmp_path: Path) -> None:
    path = tmp_path / "nodes.csv"
    path.write_bytes(bytes(range(256)) * 4)
    message = trace_error(load_nodes, path)
    assert str(path) in message


# -- bad files: one row --------------------------------------------------------------------------


def test_too_many_fields(tmp_path: Path, nodes: list[Node]) -> None:
    path = pods_file(tmp_path, ["p1,1,1,1,500,", "p2,1,1,1,500,,surplus,more"])
    assert_row_error(trace_error(load_pods, path, nodes), path, 3, "wrong number of fields")


def test_too_few_fields(tmp_path: Path) -> None:
    path = nodes_file(tmp_path, ["n1,1000,1024,1,T4", "n2,1000,1024,1,T4", "n3,1000,1024"])
    assert_row_error(trace_error(load_nodes, path), path, 4, "wrong number of fields")


@pytest.mark.parametrize(
    ("row", "column", "shown"),
    [
        ("p,abc,1,1,500,", "cpu_milli", "'abc'"),
        ("p,1,1.5,1,500,", "memory_mib", "'1.5'"),
        ("p,1,1,one,500,", "num_gpu", "'one'"),
        ("p,1,1,1,,", "gpu_milli", "''"),
        ("p,1,1,1,nan,", "gpu_milli", "'nan'"),
    ],
)
def test_pod_non_numeric(
    tmp_path: Path, nodes: list[Node], row: str, column: str, shown: str
) -> None:
    path = pods_file(tmp_path, ["ok,1,1,1,500,", row])
    message = trace_error(load_pods, path, nodes)
    assert_row_error(message, path, 3, column, "whole number", shown)


@pytest.mark.parametrize(
    ("row", "column"),
    [("n,x,1,1,T4", "cpu_milli"), ("n,1,1,two,T4", "gpu"), ("n,1,,1,T4", "memory_mib")],
)
def test_node_non_numeric(tmp_path: Path, row: str, column: str) -> None:
    path = nodes_file(tmp_path, [row])
    assert_row_error(trace_error(load_nodes, path), path, 2, column, "whole number")


@pytest.mark.parametrize(
    ("row", "column"),
    [
        ("p,-1,1,1,500,", "cpu_milli"),
        ("p,1,-1024,1,500,", "memory_mib"),
        ("p,1,1,-1,500,", "num_gpu"),
        ("p,1,1,1,-500,", "gpu_milli"),
    ],
)
def test_pod_negative(tmp_path: Path, nodes: list[Node], row: str, column: str) -> None:
    path = pods_file(tmp_path, ["ok,1,1,0,0,", "ok2,1,1,0,0,", row])
    message = trace_error(load_pods, path, nodes)
    assert_row_error(message, path, 4, column, "negative")


@pytest.mark.parametrize(("row", "column"), [("n,-1,1,1,T4", "cpu_milli"), ("n,1,1,-2,T4", "gpu")])
def test_node_negative(tmp_path: Path, row: str, column: str) -> None:
    path = nodes_file(tmp_path, [row])
    assert_row_error(trace_error(load_nodes, path), path, 2, column, "negative")


def test_gpu_milli_over_1000(tmp_path: Path, nodes: list[Node]) -> None:
    path = pods_file(tmp_path, ["p,1,1,1,1001,"])
    assert_row_error(trace_error(load_pods, path, nodes), path, 2, "gpu_milli", "1000", "1001")


def test_gpu_milli_without_num_gpu(tmp_path: Path, nodes: list[Node]) -> None:
    path = pods_file(tmp_path, ["ok,1,1,1,500,", "p,1,1,0,500,"])
    assert_row_error(trace_error(load_pods, path, nodes), path, 3, "gpu_milli", "num_gpu is 0")


def test_num_gpu_without_gpu_milli(tmp_path: Path, nodes: list[Node]) -> None:
    path = pods_file(tmp_path, ["ok,1,1,1,500,", "p,1,1,2,0,"])
    assert_row_error(trace_error(load_pods, path, nodes), path, 3, "num_gpu", "gpu_milli is 0")


def test_pod_wider_than_any_node(tmp_path: Path, nodes: list[Node]) -> None:
    path = pods_file(tmp_path, ["ok,1,1,1,500,", "huge,1,1,9,1000,"])
    message = trace_error(load_pods, path, nodes)
    assert_row_error(message, path, 3, "huge", "9 GPUs", "8")


def test_pod_wider_than_any_node_of_its_allowed_model(tmp_path: Path, nodes: list[Node]) -> None:
    # P100 nodes have 2 GPUs; an 8-GPU pod pinned to P100 can never be placed, although a
    # V100M32 node has 8 GPUs. load_pods promises: "a pod that no node could ever hold is an
    # error, not a failure".
    path = pods_file(tmp_path, ["ok,1,1,1,500,", "pinned,1,1,8,1000,P100"])
    message = trace_error(load_pods, path, nodes)
    assert_row_error(message, path, 3, "pinned")


def test_gpu_pod_on_cluster_without_gpus(tmp_path: Path) -> None:
    cpu_nodes = [Node("n1", (), 1000, 1024), Node("n2", (), 1000, 1024)]
    path = pods_file(tmp_path, ["p,1,1,1,500,"])
    assert_row_error(trace_error(load_pods, path, cpu_nodes), path, 2, "p", "GPU")


def test_gpu_spec_naming_no_known_model(tmp_path: Path, nodes: list[Node]) -> None:
    path = pods_file(tmp_path, ["ok,1,1,1,500,P100", "p,1,1,1,500,H100|A100"])
    message = trace_error(load_pods, path, nodes)
    assert_row_error(message, path, 3, "gpu_spec", "H100|A100")


def test_duplicate_node_name(tmp_path: Path) -> None:
    path = nodes_file(tmp_path, ["n1,1,1,1,T4", "n2,1,1,1,T4", "n1,1,1,2,T4"])
    assert_row_error(trace_error(load_nodes, path), path, 4, "n1", "twice")


def test_node_with_gpus_but_no_model(tmp_path: Path) -> None:
    path = nodes_file(tmp_path, ["n1,1,1,0,", "n2,1,1,2,"])
    assert_row_error(trace_error(load_nodes, path), path, 3, "n2", "no model")


def test_node_without_name(tmp_path: Path) -> None:
    path = nodes_file(tmp_path, ["n1,1,1,1,T4", ",1,1,1,T4"])
    assert_row_error(trace_error(load_nodes, path), path, 3, "sn")


def test_row_numbers_count_blank_lines(tmp_path: Path, nodes: list[Node]) -> None:
    # "Row numbers as a spreadsheet shows them": a blank line is a row in a spreadsheet (and
    # a line in an editor), so the bad row below is row 4, not row 3.
    path = tmp_path / "pods.csv"
    path.write_text(POD_HEADER + "\nok,1,1,1,500,\n\nbad,1,1,1,x,\n", encoding="utf-8")
    assert_row_error(trace_error(load_pods, path, nodes), path, 4, "gpu_milli")


def test_trace_error_is_a_value_error() -> None:
    assert issubclass(TraceError, ValueError)


def test_duplicate_pod_name(tmp_path: Path) -> None:
    nodes = load_nodes(nodes_file(tmp_path, ["n1,64000,262144,2,T4"]))
    path = pods_file(tmp_path, ["a,1,1,1,500,", "b,1,1,1,500,", "a,1,1,0,0,"])
    assert_row_error(trace_error(load_pods, path, nodes), path, 4, "a", "twice", "row 2")
