"""Checks the interception library against a real GPU and real frameworks (issue 3, item 10).

Each check runs in fresh processes with LD_PRELOAD set to the library and its own state
directory, so checks cannot disturb each other. Results are one table at the end; every
child's output goes to OUT/<check>.log. Not part of the CPU test suite: it needs a GPU.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

GIB = 1 << 30


def run_child(lib: str, code: str, env: dict[str, str], log: Path, timeout: int = 120):
    environment = {**os.environ, "LD_PRELOAD": lib, **env}
    started = time.perf_counter()
    process = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    with log.open("a") as handle:
        handle.write(f"$ exit {process.returncode}\n{process.stdout}\n{process.stderr}\n")
    return process, time.perf_counter() - started


def limits(limit: str, state_dir: str, core: int | None = None) -> dict[str, str]:
    env = {"GPUSHARE_MEM_LIMIT": limit, "GPUSHARE_STATE_DIR": state_dir}
    if core is not None:
        env["GPUSHARE_CORE_LIMIT"] = str(core)
    return env


TORCH_OOM = """
import torch
free, total = torch.cuda.mem_get_info()
print(f"total={total} free={free}")
blocks = []
try:
    for _ in range(40):
        blocks.append(torch.empty(1 << 30, dtype=torch.uint8, device="cuda"))
    print("allocated=", len(blocks))
except torch.cuda.OutOfMemoryError:
    print(f"oom_after_gib={len(blocks)}")
"""

HOLD_GIB = """
import sys, torch
count = int(sys.argv[1])
blocks = [torch.empty(1 << 30, dtype=torch.uint8, device="cuda") for _ in range(count)]
print("holding", flush=True)
sys.stdin.readline()
"""

CUPY_POOL = """
import cupy
blocks = []
try:
    for _ in range(40):
        blocks.append(cupy.empty(1 << 30, dtype=cupy.uint8))
except cupy.cuda.memory.OutOfMemoryError:
    pass
print(f"cupy_gib={len(blocks)} pool_total={cupy.get_default_memory_pool().total_bytes()}")
"""

JAX_POOL = """
import os
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import jax, jax.numpy as jnp
blocks = []
try:
    for _ in range(40):
        blocks.append(jnp.zeros((1 << 28,), dtype=jnp.float32).block_until_ready())
except Exception as error:  # XLA raises its own RESOURCE_EXHAUSTED error type
    print("jax_error=", type(error).__name__)
print(f"jax_gib={len(blocks)}")
"""

MATMUL_LOOP = """
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
for _ in range(10): a @ b
torch.cuda.synchronize()
count, started = 0, time.perf_counter()
while time.perf_counter() - started < 20:
    a @ b
    count += 1
    if count % 20 == 0: torch.cuda.synchronize()
torch.cuda.synchronize()
print(f"matmuls_per_s={count / (time.perf_counter() - started):.2f}")
"""

LAUNCH_LOOP = """
import time, torch
x = torch.zeros(1, device="cuda")
for _ in range(1000): x.add_(1)
torch.cuda.synchronize()
started = time.perf_counter()
for _ in range(200000): x.add_(1)
torch.cuda.synchronize()
print(f"launch_loop_s={time.perf_counter() - started:.4f}")
"""


def value(text: str, key: str) -> float | None:
    for token in text.replace("\n", " ").split():
        if token.startswith(key + "="):
            return float(token.split("=", 1)[1])
    return None


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lib", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    out = Path(args.out)
    lib = str(Path(args.lib).resolve())
    rows: list[tuple[str, str, bool]] = []

    def check(name: str, detail: str, ok: bool) -> None:
        rows.append((name, detail, ok))
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)

    with tempfile.TemporaryDirectory() as state:
        process, _ = run_child(lib, TORCH_OOM, limits("10GiB", state), out / "torch_oom.log")
        total = value(process.stdout, "total")
        oom = value(process.stdout, "oom_after_gib")
        check("torch mem_get_info is the slice", f"total={total}", total == 10 * GIB)
        check("torch OOM past 10 GiB", f"OOM after {oom} GiB", oom is not None and oom <= 10)

    with tempfile.TemporaryDirectory() as state:
        env = {**os.environ, "LD_PRELOAD": lib, **limits("10GiB", state)}
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLD_GIB, "6"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        ready = holder.stdout.readline().strip() == "holding" if holder.stdout else False
        process, _ = run_child(lib, TORCH_OOM, limits("10GiB", state), out / "two_procs.log")
        if holder.stdin:
            holder.stdin.write("\n")
            holder.stdin.flush()
        holder.wait(timeout=60)
        oom = value(process.stdout, "oom_after_gib")
        check(
            "two processes share one limit",
            f"second got {oom} GiB while first held 6",
            ready and oom is not None and oom <= 4,
        )

    with tempfile.TemporaryDirectory() as state:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            env={**os.environ, "LD_PRELOAD": lib, **limits("10GiB", state)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        (out / "nvidia_smi.log").write_text(smi.stdout + smi.stderr)
        first = smi.stdout.strip().splitlines()[0] if smi.stdout.strip() else ""
        check("nvidia-smi sees the slice", f"memory.total={first} MiB", first == "10240")

    for name, code, key in (("cupy", CUPY_POOL, "cupy_gib"), ("jax", JAX_POOL, "jax_gib")):
        with tempfile.TemporaryDirectory() as state:
            process, _ = run_child(lib, code, limits("10GiB", state), out / f"{name}.log")
            got = value(process.stdout, key)
            bound = 10 if name == "cupy" else 10 * 4  # jax blocks are 1 GiB: 2^28 floats
            check(
                f"{name} pool stays within 10 GiB", f"{key}={got}", got is not None and got <= bound
            )

    base, _ = run_child(lib, MATMUL_LOOP, {}, out / "matmul_unlimited.log", timeout=90)
    unlimited = value(base.stdout, "matmuls_per_s") or 0.0
    for percent in (30, 60):
        with tempfile.TemporaryDirectory() as state:
            process, _ = run_child(
                lib,
                MATMUL_LOOP,
                limits("80GiB", state, percent),
                out / f"matmul_{percent}.log",
                timeout=90,
            )
            rate = value(process.stdout, "matmuls_per_s") or 0.0
            share = 100 * rate / unlimited if unlimited else 0.0
            check(
                f"{percent}% compute limit alone",
                f"{share:.1f}% of unthrottled",
                abs(share - percent) <= 5,
            )

    plain = subprocess.run(
        [sys.executable, "-c", LAUNCH_LOOP], capture_output=True, text=True, timeout=120
    )
    hooked, _ = run_child(lib, LAUNCH_LOOP, {}, out / "launch_overhead.log")
    t0 = value(plain.stdout, "launch_loop_s")
    t1 = value(hooked.stdout, "launch_loop_s")
    overhead = 100 * (t1 - t0) / t0 if t0 and t1 else None
    check(
        "no-limit overhead on a launch-heavy loop",
        f"{overhead}%",
        overhead is not None and overhead < 1,
    )

    print("\n| check | result | pass |\n| --- | --- | --- |")
    for name, detail, ok in rows:
        print(f"| {name} | {detail} | {'yes' if ok else 'NO'} |")
    return 0 if all(ok for _, _, ok in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
