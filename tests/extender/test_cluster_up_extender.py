"""`gpushare cluster up --extender` runs the extender as one of the cluster's processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from lightkube import Client, KubeConfig
from lightkube.resources.core_v1 import Namespace, Pod

from gpushare import protocol
from gpushare.cluster import NodeSpec, down, status, up


def test_cluster_up_with_the_extender_places_a_share(
    tmp_path, k8s_bin_dir, cluster_helpers
) -> None:
    state_dir = tmp_path / "state"
    try:
        info = up(
            state_dir,
            NodeSpec(count=1, gpus_per_node=2, gpu_model="T4"),
            bin_dir=k8s_bin_dir,
            extender=True,
            tie_to_parent=True,
        )
        assert "extender" in info.processes
        found = status(state_dir)
        assert found.running and found.alive["extender"]
        client = Client(config=KubeConfig.from_file(info.kubeconfig), field_manager="tests")
        client.create(Namespace.from_dict({"metadata": {"name": "e"}}))
        limits = {protocol.RESOURCE_GPU_MEMORY: "3"}
        client.create(
            Pod.from_dict(
                {
                    "metadata": {"name": "share"},
                    "spec": {
                        "containers": [
                            {"name": "main", "image": "busybox", "resources": {"limits": limits}}
                        ]
                    },
                }
            ),
            namespace="e",
        )
        bound = cluster_helpers.wait_for(
            info.kubeconfig, Pod, "share", lambda p: bool(p.spec.nodeName), namespace="e"
        )
        (share,) = json.loads(bound.metadata.annotations[protocol.ANNOTATION_ALLOCATION])["main"]
        assert share["memoryMiB"] == 3 * 1024
        client.close()
        shown = subprocess.run(
            [
                sys.executable,
                "-m",
                "gpushare.cli.main",
                "cluster",
                "status",
                "--state-dir",
                str(state_dir),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        assert shown.returncode == 0, shown.stdout + shown.stderr
        assert "extender" in shown.stdout
    finally:
        down(state_dir, timeout=10)
        cluster_helpers.assert_no_processes_left(state_dir)


def test_extender_cli_rejects_a_bad_url() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "gpushare.cli.main", "extender", "--url", "ftp://x"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert shown.returncode == 2
    assert "expected http://HOST:PORT/PREFIX" in shown.stderr


@pytest.mark.parametrize(
    ("given", "problem"),
    [(["--candidate-nodes", "some"], "'some'"), ([], "'-1'")],
)
def test_extender_cli_rejects_a_bad_candidate_count(given: list[str], problem: str) -> None:
    env = {**os.environ, "GPUSHARE_EXTENDER_CANDIDATE_NODES": "-1"}
    shown = subprocess.run(
        [sys.executable, "-m", "gpushare.cli.main", "extender", *given],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    assert shown.returncode == 2
    assert "--candidate-nodes" in shown.stderr
    assert f"expected a whole number or auto, got {problem}" in shown.stderr
    assert "Traceback" not in shown.stderr
