"""256 MiB f32 upload + download: the Python client vs the C++ client library.

Usage (from the repository root, after `cmake --build build`):

    PYTHONPATH=client/python:build/client/python/gen \\
        /usr/bin/python3 client/python/benchmarks/transfer_bench.py [--reps 5]

Starts its own tessera-server (CPU backend) on a free loopback port. The C++ baseline is
`tessera_transfer_bench` (tests/bench/transfer_bench.cc): tessera::Client::Upload and Download
timed in process, with the same 4 MiB chunks, against the same server. The `tessera` CLI is
timed too (process start, .npy on /dev/shm, progress bar), for context only.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import conftest  # noqa: E402  (the test suite's server fixture, reused)
import tessera  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")
CLI = os.environ.get("TESSERA_CLI") or os.path.join(ROOT, "build", "client", "tessera")
CPP_BENCH = os.environ.get("TESSERA_TRANSFER_BENCH") or os.path.join(
    ROOT, "build", "tests", "bench", "tessera_transfer_bench")
MIB = 1 << 20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--mib", type=int, default=256)
    args = parser.parse_args()
    nbytes = args.mib * MIB
    a = np.random.default_rng(0).standard_normal(nbytes // 4).astype(np.float32)
    server = conftest.Server()
    try:
        with tessera.Admin(server.addr, token=server.admin_token) as admin:
            _, key = admin.register("bench", memory_bytes=4 * nbytes)
        py_up, py_down = [], []
        with tessera.Client(server.addr, token=key) as client:
            for _ in range(args.reps):
                t0 = time.perf_counter()
                t = client.put(a)
                t1 = time.perf_counter()
                b = t.numpy()
                t2 = time.perf_counter()
                assert np.array_equal(a, b)
                t.delete()
                py_up.append(t1 - t0)
                py_down.append(t2 - t1)
        env = dict(os.environ, TESSERA_ADDR=server.addr, TESSERA_TOKEN=key)
        out = subprocess.run([CPP_BENCH, str(args.mib), str(args.reps), "4096"], env=env,
                             check=True, capture_output=True, text=True).stdout
        cpp = [tuple(float(x) for x in line.split()) for line in out.splitlines()]
        cpp_up, cpp_down = [u for u, _ in cpp], [d for _, d in cpp]
        cli_up, cli_down = [], []
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        with tempfile.TemporaryDirectory(dir=shm) as tmp:
            src, dst = os.path.join(tmp, "a.npy"), os.path.join(tmp, "b.npy")
            np.save(src, a)
            for _ in range(args.reps):
                t0 = time.perf_counter()
                out = subprocess.run([CLI, "tensor", "put", src], env=env, check=True,
                                     capture_output=True, text=True).stdout
                t1 = time.perf_counter()
                handle = next(w for w in out.split() if w.startswith("tn_"))
                subprocess.run([CLI, "tensor", "get", handle, "-o", dst], env=env,
                               check=True, capture_output=True)
                t2 = time.perf_counter()
                assert np.array_equal(a, np.load(dst))
                subprocess.run([CLI, "tensor", "rm", handle], env=env, check=True,
                               capture_output=True)
                cli_up.append(t1 - t0)
                cli_down.append(t2 - t1)
    finally:
        server.stop()

    def gbs(times: list) -> float:
        return nbytes / statistics.median(times) / 1e9

    print(f"| Client | Upload (median of {args.reps}) | Download | Round trip |")
    print("|---|---|---|---|")
    for name, up, down in (("Python (tessera package)", py_up, py_down),
                           ("C++ (tessera::Client, in process)", cpp_up, cpp_down),
                           ("CLI (`tessera tensor put/get`)", cli_up, cli_down)):
        rt = [u + d for u, d in zip(up, down)]
        print(f"| {name} | {statistics.median(up) * 1e3:.0f} ms ({gbs(up):.2f} GB/s) | "
              f"{statistics.median(down) * 1e3:.0f} ms ({gbs(down):.2f} GB/s) | "
              f"{statistics.median(rt) * 1e3:.0f} ms ({gbs(rt) * 2:.2f} GB/s) |")
    def ratio(cpp: list, py: list) -> float:
        return statistics.median(cpp) / statistics.median(py)

    print(f"\nPython / C++ throughput: upload {ratio(cpp_up, py_up):.2f}x, "
          f"download {ratio(cpp_down, py_down):.2f}x, round trip "
          f"{ratio([u + d for u, d in zip(cpp_up, cpp_down)], [u + d for u, d in zip(py_up, py_down)]):.2f}x")


if __name__ == "__main__":
    main()
