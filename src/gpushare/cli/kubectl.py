"""`kubectl gpushare` (the `kubectl-gpushare` executable, a kubectl plugin): `inspect`.

Lists the nodes and the pods once each, builds the report in gpushare.monitor.inspect and
prints it as a table (in the style of Alibaba's `kubectl inspect cgpu`), JSON or YAML.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpushare import protocol
from gpushare.monitor.inspect import (
    Report,
    amount,
    build_report,
    detail_rows,
    summary_rows,
    to_json,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kubectl gpushare", description="gpushare's view of the cluster's GPUs."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    inspect = commands.add_parser(
        "inspect",
        help="GPU memory allocated and total, per GPU, node and cluster",
        description="GPU memory allocated and total per GPU, node and cluster; -d adds each "
        "pod's share of each GPU.",
    )
    inspect.add_argument("nodes", nargs="*", metavar="NODE", help="only these nodes")
    inspect.add_argument("-d", "--details", action="store_true", help="each pod's share")
    inspect.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")
    inspect.add_argument(
        "--unit", choices=("GiB", "MiB"), default="GiB", help="the table's unit (default GiB)"
    )
    inspect.add_argument(
        "--memory-unit",
        choices=("GiB", "MiB"),
        default="GiB",
        help="the unit of gpushare.io/gpu-mem requests, as the extender's --memory-unit "
        "(default GiB; used for pending pods)",
    )
    inspect.add_argument(
        "--kubeconfig", type=Path, default=None, help="default: $KUBECONFIG, else ~/.kube/config"
    )
    inspect.add_argument("--context", default=None, help="the kubeconfig context to use")
    inspect.set_defaults(run=run_inspect)
    return parser


def _fail(message: str, status: int = 1) -> int:
    print(f"kubectl gpushare: error: {message}", file=sys.stderr)
    return status


def list_cluster(kubeconfig: Path | None, context: str | None) -> tuple[list[Any], list[Any]]:
    """All nodes and all pods, one list call each."""
    from lightkube import Client, KubeConfig
    from lightkube.resources.core_v1 import Node, Pod

    if kubeconfig is not None:
        config = KubeConfig.from_file(kubeconfig)
    elif os.environ.get("KUBECONFIG"):
        config = KubeConfig.from_file(os.environ["KUBECONFIG"].split(os.pathsep)[0])
    else:
        config = KubeConfig.from_env()
    # An unknown context raises ConfigError ("Context 'x' not found"): one line to the user.
    client = Client(config=config.get(context_name=context) if context else config)
    try:
        nodes = [node.to_dict() for node in client.list(Node)]
        pods = [pod.to_dict() for pod in client.list(Pod, namespace="*")]
    finally:
        client.close()
    return nodes, pods


def render_table(report: Report, details: bool, unit: str) -> str:
    """The table text, as printed (no colour, no wrapping)."""
    from rich.console import Console
    from rich.table import Table

    def table(header: list[str], rows: list[list[str]]) -> Table:
        result = Table(box=None, show_edge=False, pad_edge=False, header_style="")
        for name in header:
            result.add_column(name, no_wrap=True)
        for row in rows:
            result.add_row(*row)
        return result

    console = Console(width=10_000, color_system=None, highlight=False, record=True, file=_Null())
    rule = "-" * 72
    if details:
        for node in report.nodes:
            console.print(f"NAME:       {node.name}")
            console.print(f"IPADDRESS:  {node.ip}")
            if node.problem:
                console.print(f"PROBLEM:    {node.problem}")
            console.print()
            console.print(table(*detail_rows(node, unit)))
            percent = round(100 * node.allocated_mib / node.total_mib) if node.total_mib else 0
            console.print(f"Allocated/Total GPU Memory({unit}): ", end="")
            console.print(
                f"{amount(node.allocated_mib, unit)}/{amount(node.total_mib, unit)} ({percent}%)"
            )
            console.print(rule)
    else:
        console.print(table(*summary_rows(report, unit)))
        console.print(rule)
    console.print(f"Allocated/Total GPU Memory In Cluster({unit}):")
    console.print(
        f"{amount(report.allocated_mib, unit)}/{amount(report.total_mib, unit)} ({report.percent}%)"
    )
    return "\n".join(line.rstrip() for line in console.export_text().splitlines()) + "\n"


class _Null:
    """A file that drops what it is given (the console records, then we print once)."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


def run_inspect(args: argparse.Namespace) -> int:
    try:
        nodes, pods = list_cluster(args.kubeconfig, args.context)
    except Exception as error:  # no kubeconfig, unreachable or refusing API server
        text = str(error).splitlines()[0] if str(error) else type(error).__name__
        return _fail(f"cannot list nodes and pods: {text}")
    mib_per_unit = protocol.MIB_PER_GIB if args.memory_unit == "GiB" else 1
    only = set(args.nodes) if args.nodes else None
    report = build_report(nodes, pods, mib_per_unit=mib_per_unit, only=only)
    if only is not None:
        missing = sorted(only - {node.name for node in report.nodes})
        if missing:
            return _fail(f"not gpushare nodes: {', '.join(missing)}")
    if args.output == "json":
        sys.stdout.write(json.dumps(to_json(report), indent=2) + "\n")
    elif args.output == "yaml":
        import yaml

        sys.stdout.write(yaml.safe_dump(to_json(report), sort_keys=False))
    else:
        sys.stdout.write(render_table(report, args.details, args.unit))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
