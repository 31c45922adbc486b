"""`gpushare extender`: the scheduler extender, as kube-scheduler's configuration calls it."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from urllib.parse import urlsplit

from gpushare import protocol
from gpushare.extender.cache import ClusterCache
from gpushare.extender.requests import Units


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "extender",
        help="the scheduler extender kube-scheduler calls to place GPU shares",
        description="Serve kube-scheduler's filter, prioritize and bind calls for pods that "
        "ask for gpushare.io/* resources, with a cache fed by watches on nodes and pods.",
    )
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        default=None,
        help="the API server to watch and bind through (default: $KUBECONFIG)",
    )
    parser.add_argument(
        "--url",
        default=f"http://127.0.0.1:{protocol.EXTENDER_DEFAULT_PORT}{protocol.EXTENDER_PATH_PREFIX}",
        help="where to serve: the urlPrefix of kube-scheduler's extender entry "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--memory-unit",
        choices=("GiB", "MiB"),
        default="GiB",
        help="the unit of gpushare.io/gpu-mem (default GiB)",
    )
    parser.add_argument(
        "--compat-aliyun",
        action="store_true",
        default=os.environ.get("GPUSHARE_COMPAT_ALIYUN", "") in ("1", "true"),
        help="also place pods that ask for Alibaba gpushare's aliyun.com/gpu-mem (GiB per "
        "GPU) and aliyun.com/gpu-count, and write its ALIYUN_COM_GPU_MEM_* annotations "
        "(default: $GPUSHARE_COMPAT_ALIYUN, else off)",
    )
    parser.add_argument(
        "--candidate-nodes",
        type=candidate_nodes,
        default=os.environ.get("GPUSHARE_EXTENDER_CANDIDATE_NODES") or "auto",
        metavar="N|auto",
        help="filter passes at most N nodes, those the GPU placement policy scores highest, "
        "so kube-scheduler scores N nodes instead of every node that fits (0: all); auto: "
        "the best node alone for pods without preferred affinities or ScheduleAnyway spread "
        "constraints, all for pods with them (default $GPUSHARE_EXTENDER_CANDIDATE_NODES, "
        "else auto)",
    )
    parser.add_argument(
        "--resync", type=float, default=300.0, help="seconds between full relists (default 300)"
    )
    parser.add_argument(
        "--leader-elect",
        action="store_true",
        help="elect a leader among replicas with the Lease gpushare-extender; only the "
        "leader answers kube-scheduler, the others answer 503 and report not ready "
        "(default off: one replica)",
    )
    parser.add_argument(
        "--leader-elect-namespace",
        default="kube-system",
        help="the namespace of the Lease (default %(default)s)",
    )
    parser.add_argument(
        "--leader-elect-identity",
        default=None,
        help="this replica's holderIdentity (default: $POD_NAME or the host name, and a "
        "random suffix)",
    )
    parser.add_argument("--log-level", default="INFO", help="default INFO")
    parser.set_defaults(run=run)


def candidate_nodes(text: str) -> int | None:
    """``--candidate-nodes``: a count of nodes (0: all), or ``auto`` (None)."""
    if text.strip().lower() == "auto":
        return None
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number or auto, got {text!r}")
    return int(text)


def parse_url(url: str) -> tuple[str, int, str]:
    """(host, port, path prefix) of an extender URL prefix; ValueError if it is not one."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"--url {url}: expected http://HOST:PORT/PREFIX")
    port = parts.port or 80
    return parts.hostname, port, parts.path.rstrip("/")


def run(args: argparse.Namespace) -> int:
    from lightkube import Client, KubeConfig

    from gpushare.extender.binding import BindingClient
    from gpushare.extender.leader import LeaderElector
    from gpushare.extender.nudge import CapacityNudger
    from gpushare.extender.server import BIND_THREADS, Extender, make_server
    from gpushare.extender.watch import KubeBinder, Watcher

    # kube-scheduler waits for filter and prioritize in its one scheduling loop, so their
    # latency is its throughput. With Python's default 5 ms GIL switch interval a handler
    # thread can wait that long behind the watch or a bind thread; 0.5 ms keeps it short.
    sys.setswitchinterval(0.0005)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        host, port, prefix = parse_url(args.url)
    except ValueError as error:
        print(f"gpushare extender: error: {error}", file=sys.stderr)
        return 2
    kubeconfig = args.kubeconfig or (
        Path(os.environ["KUBECONFIG"]) if "KUBECONFIG" in os.environ else None
    )
    try:
        config = KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_env()
        client = Client(config=config, field_manager="gpushare-extender")
    except Exception as error:
        print(f"gpushare extender: error: no usable kubeconfig: {error}", file=sys.stderr)
        return 2
    unit = protocol.MIB_PER_GIB if args.memory_unit == "GiB" else 1
    cache = ClusterCache(Units(memory_mib_per_unit=unit, compat_aliyun=args.compat_aliyun))
    elector = None
    if args.leader_elect:
        elector = LeaderElector(
            client, identity=args.leader_elect_identity, namespace=args.leader_elect_namespace
        )
    is_leader = (lambda: elector.is_leader) if elector is not None else None
    try:
        bindings = BindingClient(config.get(), BIND_THREADS)
    except Exception as error:
        print(f"gpushare extender: error: no usable kubeconfig: {error}", file=sys.stderr)
        return 2
    binder = KubeBinder(client, bindings)
    nudger = CapacityNudger(binder.annotate_node, is_leader)
    cache.on_freed = nudger.freed
    try:
        extender = Extender(cache, binder, is_leader, nudger, args.candidate_nodes)
        server = make_server(extender, host, port, prefix)
    except OSError as error:
        print(f"gpushare extender: error: cannot listen on {host}:{port}: {error}", file=sys.stderr)
        return 1
    watcher = Watcher(client, cache, resync_s=args.resync)
    watcher.start()
    nudger.start()
    if elector is not None:
        elector.start()
    stop = threading.Event()

    def shutdown(*_: object) -> None:
        stop.set()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, shutdown)
    logging.getLogger("gpushare.extender").info("serving on http://%s:%d%s", host, port, prefix)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        if elector is not None:
            elector.stop(release=True)
        watcher.stop()
        nudger.stop()
        server.server_close()
        bindings.close()
        client.close()
    return 0
