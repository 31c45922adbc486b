"""Finding etcd, kube-apiserver and kube-scheduler.

``scripts/k8s-binaries`` builds them from source into a cache (the first time takes a long
while) and prints the folder that holds them; its progress goes to stderr, which we pass
through. ``GPUSHARE_K8S_BIN_DIR`` or ``--bin-dir`` names a folder to use instead.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
from pathlib import Path

from gpushare.cluster.state import ClusterError

REPO_ROOT = Path(__file__).resolve().parents[3]
SCRIPT = REPO_ROOT / "scripts" / "k8s-binaries"
BIN_DIR_ENV = "GPUSHARE_K8S_BIN_DIR"
PROGRAMS = ("etcd", "kube-apiserver", "kube-scheduler")


def check_bin_dir(bin_dir: Path, origin: str) -> Path:
    """``bin_dir`` if it holds the three programs, runnable; else a one-line ClusterError."""
    if not bin_dir.is_dir():
        raise ClusterError(f"{origin}: {bin_dir} is not a folder")
    for program in PROGRAMS:
        path = bin_dir / program
        if not path.is_file():
            raise ClusterError(
                f"{origin}: {path} is missing (corrupt cache? remove {bin_dir} and rerun)"
            )
        if not os.access(path, os.X_OK):
            raise ClusterError(f"{origin}: {path} is not executable (corrupt cache?)")
        with path.open("rb") as file:
            if file.read(4) != b"\x7fELF":
                raise ClusterError(
                    f"{origin}: {path} is not a program (corrupt cache? remove {bin_dir} and rerun)"
                )
    return bin_dir.resolve()


def find_bin_dir(explicit: Path | None = None) -> Path:
    """The folder with etcd, kube-apiserver and kube-scheduler, building them if needed."""
    if explicit is not None:
        return check_bin_dir(explicit.expanduser(), "--bin-dir")
    if os.environ.get(BIN_DIR_ENV):
        return check_bin_dir(Path(os.environ[BIN_DIR_ENV]).expanduser(), BIN_DIR_ENV)
    if not SCRIPT.is_file():
        raise ClusterError(f"{SCRIPT} is missing: cannot build the Kubernetes binaries")
    tail: collections.deque[str] = collections.deque(maxlen=20)
    try:
        process = subprocess.Popen(
            [str(SCRIPT)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    except OSError as error:
        raise ClusterError(f"{SCRIPT}: cannot run: {error.strerror}") from None
    # stdout is read after stderr ends: the script prints one line there, at the end.
    assert process.stderr is not None and process.stdout is not None
    for line in process.stderr:  # progress (a first build takes a while): pass it through
        if line.strip():
            tail.append(line.strip())
        if ": error: " not in line:  # the error is reported once, by our caller
            sys.stderr.write(line)
            sys.stderr.flush()
    stdout = process.stdout.read()
    if process.wait() != 0:
        reason = tail[-1] if tail else f"exit status {process.returncode}"
        raise ClusterError(f"cannot get the Kubernetes binaries: {reason}")
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise ClusterError(f"{SCRIPT} printed no folder")
    return check_bin_dir(Path(lines[-1]), str(SCRIPT.relative_to(REPO_ROOT)))
