"""`gpushare`: one command with a subcommand per component."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gpushare.cli import cluster, deviceplugin, extender, monitor, simulate


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpushare",
        description="Share NVIDIA GPUs safely between Kubernetes pods.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    simulate.add_parser(commands)
    cluster.add_parser(commands)
    extender.add_parser(commands)
    deviceplugin.add_parser(commands)
    monitor.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except KeyboardInterrupt:
        print("gpushare: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
