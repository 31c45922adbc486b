"""deploy/*.yaml: valid for the real kube-apiserver, and consistent with the code they run.

The manifests cannot be run here (no kubelet, no image), so they are checked the ways that can
fail: the API server validates every object (server-side dry run), every container's args parse
with the `gpushare` command they are given to, and the paths and ports agree with the contract.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import Client, codecs
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Namespace

from gpushare import protocol
from gpushare.cli.main import build_parser

ROOT = Path(__file__).parents[2]
MANIFESTS = sorted((ROOT / "deploy").glob("*.yaml"))
IMAGE_PREFIX = "ghcr.io/gpushare/gpushare:"


def documents() -> list[dict[str, Any]]:
    return [doc for path in MANIFESTS for doc in yaml.safe_load_all(path.read_text()) if doc]


def workloads() -> dict[str, dict[str, Any]]:
    return {
        doc["metadata"]["name"]: doc["spec"]["template"]["spec"]
        for doc in documents()
        if doc["kind"] in ("Deployment", "DaemonSet")
    }


def test_manifests_exist() -> None:
    assert {path.name for path in MANIFESTS} >= {"extender.yaml", "node-agent.yaml"}


def test_every_object_passes_the_api_servers_validation(kube: Client) -> None:
    try:
        kube.create(Namespace.from_dict({"metadata": {"name": "gpushare-system"}}))
    except ApiError as error:
        assert error.status.code == 409, error  # already there from an earlier run
    checked = 0
    for path in MANIFESTS:
        for obj in codecs.load_all_yaml(path.read_text()):
            if obj.kind == "Namespace":
                continue
            try:
                kube.create(obj, dry_run=True)
            except ApiError as error:
                pytest.fail(f"{path.name}: {obj.kind} {obj.metadata.name}: {error.status.message}")
            checked += 1
    assert checked >= 10


@pytest.mark.parametrize("workload", ["gpushare-extender", "gpushare-node"])
def test_every_gpushare_container_runs_a_command_that_parses(workload: str) -> None:
    spec = workloads()[workload]
    containers = [c for c in spec["containers"] if c["image"].startswith(IMAGE_PREFIX)]
    assert containers
    for container in containers:
        try:
            build_parser().parse_args(container["args"])
        except SystemExit:
            pytest.fail(f"{workload}/{container['name']}: gpushare {container['args']} fails")


def test_paths_and_ports_agree_with_the_contract() -> None:
    node = workloads()["gpushare-node"]
    host_paths = {v["name"]: v["hostPath"]["path"] for v in node["volumes"]}
    assert host_paths["device-plugins"] == protocol.KUBELET_DEVICE_PLUGIN_DIR
    assert host_paths["pod-resources"] == str(Path(protocol.KUBELET_POD_RESOURCES_SOCKET).parent)
    assert host_paths["state"] == protocol.HOST_STATE_ROOT
    assert host_paths["library"] == str(Path(protocol.HOST_LIBRARY_PATH).parent)
    (install,) = node["initContainers"]
    assert protocol.HOST_LIBRARY_PATH in install["command"][-1]
    extender = workloads()["gpushare-extender"]["containers"][0]
    assert f"--url=http://0.0.0.0:{protocol.EXTENDER_DEFAULT_PORT}" in " ".join(extender["args"])
    assert protocol.EXTENDER_PATH_PREFIX in " ".join(extender["args"])
    monitor = next(c for c in node["containers"] if c["name"] == "monitor")
    assert f"--listen=0.0.0.0:{protocol.MONITOR_DEFAULT_PORT}" in monitor["args"]
    assert monitor["ports"][0]["containerPort"] == protocol.MONITOR_DEFAULT_PORT


def test_the_dockerfiles_make_target_exists() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "make -C /src/native build/libgpushare.so" in dockerfile
    dry = subprocess.run(
        ["make", "-n", "-C", str(ROOT / "native"), "build/libgpushare.so"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert dry.returncode == 0, dry.stderr
