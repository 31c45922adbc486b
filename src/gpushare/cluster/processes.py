"""Starting, watching and stopping the control plane's processes.

Each process runs in its own session (so that it outlives `gpushare cluster up` and a
Ctrl-C in that terminal does not reach it) with its output in a log file and its pid in a
pid file. A pid alone can be reused by another program after a crash, so a process counts
as ours only while its command line names the state dir.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import Path

from gpushare.cluster.state import ClusterError

PR_SET_PDEATHSIG = 1


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def check_port_free(port: int, option: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise ClusterError(f"{option} {port}: port already in use on 127.0.0.1") from None
            raise ClusterError(f"{option} {port}: cannot bind: {error.strerror}") from None


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGKILL it when the process that started it exits."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def spawn(
    argv: Sequence[str],
    log: Path,
    pid_file: Path,
    *,
    env: dict[str, str] | None = None,
    tie_to_parent: bool = False,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new session, output to ``log``, pid to ``pid_file``.

    With ``tie_to_parent`` the kernel kills the process when the caller exits, however it
    exits (tests use this so that a killed test run leaves nothing behind).
    """
    with log.open("ab") as out:
        try:
            process = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
                preexec_fn=_die_with_parent if tie_to_parent else None,
            )
        except OSError as error:
            raise ClusterError(
                f"cannot run {argv[0]}: {error.strerror} (corrupt cache? rebuild with "
                "scripts/k8s-binaries --rebuild)"
            ) from None
    pid_file.write_text(f"{process.pid}\n")
    return process


def cmdline(pid: int) -> str | None:
    """The NUL-separated command line of a running (not exiting) process, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            stat = file.read()
        # The state follows the command name, which is in parentheses and may hold spaces.
        if stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] in (b"Z", b"X"):
            return None
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            line = file.read().decode(errors="replace")
        # Empty for a kernel thread, and for a process that is exiting (its memory is gone).
        return line or None
    except (OSError, ValueError):
        return None


def is_ours(pid: int, marker: str) -> bool:
    """Whether ``pid`` runs with the folder ``marker`` (the state dir) on its command line.

    An argument counts if it is the folder or a path in it, alone or after ``--flag=``; a
    sibling folder whose name merely starts with the same text does not.
    """
    line = cmdline(pid)
    if line is None:
        return False
    for arg in line.split("\0"):
        value = arg.split("=", 1)[-1]
        if value.rstrip("/") == marker or value.startswith(marker + "/"):
            return True
    return False


def processes_with(marker: str) -> list[int]:
    """Every running process whose command line contains ``marker``, except this one."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            pid = int(entry.name)
            if is_ours(pid, marker):
                found.append(pid)
    return found


def _reap(pid: int) -> None:
    """Collect an exited child of this process, so that it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def stop(pids: Iterable[int], marker: str, timeout: float = 10.0) -> list[int]:
    """SIGTERM each of our ``pids``, SIGKILL those still running after ``timeout`` seconds.

    Returns the pids that had to be killed.
    """
    running = [pid for pid in pids if is_ours(pid, marker)]
    for pid in running:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while running and time.monotonic() < deadline:
        for pid in running:
            _reap(pid)
        running = [pid for pid in running if is_ours(pid, marker)]
        if running:
            time.sleep(0.05)
    for pid in running:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0  # SIGKILL cannot be ignored, but a loaded machine is slow
    gone = False
    while running and not gone and time.monotonic() < deadline:
        for pid in running:
            _reap(pid)
        gone = not any(is_ours(pid, marker) for pid in running)
        if not gone:
            time.sleep(0.02)
    return running


def stop_in_order(pids: Iterable[int], marker: str, timeout: float = 10.0) -> list[int]:
    """``stop`` one process after the other: the apiserver hangs on exit if etcd goes first."""
    killed = []
    for pid in pids:
        killed += stop([pid], marker, timeout)
    return killed


def tls_context(ca: Path, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca))
    if cert is not None and key is not None:
        context.load_cert_chain(str(cert), str(key))
    return context


def probe(url: str, context: ssl.SSLContext, timeout: float = 2.0) -> tuple[int, str]:
    """GET ``url``: the status and body, or (0, why) if nothing answered."""
    try:
        with urllib.request.urlopen(url, context=context, timeout=timeout) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as error:
        return 0, str(getattr(error, "reason", error))


def log_tail(log: Path, lines: int = 1) -> str:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    kept = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(kept[-lines:])


def wait_ready(
    name: str,
    url: str,
    context: ssl.SSLContext,
    process: subprocess.Popen[bytes],
    log: Path,
    timeout: float,
) -> None:
    """Poll ``url`` until it answers 200; ClusterError if the process exits or time runs out."""
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ClusterError(
                f"{name} exited with status {process.returncode} while starting: "
                f"{log_tail(log)} (log: {log})"
            )
        status, body = probe(url, context, timeout=1.0)
        if status == 200:
            return
        last = f"HTTP {status}: {body.strip().splitlines()[-1] if body.strip() else ''}"
        time.sleep(0.1)
    raise ClusterError(f"{name} not ready after {timeout:.0f} s ({last}); log: {log}")
