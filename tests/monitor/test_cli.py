"""`gpushare monitor`'s bad inputs: one line naming the input, a status, never a traceback."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from monitor_helpers import ROOT, mock_env, write_config


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ROOT / ".venv" / "bin" / "gpushare"), "monitor", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--listen", "9445"], "--listen 9445: expected HOST:PORT"),
        (["--listen", "h:99999"], "--listen h:99999: expected HOST:PORT"),
        (["--grace", "0"], "--grace 0.0: must be positive"),
        (["--interval", "-1"], "--interval -1.0: must be positive"),
        (["--tolerance-mib", "-5"], "--tolerance-mib -5: must not be negative"),
        (["--log-level", "loud"], "--log-level loud: expected DEBUG, INFO, WARNING or ERROR"),
        (["--proc-root", "/nonexistent"], "--proc-root /nonexistent: not a directory"),
        (["--pods-file", "/nonexistent.json"], "--pods-file /nonexistent.json: No such file"),
    ],
)
def test_bad_options(args: list[str], message: str) -> None:
    result = run(*args)
    assert result.returncode == 2
    assert result.stderr.startswith(f"gpushare monitor: error: {message}"), result.stderr
    assert result.stderr.count("\n") == 1


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not yaml: [", "not JSON or YAML"),
        ('{"kind": "Service"}', "expected Pod or Node objects, got kind 'Service'"),
        ("[1, 2]", "expected Kubernetes objects, got list"),
    ],
)
def test_bad_pods_file(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "pods.yaml"
    path.write_text(content)
    result = run("--pods-file", str(path))
    assert result.returncode == 2
    assert result.stderr.startswith(f"gpushare monitor: error: {path}: {message}")
    assert result.stderr.count("\n") == 1


def test_no_usable_nvml_is_one_line(native_build: Path, tmp_path: Path) -> None:
    pods = tmp_path / "pods.json"
    pods.write_text('{"kind": "List", "items": []}')
    env = mock_env(write_config(tmp_path / "mock.json"))
    env["GPUSHARE_MOCK_CONFIG"] = str(tmp_path / "missing.json")  # the mock refuses to init
    result = run("--pods-file", str(pods), "--listen", "127.0.0.1:0", env=env)
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.startswith("gpushare monitor")]
    assert lines == [lines[0]] and lines[0].startswith(
        "gpushare monitor: error: NVML: cannot initialise: "
    ), result.stderr
    assert "Traceback" not in result.stderr
