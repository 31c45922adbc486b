"""Cost of the gpushare interception library (issue 3), measured against the mock CUDA driver.

Run: .venv/bin/python bench/bench_interception.py [--runs N] [--batches N] [--calls N]
Needs native/build (make -C native; and make -C native testing, see below) and a C compiler.

Builds bench/bench_interception.c into a temporary directory, then measures:

* Per-call cost (median over batches of --calls calls, after a warm-up batch) of cuLaunchKernel
  (0 µs kernels, no compute limit), cuMemAlloc_v2 + cuMemFree_v2 pairs of 1 MiB and
  cuMemGetInfo_v2 (both with a memory limit), each resolved through cuGetProcAddress_v2 at
  12080 as the CUDA runtime does: (a) against the mock driver directly, (b) with the library in
  LD_PRELOAD. Direct and preloaded processes alternate --runs times; each figure is the median
  of the per-run medians, and "added" is (b) - (a).
* Start-up: time from fork/exec to the first successful cuMemAlloc_v2, for 1 process and for 8
  started at once (the time until the last of the 8 has allocated), all sharing one state
  directory and limit; median over --rounds rounds.

Targets (issue 3): under 50 ns added per launch without a compute limit, under 1 µs added per
allocation, 8 processes at once no slower than 8 x one.

The production library (native/build/libgpushare.so) reads only /etc/gpushare/limits.conf when
that file exists, so on a machine that has one, the limit is set through the testing build
(native/build/testing/libgpushare.so, the same code except that GPUSHARE_TEST_LIMITS_PATH names
the limits file).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = Path(__file__).with_suffix(".c")
NATIVE = ROOT / "native"
BUILD = NATIVE / "build"
MOCK_DIR = BUILD / "mock"
MOCK_CUDA = MOCK_DIR / "libcuda.so.1"
PRODUCTION_LIB = BUILD / "libgpushare.so"
TESTING_LIB = BUILD / "testing" / "libgpushare.so"
SYSTEM_LIMITS = Path("/etc/gpushare/limits.conf")

MOCK_MEMORY_MIB = 80 * 1024
LIMIT_BYTES = 8 * 1024**3
CASES = [
    ("launch", "cuLaunchKernel", "per launch, no compute limit"),
    ("alloc_free", "cuMemAlloc_v2 + cuMemFree_v2", "per pair, 1 MiB, limit 8 GiB"),
    ("mem_get_info", "cuMemGetInfo_v2", "per call, limit 8 GiB"),
]


def fail(message: str) -> None:
    sys.exit(f"bench_interception: {message}")


def choose_library(requested: str | None) -> Path:
    if not MOCK_CUDA.exists() or not PRODUCTION_LIB.exists():
        fail(f"{BUILD.relative_to(ROOT)} is missing or incomplete: run make -C native first")
    if requested:
        library = Path(requested).resolve()
    elif SYSTEM_LIMITS.exists():
        library = TESTING_LIB
        print(
            f"note: {SYSTEM_LIMITS} exists, so the production library would ignore the "
            f"benchmark's limit; using the testing build {library.relative_to(ROOT)}"
        )
    else:
        library = PRODUCTION_LIB
    if not library.exists():
        hint = "make -C native testing" if library == TESTING_LIB else "make -C native"
        fail(f"{library} is missing: run {hint} first")
    return library


def compile_bench(work: Path) -> Path:
    compiler = os.environ.get("CC", "cc")
    if shutil.which(compiler) is None:
        fail(f"no C compiler ({compiler}); set CC")
    binary = work / "bench_interception"
    command = [
        compiler,
        "-std=c11",
        "-O2",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-I",
        str(NATIVE / "include"),
        "-o",
        str(binary),
        str(SOURCE),
        "-L",
        str(MOCK_DIR),
        "-l:libcuda.so.1",
        "-ldl",
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        fail(f"compiling {SOURCE.name} failed:\n{result.stderr}")
    return binary


class Setup:
    """The mock's config and state, and the environment of direct and preloaded processes."""

    def __init__(self, work: Path, library: Path) -> None:
        self.work = work
        self.library = library
        self.config = work / "mock.json"
        device = {
            "name": "NVIDIA H200",
            "uuid": "GPU-12345678-1234-1234-1234-123456789abc",
            "memory_mib": MOCK_MEMORY_MIB,
            "sm_count": 132,
        }
        self.config.write_text(json.dumps({"driver_version": 12080, "devices": [device]}))
        self.state_dirs = 0

    def new_state_dir(self) -> Path:
        self.state_dirs += 1
        path = self.work / f"state{self.state_dirs}"
        path.mkdir()
        return path

    def env(self, preload: bool, state_dir: Path | None = None) -> dict[str, str]:
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("GPUSHARE_", "CUDA_")) and key != "LD_PRELOAD"
        }
        env["LD_LIBRARY_PATH"] = str(MOCK_DIR)
        env["GPUSHARE_MOCK_CONFIG"] = str(self.config)
        env["GPUSHARE_MOCK_STATE"] = str(self.work / "mock.state")
        if preload:
            assert state_dir is not None
            limits = state_dir.parent / f"{state_dir.name}.limits.conf"
            limits.write_text(f"memory_limit_bytes={LIMIT_BYTES}\nstate_dir={state_dir}\n")
            env["LD_PRELOAD"] = str(self.library)
            env["GPUSHARE_TEST_LIMITS_PATH"] = str(limits)  # read by the testing build only
            env["GPUSHARE_MEM_LIMIT"] = str(LIMIT_BYTES)  # read when no limits file exists
            env["GPUSHARE_STATE_DIR"] = str(state_dir)
        return env


def run(binary: Path, args: list[str], env: dict[str, str]) -> list[str]:
    result = subprocess.run(
        [str(binary), *args], env=env, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        fail(f"{binary.name} {' '.join(args)} failed:\n{result.stderr}")
    return result.stdout.splitlines()


def fields(line: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in line.split())


def per_call_run(
    binary: Path, setup: Setup, preload: bool, batches: int, calls: int
) -> dict[str, float]:
    env = setup.env(preload, setup.new_state_dir() if preload else None)
    medians: dict[str, float] = {}
    for line in run(binary, ["calls", str(batches), str(calls)], env):
        row = fields(line)
        if "resolved" in row:
            expected = setup.library if preload else MOCK_CUDA
            if Path(row["object"]).resolve() != expected.resolve():
                fail(f"{row['resolved']} resolved to {row['object']}, expected {expected}")
        elif "mem_total" in row:
            expected_total = LIMIT_BYTES if preload else MOCK_MEMORY_MIB * 1024**2
            if int(row["mem_total"]) != expected_total:
                fail(
                    f"cuMemGetInfo_v2 total {row['mem_total']}, expected {expected_total}: "
                    "the limit is not in effect"
                )
        elif "case" in row:
            medians[row["case"]] = float(row["median_ns"])
    return medians


def per_call(binary: Path, setup: Setup, runs: int, batches: int, calls: int) -> None:
    direct: dict[str, list[float]] = {name: [] for name, _, _ in CASES}
    preloaded: dict[str, list[float]] = {name: [] for name, _, _ in CASES}
    for _ in range(runs):
        for preload, into in ((False, direct), (True, preloaded)):
            for name, value in per_call_run(binary, setup, preload, batches, calls).items():
                into[name].append(value)
    print(
        f"\nPer-call cost, ns: median of {runs} runs, each the median of {batches} batches "
        f"of {calls:,} calls (range over runs in brackets)"
    )
    header = f"{'call':<30} {'mock direct':>20} {'with library':>20} {'added':>8}  what"
    print(header)
    print("-" * len(header))
    for name, label, what in CASES:
        a, b = direct[name], preloaded[name]
        a_med, b_med = statistics.median(a), statistics.median(b)
        a_text = f"{a_med:.0f} [{min(a):.0f}-{max(a):.0f}]"
        b_text = f"{b_med:.0f} [{min(b):.0f}-{max(b):.0f}]"
        print(f"{label:<30} {a_text:>20} {b_text:>20} {b_med - a_med:>+8.0f}  {what}")


def startup_once(binary: Path, env: dict[str, str], processes: int) -> float:
    for line in run(binary, ["startup", str(processes)], env):
        row = fields(line)
        if "startup_ns" in row:
            return int(row["startup_ns"]) / 1e6
    fail("no startup_ns line")
    raise AssertionError  # unreachable


def startup(binary: Path, setup: Setup, rounds: int, processes: int) -> None:
    shared = setup.new_state_dir()
    variants = [
        ("mock direct (no library)", lambda: setup.env(False)),
        ("library, existing state file", lambda: setup.env(True, shared)),
        ("library, new state file", lambda: setup.env(True, setup.new_state_dir())),
    ]
    startup_once(binary, setup.env(True, shared), 1)  # creates the shared state file
    print(
        f"\nStart-up, ms from before the first fork to the last process's first successful "
        f"cuMemAlloc_v2 (median of {rounds} rounds)"
    )
    header = (
        f"{'variant':<30} {'1 process':>10} {f'{processes} at once':>10} "
        f"{f'{processes} x one':>10} {'ratio':>6}"
    )
    print(header)
    print("-" * len(header))
    for label, make_env in variants:
        one: list[float] = []
        many: list[float] = []
        for _ in range(rounds):  # alternate, so drift affects both alike
            one.append(startup_once(binary, make_env(), 1))
            many.append(startup_once(binary, make_env(), processes))
        one_med, many_med = statistics.median(one), statistics.median(many)
        print(
            f"{label:<30} {one_med:>10.2f} {many_med:>10.2f} {processes * one_med:>10.2f} "
            f"{many_med / (processes * one_med):>6.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5, help="direct/preloaded process pairs")
    parser.add_argument("--batches", type=int, default=21, help="timed batches per run")
    parser.add_argument("--calls", type=int, default=100_000, help="calls per batch")
    parser.add_argument("--rounds", type=int, default=21, help="start-up rounds per variant")
    parser.add_argument("--processes", type=int, default=8, help="processes started at once")
    parser.add_argument("--library", help="interception library to preload (default: see above)")
    args = parser.parse_args()

    library = choose_library(args.library)
    with tempfile.TemporaryDirectory(prefix="gpushare-bench-") as tmp:
        work = Path(tmp)
        binary = compile_bench(work)
        setup = Setup(work, library)
        print(f"library {library}, {os.cpu_count()} CPU(s), mock driver {MOCK_CUDA}")
        per_call(binary, setup, args.runs, args.batches, args.calls)
        startup(binary, setup, args.rounds, args.processes)


if __name__ == "__main__":
    main()
