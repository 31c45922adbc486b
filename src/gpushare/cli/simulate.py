"""`gpushare simulate`: replay a GPU trace through the placement engine, per policy."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from gpushare.placement.engine import resolve_policy
from gpushare.placement.policies import DEFAULT_POLICY, POLICIES, PolicyError
from gpushare.sim.report import plot, print_table, to_json
from gpushare.sim.runner import SimulationSpec, simulate
from gpushare.sim.simulator import SeedResult
from gpushare.sim.trace import DEFAULT_NODES, DEFAULT_PODS, TraceError, load_nodes, load_pods

DEFAULT_SEEDS = "42..51"


class UsageError(ValueError):
    """A command-line value that cannot be used; reported before any work starts."""


def parse_seeds(text: str) -> list[int]:
    """'A..B' (inclusive) or a comma-separated list of whole numbers."""
    try:
        if ".." in text:
            first, last = (int(part) for part in text.split("..", 1))
            seeds = list(range(first, last + 1))
            if last < first:
                seeds = []
        else:
            seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(
            f"--seeds {text!r}: expected a range A..B or a list like 1,2,3 of whole numbers"
        ) from None
    if ".." in text and not seeds:
        raise UsageError(f"--seeds {text!r}: the range ends before it starts")
    if not seeds:
        raise UsageError(f"--seeds {text!r}: no seeds given")
    if any(seed < 0 for seed in seeds):
        raise UsageError(f"--seeds {text!r}: seeds must not be negative")
    if len(set(seeds)) != len(seeds):
        raise UsageError(f"--seeds {text!r}: a seed is given twice")
    return seeds


def check_policy(name: str) -> str:
    """A policy name, or NODE/GPU to combine one policy's node half with another's GPU half."""
    parts = name.split("/")
    if len(parts) > 2 or not all(parts):
        raise UsageError(f"--policy {name!r}: expected NAME or NODE_POLICY/GPU_POLICY")
    for part in parts:
        try:
            resolve_policy(part)
        except PolicyError as error:
            raise UsageError(f"--policy: {error}") from None
    return name


def check_output(path: Path | None, option: str, suffix: str) -> None:
    if path is None:
        return
    if path.is_dir():
        raise UsageError(f"{option} {path}: is a folder")
    if path.suffix.lower() != suffix:
        raise UsageError(f"{option} {path}: the file name must end in {suffix}")
    parent = path.resolve().parent
    if not parent.is_dir():
        raise UsageError(f"{option} {path}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"{option} {path}: folder {parent} is not writable")


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "simulate",
        help="replay a production GPU trace through the placement policies",
        description=(
            "Replay the Alibaba GPU trace (cluster-trace-gpu-v2023) with the method of the FGD "
            "paper and report, per policy, how much of the cluster's GPU capacity gets allocated."
        ),
    )
    parser.add_argument(
        "--policy",
        nargs="+",
        default=[DEFAULT_POLICY],
        metavar="NAME",
        help=f"policies to compare ({', '.join(sorted(POLICIES))}); NODE/GPU combines two; "
        f"default: {DEFAULT_POLICY}",
    )
    parser.add_argument(
        "--seeds", default=DEFAULT_SEEDS, help=f"A..B or a,b,c (default {DEFAULT_SEEDS})"
    )
    parser.add_argument("--pods", type=Path, default=DEFAULT_PODS, help="pod list CSV")
    parser.add_argument("--nodes", type=Path, default=DEFAULT_NODES, help="node list CSV")
    parser.add_argument(
        "--inflate",
        type=str,
        default="1.3",
        help="draw pods until requested GPU reaches this multiple of capacity (default 1.3)",
    )
    parser.add_argument("--json", type=Path, help="write the results as JSON here")
    parser.add_argument("--plot", type=Path, help="write allocation-vs-arrival curves (PNG)")
    parser.add_argument(
        "--workers", type=str, default=str(os.cpu_count() or 1), help="worker processes"
    )
    parser.set_defaults(run=run)


def _positive(text: str, option: str, kind: type) -> float:
    try:
        value = kind(text)
    except ValueError:
        raise UsageError(f"{option} {text!r}: not a number") from None
    if not value > 0 or value != value or value == float("inf"):
        raise UsageError(f"{option} {text!r}: must be a positive finite number")
    return value


def run(args: argparse.Namespace) -> int:
    error_console = Console(stderr=True)
    try:
        seeds = parse_seeds(args.seeds)
        policies = [check_policy(name) for name in dict.fromkeys(args.policy)]
        inflate = _positive(args.inflate, "--inflate", float)
        workers = int(_positive(args.workers, "--workers", int))
        check_output(args.json, "--json", ".json")
        check_output(args.plot, "--plot", ".png")
        nodes = load_nodes(args.nodes)
        pods = load_pods(args.pods, nodes)
    except (UsageError, TraceError) as error:
        print(f"gpushare simulate: error: {error}", file=sys.stderr)
        return 2

    spec = SimulationSpec(
        nodes=nodes,
        pods=pods,
        policies=policies,
        seeds=seeds,
        inflate=inflate,
        nodes_path=args.nodes,
        pods_path=args.pods,
        workers=workers,
    )
    # Off a terminal (CI logs, a file) rich would assume 80 columns and cut the table.
    console = Console() if sys.stdout.isatty() else Console(width=160)
    interactive = sys.stderr.isatty()
    total = len(policies) * len(seeds)
    if interactive:
        progress = Progress(
            TextColumn("simulating"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=error_console,
            transient=True,
        )
        with progress:
            task = progress.add_task("", total=total)

            def advance(policy: str, result: SeedResult, done: int, _total: int) -> None:
                progress.update(task, completed=done, description=f"{policy} seed {result.seed}")

            summaries = simulate(spec, advance)
    else:

        def report(policy: str, result: SeedResult, done: int, all_tasks: int) -> None:
            print(
                f"[{done}/{all_tasks}] {policy} seed {result.seed}: "
                f"{100 - result.allocated_at(100):.2f}% unallocated at 100% arrival "
                f"({result.wall_s:.1f} s)",
                file=sys.stderr,
                flush=True,
            )

        summaries = simulate(spec, report)

    print_table(summaries, DEFAULT_POLICY, console)
    if args.json:
        args.json.write_bytes(to_json(summaries, DEFAULT_POLICY, seeds, args.pods, args.nodes))
        console.print(f"results written to {args.json}")
    if args.plot:
        plot(summaries, args.plot)
        console.print(f"plot written to {args.plot}")
    return 0
