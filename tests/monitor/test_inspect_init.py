"""inspect counts a pod's GPU memory as the extender does: init containers by the max rule."""

from __future__ import annotations

from gpushare import protocol
from gpushare.monitor.inspect import build_report

GIB = 1024


def test_an_init_container_inside_its_apps_share_adds_nothing() -> None:
    gpus = [protocol.GpuInfo("GPU-a", 0, "T4", 16 * GIB)]
    node = {
        "metadata": {
            "name": "n1",
            "labels": {protocol.LABEL_ENABLED: "true"},
            "annotations": {protocol.ANNOTATION_GPUS: protocol.encode_gpus(gpus)},
        }
    }
    shares = {
        "app": [protocol.ShareInfo("GPU-a", 0, 10 * GIB, 0)],
        "setup": [protocol.ShareInfo("GPU-a", 0, 8 * GIB, 0)],
        "proxy": [protocol.ShareInfo("GPU-a", 0, 1 * GIB, 0)],
    }
    pod = {
        "metadata": {
            "name": "p",
            "namespace": "default",
            "annotations": {protocol.ANNOTATION_ALLOCATION: protocol.encode_allocation(shares)},
        },
        "spec": {
            "nodeName": "n1",
            "initContainers": [{"name": "setup"}, {"name": "proxy", "restartPolicy": "Always"}],
            "containers": [{"name": "app"}],
        },
        "status": {"phase": "Running"},
    }
    (use,) = build_report([node], [pod]).nodes
    # app 10 + sidecar 1 run together; the 8 GiB init container runs before them.
    assert use.gpus[0].allocated_mib == 11 * GIB
    assert use.pods[0].gpus == {0: 11 * GIB}
