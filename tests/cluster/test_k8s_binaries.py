"""scripts/k8s-binaries: the cached etcd, kube-apiserver and kube-scheduler builds (issue 4).

The module fixture runs the script, which builds the binaries if the cache is empty. That cold
build takes about 4 to 5 minutes on 2 cores (docs/performance.md); afterwards every test here takes
seconds. A failed build fails the tests with the script's own error; nothing is skipped.

The error-path tests point GPUSHARE_K8S_CACHE at a temporary cache, so the real cache is only
ever read (binaries in the temporary cache are hard links or fresh files, never edited).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "k8s-binaries"
VERSIONS_FILE = ROOT / "scripts" / "k8s-versions.env"
BINARIES = ("etcd", "kube-apiserver", "kube-scheduler")
COLD_BUILD_TIMEOUT_S = 3 * 3600
WARM_LIMIT_S = 10
PREFIX = "k8s-binaries:"


def pinned() -> dict[str, str]:
    values = {}
    for line in VERSIONS_FILE.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key] = value
    return values


def want_version_line(name: str) -> str:
    versions = pinned()
    if name == "etcd":
        return "etcd Version: " + versions["ETCD_VERSION"].removeprefix("v")
    return "Kubernetes " + versions["KUBERNETES_VERSION"]


def run(
    *args: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def bin_dir() -> Path:
    """The real cache's bin dir; builds it (cold: about 4 to 5 min on 2 cores) if it is missing."""
    result = run(timeout=COLD_BUILD_TIMEOUT_S)
    if result.returncode != 0:
        pytest.fail(
            f"scripts/k8s-binaries failed (exit {result.returncode}):\n{result.stderr[-4000:]}"
        )
    return Path(result.stdout.strip())


def tmp_env(cache: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["GPUSHARE_K8S_CACHE"] = str(cache)
    env.update(extra)
    return env


def copy_cache(bin_dir: Path, cache: Path) -> Path:
    """A copy of the cache entry under `cache` (hard links where possible); its bin dir."""
    dest = cache / bin_dir.parent.name / "bin"
    dest.mkdir(parents=True)
    for name in BINARIES:
        try:
            os.link(bin_dir / name, dest / name)
        except OSError:
            shutil.copy2(bin_dir / name, dest / name)
    return dest


def replace_file(path: Path, data: bytes, mode: int = 0o755) -> None:
    """Write a new file in place of `path` (a hard link to the real cache must not be edited)."""
    path.unlink()
    path.write_bytes(data)
    path.chmod(mode)


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got:\n{stderr}"
    return lines[0]


def without_go() -> str:
    """PATH without any directory that holds a `go` executable."""
    dirs = os.environ.get("PATH", "").split(os.pathsep)
    return os.pathsep.join(d for d in dirs if d and not os.access(Path(d) / "go", os.X_OK))


def fake_go(tmp_path: Path, body: str) -> str:
    """PATH with a `go` wrapper first: `body` (sh) runs before handing over to the real go."""
    real = shutil.which("go")
    if real is None:
        pytest.fail("Go is not installed (no 'go' on PATH); scripts/k8s-binaries needs it")
    wrapper_dir = tmp_path / "fakego"
    wrapper_dir.mkdir()
    wrapper = wrapper_dir / "go"
    wrapper.write_text(f'#!/bin/sh\n{body}\nexec "{real}" "$@"\n', encoding="utf-8")
    wrapper.chmod(0o755)
    return os.pathsep.join([str(wrapper_dir), os.environ.get("PATH", "")])


# --- the real cache ------------------------------------------------------------------------


def test_warm_run_returns_the_cached_bin_dir_in_seconds(bin_dir: Path) -> None:
    start = time.monotonic()
    result = run(timeout=60)
    elapsed = time.monotonic() - start
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{bin_dir}\n", "stdout must be the bin dir and nothing else"
    assert result.stderr == ""
    assert elapsed < WARM_LIMIT_S, f"warm run took {elapsed:.1f} s"


def test_cache_is_outside_the_source_tree(bin_dir: Path) -> None:
    assert not bin_dir.resolve().is_relative_to(ROOT)
    assert bin_dir.name == "bin"
    versions = pinned()
    assert versions["KUBERNETES_VERSION"] in bin_dir.parent.name
    assert versions["ETCD_VERSION"] in bin_dir.parent.name


@pytest.mark.parametrize("name", BINARIES)
def test_each_binary_reports_the_pinned_version(bin_dir: Path, name: str) -> None:
    result = subprocess.run(
        [str(bin_dir / name), "--version"], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stderr
    assert want_version_line(name) in result.stdout.splitlines()


def test_check_mode_accepts_the_real_cache(bin_dir: Path) -> None:
    result = run("--check", timeout=60)
    assert (result.returncode, result.stdout, result.stderr) == (0, f"{bin_dir}\n", "")


def test_pinned_kubernetes_is_134_or_newer() -> None:
    major, minor, _ = pinned()["KUBERNETES_VERSION"].removeprefix("v").split(".")
    assert (int(major), int(minor)) >= (1, 34)


# --- a corrupt or missing cache (temporary copies) -----------------------------------------


def corrupt(bin_dir: Path, kind: str) -> tuple[str, str]:
    """Damage kube-apiserver in `bin_dir` one way; the words the report must contain."""
    target = bin_dir / "kube-apiserver"
    if kind == "truncated":
        replace_file(target, target.read_bytes()[:4096])
        return "kube-apiserver", "--version failed"
    if kind == "missing":
        target.unlink()
        return "kube-apiserver", "missing"
    if kind == "not-executable":
        replace_file(target, target.read_bytes()[:64], mode=0o644)
        return "kube-apiserver", "not an executable"
    if kind == "wrong-version":
        replace_file(target, b'#!/bin/sh\necho "Kubernetes v1.33.0"\n')
        return "kube-apiserver", "want 'Kubernetes " + pinned()["KUBERNETES_VERSION"]
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["truncated", "missing", "not-executable", "wrong-version"])
def test_check_reports_a_corrupt_cache_in_one_line(
    bin_dir: Path, tmp_path: Path, kind: str
) -> None:
    cache = tmp_path / "cache"
    copy = copy_cache(bin_dir, cache)
    words = corrupt(copy, kind)
    result = run("--check", env=tmp_env(cache), timeout=60)
    assert result.returncode == 4
    assert result.stdout == ""
    line = one_line(result.stderr)
    assert line.startswith(f"{PREFIX} cache at {copy.parent} is corrupt:"), line
    for word in words:
        assert word in line, line
    # The real cache is untouched.
    assert run("--check", timeout=60).returncode == 0


def test_check_reports_a_missing_cache(tmp_path: Path) -> None:
    result = run("--check", env=tmp_env(tmp_path / "empty"), timeout=60)
    assert result.returncode == 3
    assert "no cache at" in one_line(result.stderr)


def test_build_mode_rebuilds_a_corrupt_cache(bin_dir: Path, tmp_path: Path) -> None:
    # Without Go the rebuild stops right after the detection, which is what is checked here.
    cache = tmp_path / "cache"
    copy = copy_cache(bin_dir, cache)
    corrupt(copy, "truncated")
    result = run(env=tmp_env(cache, PATH=without_go()), timeout=60)
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert lines[0].startswith(f"{PREFIX} cache at {copy.parent} is corrupt: kube-apiserver")
    assert lines[0].endswith("; rebuilding")
    assert lines[1].startswith(f"{PREFIX} error: Go is not installed (no 'go' on PATH)")
    assert len(lines) == 2, result.stderr
    # The damaged entry is left for the next (real) rebuild to replace, not half-removed.
    assert (copy / "etcd").exists()


# --- the errors a user meets on a cold build -----------------------------------------------


def test_go_too_old_is_one_clear_error(bin_dir: Path, tmp_path: Path) -> None:
    # `bin_dir` first: the real build has put the modules into the module cache.
    path = fake_go(tmp_path, 'if [ "$*" = "env GOVERSION" ]; then echo go1.22.0; exit 0; fi')
    result = run(env=tmp_env(tmp_path / "cache", PATH=path), timeout=120)
    assert result.returncode == 1
    error = result.stderr.splitlines()[-1]
    k8s = pinned()["KUBERNETES_VERSION"]
    assert error.startswith(f"{PREFIX} error: Go 1.22.0 is too old: k8s.io/kubernetes@{k8s}")
    assert "needs Go >= 1.2" in error


def test_unreachable_proxy_is_one_clear_error(tmp_path: Path) -> None:
    # An empty module cache and no proxy: what a machine without network meets.
    env = tmp_env(tmp_path / "cache", GOPROXY="off", GOMODCACHE=str(tmp_path / "modcache"))
    result = run(env=env, timeout=120)
    assert result.returncode == 1
    error = result.stderr.splitlines()[-1]
    k8s = pinned()["KUBERNETES_VERSION"]
    assert error.startswith(
        f"{PREFIX} error: could not download k8s.io/kubernetes@{k8s} (GOPROXY=off):"
    )
    assert "build.log" in error
    subprocess.run(["chmod", "-R", "u+w", str(tmp_path / "modcache")], check=False)


def test_build_failure_points_to_the_log_and_leaves_no_cache(bin_dir: Path, tmp_path: Path) -> None:
    path = fake_go(tmp_path, 'if [ "$1" = build ]; then echo "fake compile error" >&2; exit 2; fi')
    cache = tmp_path / "cache"
    result = run(env=tmp_env(cache, PATH=path), timeout=600)
    assert result.returncode == 1
    error = result.stderr.splitlines()[-1]
    log = cache / f"{bin_dir.parent.name}.build.log"
    assert error.startswith(f"{PREFIX} error: building kube-apiserver/kube-scheduler")
    assert error.endswith(f"failed; log: {log}")
    assert "fake compile error" in log.read_text(encoding="utf-8")
    assert not (cache / bin_dir.parent.name).exists()
    assert not list(cache.glob(".build-*")), "the temporary build dir must be removed"


def test_a_killed_build_leaves_no_half_cache(bin_dir: Path, tmp_path: Path) -> None:
    path = fake_go(tmp_path, 'if [ "$1" = build ]; then sleep 120; fi')
    cache = tmp_path / "cache"
    log = cache / f"{bin_dir.parent.name}.build.log"
    proc = subprocess.Popen(
        [str(SCRIPT)],
        env=tmp_env(cache, PATH=path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if log.exists() and "== build kubernetes" in log.read_text(encoding="utf-8"):
                break
            assert proc.poll() is None, "the build ended before it could be killed"
            time.sleep(0.5)
        else:
            pytest.fail("the build never reached the compile step")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    assert not (cache / bin_dir.parent.name).exists()
    check = run("--check", env=tmp_env(cache), timeout=60)
    assert check.returncode == 3, check.stderr
