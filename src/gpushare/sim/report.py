"""What a simulation run shows a user: a table, the JSON other tools read, and a plot."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import orjson
from rich.console import Console
from rich.table import Table

from gpushare.sim.runner import CURVE_ARRIVAL_PCT, PolicySummary
from gpushare.sim.simulator import REPORT_POINTS_PCT

# Published means over seeds 42..51 on the default pod list (Weng et al., ATC'23):
# unallocated GPU % at 100% arrival.
PAPER_UNALLOCATED_PCT_AT_100 = {
    "random": 13.70,
    "dot-product": 9.38,
    "gpu-packing": 8.22,
    "best-fit": 7.14,
    "fgd": 4.77,
}


def to_json(
    summaries: Sequence[PolicySummary],
    default_policy: str,
    seeds: Sequence[int],
    pods_path: Path,
    nodes_path: Path,
) -> bytes:
    document = {
        "default_policy": default_policy,
        "seeds": list(seeds),
        "pods": str(pods_path),
        "nodes": str(nodes_path),
        "policies": {
            s.policy: {
                "unallocated_pct_at_100": round(s.unallocated_pct_at_100, 4),
                "unallocated_pct_at_100_std": round(s.unallocated_pct_at_100_std, 4),
                "alloc_pct": {k: round(v, 4) for k, v in s.alloc_pct.items()},
                "alloc_pct_std": {k: round(v, 4) for k, v in s.alloc_pct_std.items()},
                "frag_rate_pct_at_100": round(s.frag_rate_pct_at_100, 4),
                "failed_pods": round(s.failed_pods),
                "wall_s": round(s.wall_s, 3),
            }
            for s in summaries
        },
    }
    return orjson.dumps(document, option=orjson.OPT_INDENT_2)


def table(summaries: Sequence[PolicySummary], default_policy: str) -> Table:
    seeds = summaries[0].seeds if summaries else ()
    title = f"GPU allocation over {len(seeds)} seed(s); arrival = requested GPU, % of capacity"
    result = Table(title=title, title_justify="left")
    result.add_column("policy", no_wrap=True)
    result.add_column("unallocated % at 100%\n(paper)", justify="right")
    for point in REPORT_POINTS_PCT:
        result.add_column(f"alloc % at {point}%", justify="right")
    result.add_column("frag rate % at 100%", justify="right")
    result.add_column("failed pods\n(per seed)", justify="right")
    result.add_column("time s", justify="right")
    for s in summaries:
        paper = PAPER_UNALLOCATED_PCT_AT_100.get(s.policy)
        unallocated = f"{s.unallocated_pct_at_100:.2f} ± {s.unallocated_pct_at_100_std:.2f}"
        if paper is not None:
            unallocated += f"\n({paper:.2f})"
        name = f"{s.policy} (default)" if s.policy == default_policy else s.policy
        result.add_row(
            name,
            unallocated,
            *(f"{s.alloc_pct[str(p)]:.2f}" for p in REPORT_POINTS_PCT),
            f"{s.frag_rate_pct_at_100:.1f}",
            f"{s.failed_pods:.0f}",
            f"{s.wall_s:.1f}",
        )
    return result


def print_table(summaries: Sequence[PolicySummary], default_policy: str, console: Console) -> None:
    console.print(table(summaries, default_policy))


def plot(summaries: Sequence[PolicySummary], path: Path) -> None:
    """Allocation ratio against arrived workload, one curve per policy."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(8, 5), dpi=120)
    for s in summaries:
        label = f"{s.policy} ({s.unallocated_pct_at_100:.2f}% unallocated at 100%)"
        axes.plot(CURVE_ARRIVAL_PCT, s.curve_alloc_pct, label=label, linewidth=1.6)
    axes.plot([0, 100], [0, 100], color="grey", linestyle=":", linewidth=1, label="ideal")
    axes.axvline(100, color="grey", linewidth=0.8)
    axes.set_xlabel("arrived workload (requested GPU, % of cluster capacity)")
    axes.set_ylabel("GPU allocation ratio (%)")
    axes.set_xlim(70, CURVE_ARRIVAL_PCT[-1])
    axes.set_ylim(70, 100)
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right", fontsize=8)
    seeds = summaries[0].seeds if summaries else ()
    axes.set_title(f"GPU allocation vs arrival, mean of {len(seeds)} seed(s)")
    figure.tight_layout()
    figure.savefig(path, format="png")
    pyplot.close(figure)
