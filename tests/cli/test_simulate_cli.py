"""`gpushare simulate` as a user runs it: one-line errors for bad input, results for good input."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from gpushare.cli.main import main
from gpushare.placement.policies import DEFAULT_POLICY

ERROR_PREFIX = "gpushare simulate: error:"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model"
POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec"
NODES = ["n1,32000,131072,2,T4", "n2,32000,131072,4,V100", "n3,16000,65536,1,T4"]
PODS = [
    "p1,4000,8192,1,500,",
    "p2,4000,8192,1,1000,",
    "p3,2000,4096,2,1000,V100",
    "p4,4000,8192,1,250,T4",
    "p5,1000,2048,1,750,",
]
# Two policies that every version of the engine has; the default may change, so it is imported.
POLICIES = list(dict.fromkeys([DEFAULT_POLICY, "best-fit"]))
# Errors must come back long before this; a run of the tiny files above takes well under 1 s.
TIMEOUT_S = 10


def write(path: Path, header: str, rows: list[str]) -> Path:
    path.write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def nodes(tmp_path: Path) -> Path:
    return write(tmp_path / "nodes.csv", NODE_HEADER, NODES)


@pytest.fixture
def pods(tmp_path: Path) -> Path:
    return write(tmp_path / "pods.csv", POD_HEADER, PODS)


def gpushare(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """The console command, with stdout and stderr piped as in a CI log."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    return subprocess.run(
        [sys.executable, "-m", "gpushare.cli.main", *map(str, args)],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=TIMEOUT_S,
        env=env,
        check=False,
    )


def simulate_cmd(nodes: Path, pods: Path, *extra: str | Path) -> subprocess.CompletedProcess[str]:
    return gpushare(
        "simulate", "--nodes", nodes, "--pods", pods, "--seeds", "1..2", "--workers", "1", *extra
    )


def one_line_error(process: subprocess.CompletedProcess[str], *fragments: str) -> str:
    assert process.returncode != 0, process.stdout
    assert "Traceback" not in process.stderr, process.stderr
    lines = process.stderr.strip().splitlines()
    assert len(lines) == 1, process.stderr
    (line,) = lines
    assert line.startswith(ERROR_PREFIX), line
    for fragment in fragments:
        assert fragment in line, f"{fragment!r} not in {line!r}"
    return line


# -- bad input: trace files ----------------------------------------------------------------------


def test_missing_pods_file(tmp_path: Path, nodes: Path) -> None:
    missing = tmp_path / "no-such-pods.csv"
    one_line_error(simulate_cmd(nodes, missing), str(missing), "no such file")


def test_missing_nodes_file(tmp_path: Path, pods: Path) -> None:
    missing = tmp_path / "no-such-nodes.csv"
    one_line_error(simulate_cmd(missing, pods), str(missing), "no such file")


def test_wrong_columns(tmp_path: Path, nodes: Path) -> None:
    bad = write(tmp_path / "bad.csv", "name,cpu,mem,gpus", ["p1,1,1,1"])
    one_line_error(simulate_cmd(nodes, bad), str(bad), "missing column", "num_gpu", "gpu_milli")


def test_node_list_and_pod_list_swapped(nodes: Path, pods: Path) -> None:
    one_line_error(simulate_cmd(pods, nodes), str(pods), "missing column", "sn")


def test_negative_value(tmp_path: Path, nodes: Path) -> None:
    bad = write(tmp_path / "bad.csv", POD_HEADER, [*PODS[:2], "p3,1000,-5,1,500,"])
    one_line_error(simulate_cmd(nodes, bad), str(bad), "row 4", "memory_mib", "negative")


def test_non_numeric_value(tmp_path: Path, pods: Path) -> None:
    bad = write(tmp_path / "bad.csv", NODE_HEADER, [NODES[0], "n2,lots,1024,2,T4"])
    one_line_error(simulate_cmd(bad, pods), str(bad), "row 3", "cpu_milli", "'lots'")


def test_pod_asking_for_more_gpus_than_any_node(tmp_path: Path, nodes: Path) -> None:
    bad = write(tmp_path / "bad.csv", POD_HEADER, [PODS[0], "giant,1000,1024,5,1000,"])
    one_line_error(simulate_cmd(nodes, bad), str(bad), "row 3", "giant", "5 GPUs", "4")


def test_non_utf8_pods_file(tmp_path: Path, nodes: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_bytes((POD_HEADER + "\n").encode() + b"caf\xe9,1,1,1,500,\n")
    one_line_error(simulate_cmd(nodes, bad), str(bad), "UTF-8")


def test_cluster_without_gpus(tmp_path: Path) -> None:
    # Nothing to simulate: the capacity is 0 GPUs. The user must get a one-line error, not a
    # ZeroDivisionError traceback (runs with GPU pods are already refused by load_pods).
    cpu_nodes = write(tmp_path / "cpu-nodes.csv", NODE_HEADER, ["c1,32000,65536,0,"])
    cpu_pods = write(tmp_path / "cpu-pods.csv", POD_HEADER, ["p1,1000,1024,0,0,"])
    one_line_error(simulate_cmd(cpu_nodes, cpu_pods))


def test_pod_list_asking_for_no_gpu(tmp_path: Path, nodes: Path) -> None:
    # Arrival is measured in requested GPU: a list of CPU-only pods can never reach the target,
    # and drawing pods until it does must not loop forever (subprocess.TimeoutExpired here).
    cpu_pods = write(tmp_path / "cpu-pods.csv", POD_HEADER, ["p1,1000,1024,0,0,", "p2,1,1,0,0,"])
    one_line_error(simulate_cmd(nodes, cpu_pods), str(cpu_pods))


# -- bad input: options --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seeds", "problem"),
    [
        ("x", "expected a range A..B or a list"),
        ("5..1", "ends before it starts"),
        ("", "no seeds"),
        ("1,1", "twice"),
        ("1..x", "expected a range A..B or a list"),
        ("-3", "negative"),
    ],
)
def test_bad_seeds(nodes: Path, pods: Path, seeds: str, problem: str) -> None:
    process = gpushare("simulate", "--nodes", nodes, "--pods", pods, f"--seeds={seeds}")
    one_line_error(process, "--seeds", repr(seeds), problem)


@pytest.mark.parametrize("policy", ["no-such-policy", "best-fit/nope", "a/b/c", "fgd/"])
def test_unknown_policy(nodes: Path, pods: Path, policy: str) -> None:
    process = simulate_cmd(nodes, pods, "--policy", policy)
    one_line_error(process, "--policy")


def test_unknown_policy_lists_the_known_ones(nodes: Path, pods: Path) -> None:
    line = one_line_error(simulate_cmd(nodes, pods, "--policy", "no-such-policy"))
    assert "no-such-policy" in line
    assert DEFAULT_POLICY in line and "best-fit" in line


@pytest.mark.parametrize("inflate", ["0", "-1", "nan", "inf", "abc", ""])
def test_bad_inflate(nodes: Path, pods: Path, inflate: str) -> None:
    one_line_error(simulate_cmd(nodes, pods, f"--inflate={inflate}"), "--inflate", repr(inflate))


def test_negative_inflate_as_a_separate_argument(nodes: Path, pods: Path) -> None:
    # As typed: `--inflate -1`, not `--inflate=-1`; argparse must not take -1 for an option.
    one_line_error(simulate_cmd(nodes, pods, "--inflate", "-1"), "--inflate", "'-1'")


@pytest.mark.parametrize("workers", ["0", "-2", "many"])
def test_bad_workers(nodes: Path, pods: Path, workers: str) -> None:
    process = gpushare("simulate", "--nodes", nodes, "--pods", pods, f"--workers={workers}")
    one_line_error(process, "--workers")


@pytest.mark.parametrize("option", ["--json", "--plot"])
def test_output_into_missing_folder(tmp_path: Path, nodes: Path, pods: Path, option: str) -> None:
    target = tmp_path / "missing" / ("out.json" if option == "--json" else "out.png")
    line = one_line_error(simulate_cmd(nodes, pods, option, target), option, "does not exist")
    assert "missing" in line
    assert not (tmp_path / "missing").exists()


def test_output_onto_a_folder(tmp_path: Path, nodes: Path, pods: Path) -> None:
    one_line_error(simulate_cmd(nodes, pods, "--json", tmp_path), "--json", "folder")


def test_plot_with_an_extension_matplotlib_cannot_write(
    tmp_path: Path, nodes: Path, pods: Path
) -> None:
    # Output paths are checked before the (possibly hour-long) run so that a typo costs
    # nothing; a plot name matplotlib cannot write must not end the run with a traceback.
    target = tmp_path / "curves.txt"
    process = simulate_cmd(nodes, pods, "--plot", target)
    assert "Traceback" not in process.stderr, process.stderr
    if process.returncode == 0:  # written as the PNG the option promises
        assert target.read_bytes()[:8] == PNG_SIGNATURE
    else:
        one_line_error(process, "--plot")


# -- good input ----------------------------------------------------------------------------------


def run_main(nodes: Path, pods: Path, *extra: str | Path) -> int:
    return main(
        [
            "simulate",
            "--nodes",
            str(nodes),
            "--pods",
            str(pods),
            "--seeds",
            "1..2",
            "--workers",
            "1",
            "--policy",
            *POLICIES,
            *map(str, extra),
        ]
    )


def test_good_run_writes_json_and_plot(tmp_path: Path, nodes: Path, pods: Path, capsys) -> None:
    json_path, png_path = tmp_path / "out.json", tmp_path / "out.png"
    assert run_main(nodes, pods, "--json", json_path, "--plot", png_path) == 0

    document = orjson.loads(json_path.read_bytes())
    assert set(document) == {"default_policy", "seeds", "pods", "nodes", "policies"}
    assert document["default_policy"] == DEFAULT_POLICY
    assert document["seeds"] == [1, 2]
    assert document["pods"] == str(pods)
    assert document["nodes"] == str(nodes)
    assert list(document["policies"]) == POLICIES
    for entry in document["policies"].values():
        assert set(entry["alloc_pct"]) == {"90", "100", "110", "130"}
        assert set(entry["alloc_pct_std"]) == {"90", "100", "110", "130"}
        for key in ("unallocated_pct_at_100", "frag_rate_pct_at_100", "failed_pods", "wall_s"):
            assert isinstance(entry[key], int | float)
        assert 0 <= entry["unallocated_pct_at_100"] <= 100
        assert entry["unallocated_pct_at_100"] == pytest.approx(100 - entry["alloc_pct"]["100"])

    data = png_path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 5000

    out = capsys.readouterr().out
    assert f"results written to {json_path}" in out.replace("\n", "")
    assert f"plot written to {png_path}" in out.replace("\n", "")


def test_good_run_prints_every_policy_in_the_table(
    nodes: Path, pods: Path, capsys, monkeypatch
) -> None:
    # 80 columns: what rich uses when no terminal is attached (a CI log, `> out.txt`).
    monkeypatch.setenv("COLUMNS", "80")
    assert run_main(nodes, pods) == 0
    out = capsys.readouterr().out
    assert "GPU allocation over 2 seed(s)" in out
    for policy in POLICIES:
        assert policy in out, f"{policy!r} missing from the table:\n{out}"
    assert f"{DEFAULT_POLICY} (default)" in out


def test_good_run_table_figures_are_not_cut_off(
    tmp_path: Path, nodes: Path, pods: Path, capsys, monkeypatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    json_path = tmp_path / "out.json"
    assert run_main(nodes, pods, "--json", json_path) == 0
    out = capsys.readouterr().out
    document = orjson.loads(json_path.read_bytes())
    for entry in document["policies"].values():
        for point in ("90", "100", "110", "130"):
            assert f"{entry['alloc_pct'][point]:.2f}" in out, out
    assert "…" not in out, out


PROGRESS = re.compile(r"^\[(\d+)/(\d+)\] (\S+) seed (\d+): .*unallocated at 100% arrival")


def check_progress(stderr: str, policies: list[str], seeds: list[int]) -> None:
    lines = stderr.strip().splitlines()
    total = len(policies) * len(seeds)
    assert len(lines) == total, stderr
    seen = []
    for k, line in enumerate(lines, start=1):
        match = PROGRESS.match(line)
        assert match, line
        assert (int(match[1]), int(match[2])) == (k, total)
        seen.append((match[3], int(match[4])))
    assert sorted(seen) == sorted((p, s) for p in policies for s in seeds)


def test_good_run_reports_progress_lines_when_not_a_terminal(
    nodes: Path, pods: Path, capsys
) -> None:
    assert run_main(nodes, pods) == 0
    check_progress(capsys.readouterr().err, POLICIES, [1, 2])


def test_console_command_with_workers(tmp_path: Path, nodes: Path, pods: Path) -> None:
    json_path = tmp_path / "out.json"
    process = gpushare(
        "simulate",
        "--nodes",
        nodes,
        "--pods",
        pods,
        "--seeds",
        "3,7,5",
        "--workers",
        "2",
        "--policy",
        *POLICIES,
        "--json",
        json_path,
    )
    assert process.returncode == 0, process.stderr
    check_progress(process.stderr, POLICIES, [3, 7, 5])
    assert orjson.loads(json_path.read_bytes())["seeds"] == [3, 7, 5]


def test_duplicate_policies_are_run_once(nodes: Path, pods: Path, capsys) -> None:
    assert run_main(nodes, pods, "--policy", "random", "random") == 0
    check_progress(capsys.readouterr().err, ["random"], [1, 2])


def test_combined_policy(tmp_path: Path, nodes: Path, pods: Path) -> None:
    json_path = tmp_path / "out.json"
    process = simulate_cmd(nodes, pods, "--policy", "best-fit/random", "--json", json_path)
    assert process.returncode == 0, process.stderr
    assert list(orjson.loads(json_path.read_bytes())["policies"]) == ["best-fit/random"]


def test_simulate_help(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for option in ("--policy", "--seeds", "--pods", "--nodes", "--inflate", "--json", "--plot"):
        assert option in out
