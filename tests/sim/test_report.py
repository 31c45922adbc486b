"""What a run shows: the JSON document other tools read, the table and the PNG plot."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import orjson
import pytest
from rich.console import Console

from gpushare.placement.policies import DEFAULT_POLICY
from gpushare.sim.report import plot, print_table, to_json
from gpushare.sim.runner import PolicySummary
from gpushare.sim.simulator import SeedResult

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
POINT_KEYS = {"90", "100", "110", "130"}
POLICY_KEYS = {
    "unallocated_pct_at_100",
    "alloc_pct",
    "alloc_pct_std",
    "frag_rate_pct_at_100",
    "failed_pods",
    "wall_s",
}


def summary(policy: str, allocated: list[list[float]], failed=(2, 3)) -> PolicySummary:
    arrived = np.linspace(0, 150, 16)  # 0, 10, ..., 150
    results = [
        SeedResult(
            seed=seed,
            arrived_pct=arrived,
            allocated_pct=np.array(curve, dtype=float),
            failed_pods_at_100=0,
            failed_pods=failed[k],
            frag_rate_pct_at_100=12.345678,
            wall_s=0.123456,
        )
        for k, (seed, curve) in enumerate(zip((42, 43), allocated, strict=True))
    ]
    return PolicySummary.of(policy, results)


def curve(plateau: float) -> list[float]:
    return [min(a, plateau) for a in np.linspace(0, 150, 16)]


@pytest.fixture
def summaries() -> list[PolicySummary]:
    names = list(dict.fromkeys([DEFAULT_POLICY, "best-fit"]))
    return [summary(name, [curve(92 - k), curve(88 - k)]) for k, name in enumerate(names)]


def test_json_has_exactly_the_documented_keys(summaries, tmp_path: Path) -> None:
    pods, nodes = tmp_path / "pods.csv", tmp_path / "nodes.csv"
    document = orjson.loads(to_json(summaries, DEFAULT_POLICY, [42, 43], pods, nodes))

    assert set(document) == {"default_policy", "seeds", "pods", "nodes", "policies"}
    assert document["default_policy"] == DEFAULT_POLICY
    assert document["seeds"] == [42, 43]
    assert document["pods"] == str(pods)
    assert document["nodes"] == str(nodes)
    assert list(document["policies"]) == [s.policy for s in summaries]
    for entry in document["policies"].values():
        assert set(entry) >= POLICY_KEYS
        assert set(entry["alloc_pct"]) == POINT_KEYS
        assert set(entry["alloc_pct_std"]) == POINT_KEYS
        for key in POLICY_KEYS - {"alloc_pct", "alloc_pct_std"}:
            assert isinstance(entry[key], int | float)


def test_json_values_are_the_summary_figures(summaries, tmp_path: Path) -> None:
    document = orjson.loads(to_json(summaries, DEFAULT_POLICY, [42, 43], tmp_path, tmp_path))
    first = summaries[0]
    entry = document["policies"][first.policy]
    # Plateaus at 92 and 88: 90 mean, sample std 2 * sqrt(2) at and after 100% arrival.
    assert entry["unallocated_pct_at_100"] == pytest.approx(10.0)
    assert entry["alloc_pct"]["100"] == pytest.approx(90.0)
    assert entry["alloc_pct"]["90"] == pytest.approx(89.0)  # 90 and 88
    assert entry["alloc_pct_std"]["100"] == pytest.approx(round(2 * np.sqrt(2), 4))
    assert entry["frag_rate_pct_at_100"] == pytest.approx(12.3457)
    assert entry["failed_pods"] == round(first.failed_pods)
    assert entry["wall_s"] == pytest.approx(round(first.wall_s, 3))


def test_table_marks_the_default_policy(summaries) -> None:
    console = Console(width=200, record=True, force_terminal=False)
    print_table(summaries, DEFAULT_POLICY, console)
    text = console.export_text()
    assert f"{DEFAULT_POLICY} (default)" in text
    assert "best-fit" in text
    assert "90.00" in text  # the default policy's mean allocation at 100%


def test_plot_writes_a_png(summaries, tmp_path: Path) -> None:
    path = tmp_path / "curves.png"
    plot(summaries, path)
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width > 100 and height > 100
    assert len(data) > 5000  # axes, curves and legend, not an empty image
    assert data.endswith(b"IEND\xaeB`\x82")


def test_plot_of_one_policy(tmp_path: Path) -> None:
    path = tmp_path / "one.png"
    plot([summary("random", [curve(80), curve(85)])], path)
    assert path.read_bytes()[:8] == PNG_SIGNATURE
