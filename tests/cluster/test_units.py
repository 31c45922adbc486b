"""The parts of `gpushare cluster` that need no running control plane."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpushare import protocol
from gpushare.cli.main import main
from gpushare.cluster import configs, nodes, pki, processes
from gpushare.cluster.binaries import check_bin_dir
from gpushare.cluster.state import ClusterError, ClusterState, ProcessRecord, StateDir

# --- nodes -------------------------------------------------------------------------------


def test_nodes_from_options() -> None:
    built = nodes.build_nodes(nodes.NodeSpec(count=3, gpus_per_node=8, gpu_model="H200"))
    assert [n.name for n in built] == ["gpu-node-00", "gpu-node-01", "gpu-node-02"]
    node = built[0]
    assert len(node.gpus) == 8
    assert {gpu.memory_mib for gpu in node.gpus} == {141 * 1024}
    assert [gpu.numa_node for gpu in node.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert len({gpu.uuid for n in built for gpu in n.gpus}) == 24


def test_node_manifest_has_capacity_labels_and_annotation() -> None:
    node = nodes.build_nodes(
        nodes.NodeSpec(count=1, gpus_per_node=2, gpu_model="T4", cpu=16, memory_gib=64)
    )[0]
    manifest = nodes.node_manifest(node, pods=110)
    status = manifest["status"]
    assert status["capacity"] == {
        "cpu": "16",
        "memory": "64Gi",
        "pods": "110",
        "gpushare.io/gpu-mem": "32",
        "gpushare.io/gpu-core": "200",
        "gpushare.io/gpu": "2",
    }
    assert status["allocatable"] == status["capacity"]
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"
    labels = manifest["metadata"]["labels"]
    assert labels[protocol.LABEL_ENABLED] == "true"
    assert labels[protocol.LABEL_GPU_MODEL] == "T4"
    gpus = protocol.decode_gpus(manifest["metadata"]["annotations"][protocol.ANNOTATION_GPUS])
    assert [(g.index, g.model, g.memory_mib, g.healthy) for g in gpus] == [
        (0, "T4", 16384, True),
        (1, "T4", 16384, True),
    ]


def test_nodes_from_trace_list(tmp_path: Path) -> None:
    csv = tmp_path / "nodes.csv"
    csv.write_text(
        "sn,cpu_milli,memory_mib,gpu,model\n"
        "n-0,64000,262144,2,V100M32\n"
        "n-1,96500,393216,8,G2\n"
        "n-2,32000,131072,0,\n"
    )
    built = nodes.build_nodes(nodes.NodeSpec(node_list=csv))
    assert [n.name for n in built] == ["n-0", "n-1", "n-2"]
    caps = [nodes.resources(n, 110) for n in built]
    assert caps[0]["gpushare.io/gpu-mem"] == "64"  # V100M32: 32 GiB each
    assert caps[1]["gpushare.io/gpu-mem"] == str(8 * nodes.FALLBACK_GPU_MEMORY_GIB)
    assert caps[1]["cpu"] == "96500m"
    assert caps[2]["gpushare.io/gpu"] == "0"
    assert protocol.LABEL_ENABLED not in nodes.node_manifest(built[2], 110)["metadata"]["labels"]
    override = nodes.build_nodes(nodes.NodeSpec(node_list=csv, gpu_memory_gib=40))
    assert nodes.resources(override[0], 110)["gpushare.io/gpu-mem"] == "80"


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ("sn,cpu_milli,memory_mib,gpu\nn,1,1,1\n", "missing column"),
        ("sn,cpu_milli,memory_mib,gpu,model\nn,1,1,x,T4\n", "gpu must be a whole number"),
        ("sn,cpu_milli,memory_mib,gpu,model\nBad_Name,1,1,1,T4\n", "not a valid Kubernetes name"),
    ],
)
def test_malformed_node_list_is_one_line_error(tmp_path: Path, body: str, problem: str) -> None:
    csv = tmp_path / "nodes.csv"
    csv.write_text(body)
    with pytest.raises(ClusterError, match=problem) as error:
        nodes.build_nodes(nodes.NodeSpec(node_list=csv))
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        (nodes.NodeSpec(count=0), "--nodes 0"),
        (nodes.NodeSpec(gpus_per_node=-1), "--gpus-per-node"),
        (nodes.NodeSpec(gpu_memory_gib=0), "--gpu-memory-gib"),
        (nodes.NodeSpec(name_prefix="Gpu_"), "--node-prefix"),
    ],
)
def test_bad_node_options(spec: nodes.NodeSpec, problem: str) -> None:
    with pytest.raises(ClusterError, match=problem):
        nodes.build_nodes(spec)


def test_cli_malformed_node_list_exits_non_zero_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    csv = tmp_path / "nodes.csv"
    csv.write_text("sn,cpu_milli,memory_mib,gpu,model\nn-0,64000,oops,2,T4\n")
    state = tmp_path / "state"
    code = main(["cluster", "up", "--state-dir", str(state), "--node-list", str(csv)])
    err = capsys.readouterr().err
    assert code != 0
    assert err.count("\n") == 1
    assert "row 2: memory_mib must be a whole number" in err
    assert not state.exists()  # nothing was started or written


def test_lease_manifest() -> None:
    lease = nodes.lease_manifest("n-0", "uid-1")
    assert lease["metadata"]["namespace"] == "kube-node-lease"
    assert lease["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert lease["spec"]["holderIdentity"] == "n-0"
    assert lease["spec"]["renewTime"].endswith("Z")


# --- pki and configs -----------------------------------------------------------------------


def test_pki_certificates(tmp_path: Path) -> None:
    made = pki.create(tmp_path / "pki")
    ca = x509.load_pem_x509_certificate(made.ca.cert_pem())
    admin = x509.load_pem_x509_certificate(made.admin.cert_pem())
    admin.verify_directly_issued_by(ca)
    subject = admin.subject
    assert subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "system:masters"
    usages = admin.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    server = x509.load_pem_x509_certificate(made.apiserver.cert_pem())
    server.verify_directly_issued_by(ca)
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "kubernetes.default.svc" in names.get_values_for_type(x509.DNSName)
    assert os.stat(made.admin.key).st_mode & 0o777 == 0o600
    assert made.service_account_pub.read_text().startswith("-----BEGIN PUBLIC KEY-----")


def test_kubeconfig_is_self_contained(tmp_path: Path) -> None:
    made = pki.create(tmp_path / "pki")
    path = tmp_path / "kubeconfig"
    configs.write_kubeconfig(path, "https://127.0.0.1:1234", made.ca.cert, "admin", made.admin)
    config = yaml.safe_load(path.read_text())
    assert config["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:1234"
    assert "client-key-data" in config["users"][0]["user"]
    assert os.stat(path).st_mode & 0o777 == 0o600


def test_scheduler_config_in_project_has_the_extender() -> None:
    config = configs.load_scheduler_config()
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    (extender,) = config["extenders"]
    assert extender["urlPrefix"] == (
        f"http://127.0.0.1:{protocol.EXTENDER_DEFAULT_PORT}{protocol.EXTENDER_PATH_PREFIX}"
    )
    assert extender["filterVerb"] == protocol.EXTENDER_FILTER_VERB
    assert extender["prioritizeVerb"] == protocol.EXTENDER_PRIORITIZE_VERB
    assert extender["bindVerb"] == protocol.EXTENDER_BIND_VERB
    assert extender["nodeCacheCapable"] is True
    assert [r["name"] for r in extender["managedResources"]] == list(
        protocol.SCHEDULER_MANAGED_RESOURCES
    )
    assert all(r["ignoredByScheduler"] for r in extender["managedResources"])


def test_rendered_scheduler_config(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "scheduler.kubeconfig"
    plain = yaml.safe_load(configs.render_scheduler_config(kubeconfig, extender=False))
    assert "extenders" not in plain
    assert plain["clientConnection"]["kubeconfig"] == str(kubeconfig)
    assert plain["leaderElection"] == {"leaderElect": False}
    assert plain["profiles"] == configs.load_scheduler_config()["profiles"]
    url = "http://127.0.0.1:5000/gpushare-scheduler"
    extended = yaml.safe_load(
        configs.render_scheduler_config(kubeconfig, extender=True, extender_url=url + "/")
    )
    assert extended["extenders"][0]["urlPrefix"] == url


# --- state dir, processes, binaries --------------------------------------------------------


def test_state_dir_refuses_foreign_folder(tmp_path: Path) -> None:
    foreign = tmp_path / "home"
    foreign.mkdir()
    (foreign / "precious.txt").write_text("keep me")
    directory = StateDir(foreign)
    with pytest.raises(ClusterError, match="not made by gpushare"):
        directory.create()
    with pytest.raises(ClusterError, match="not removing"):
        directory.remove()
    assert (foreign / "precious.txt").exists()


def test_state_round_trip(tmp_path: Path) -> None:
    directory = StateDir(tmp_path / "s")
    directory.create()
    assert directory.root.stat().st_mode & 0o777 == 0o700
    state = ClusterState(
        state_dir=str(directory.root),
        kubeconfig="k",
        bin_dir="b",
        apiserver_url="https://127.0.0.1:1",
        node_count=2,
        processes={"etcd": ProcessRecord("etcd", 12, "log", 5, "u")},
    )
    directory.write_state(state)
    assert directory.read_state() == state
    directory.state_file.write_text("{broken")
    assert directory.read_state() is None
    directory.remove()
    assert not directory.root.exists()


def test_process_ownership_by_state_dir(tmp_path: Path) -> None:
    ours = tmp_path / "cluster"
    sibling = tmp_path / "cluster2"
    for folder in (ours, sibling):
        folder.mkdir()
    process = processes.spawn(
        [sys.executable, "-c", "import time; time.sleep(60)", f"--data-dir={ours}/etcd"],
        tmp_path / "log",
        tmp_path / "pid",
        tie_to_parent=True,
    )
    try:
        assert processes.is_ours(process.pid, str(ours))
        assert not processes.is_ours(process.pid, str(sibling))
        assert process.pid in processes.processes_with(str(ours))
        assert int((tmp_path / "pid").read_text()) == process.pid
    finally:
        killed = processes.stop([process.pid], str(ours), timeout=5)
    assert killed == []
    assert not processes.is_ours(process.pid, str(ours))


def test_stop_kills_a_process_that_ignores_sigterm(tmp_path: Path) -> None:
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print(1, flush=True); time.sleep(60)"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None and process.stdout.readline() == "1\n"
    started = time.monotonic()
    assert processes.stop([process.pid], str(tmp_path), timeout=0.5) == [process.pid]
    assert time.monotonic() - started < 5
    assert processes.cmdline(process.pid) is None  # gone (and reaped: no zombie either)


def test_port_in_use_is_reported(tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(ClusterError, match=f"--apiserver-port {port}: port already in use"):
            processes.check_port_free(port, "--apiserver-port")


def test_corrupt_cache_is_reported(tmp_path: Path) -> None:
    for program in ("etcd", "kube-apiserver"):
        path = tmp_path / program
        path.write_bytes(b"\x7fELF....")
        path.chmod(0o755)
    with pytest.raises(ClusterError, match=r"kube-scheduler is missing \(corrupt cache"):
        check_bin_dir(tmp_path, "test")
    (tmp_path / "kube-scheduler").write_text("truncated")
    (tmp_path / "kube-scheduler").chmod(0o755)
    with pytest.raises(ClusterError, match="not a program"):
        check_bin_dir(tmp_path, "test")


def test_memory_quantities_are_canonical() -> None:
    assert nodes._quantity_memory(512 * 1024) == "512Gi"
    assert nodes._quantity_memory(2 * 1024 * 1024) == "2Ti"
    assert nodes._quantity_memory(262144 + 512) == "262656Mi"
    assert nodes._quantity_memory(0) == "0Mi"
