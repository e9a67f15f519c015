"""256 MiB f32 upload + download: the Python client vs the C++ client library, and (with
--regions) through a shared-memory region over the Unix socket vs a numpy copy.

Usage (from the repository root, after `cmake --build build`):

    PYTHONPATH=client/python:build/client/python/gen \\
        /usr/bin/python3 client/python/benchmarks/transfer_bench.py [--reps 5] [--rounds 3]
    PYTHONPATH=... /usr/bin/python3 client/python/benchmarks/transfer_bench.py --regions

Starts its own tessera-server (CPU backend) on a free loopback port and a Unix socket. The
C++ baseline is `tessera_transfer_bench` (tests/bench/transfer_bench.cc):
tessera::Client::Upload and Download timed in process, with the library's default chunks (as
each client's user gets them), against the same server. Each round times `--reps` Python
transfers, then `--reps` C++ ones; the ratios are per round (same-run), so that a machine
whose load drifts compares like with like. The package moves the bytes through
tessera._native (the C++ client library) where it is built, through grpcio with `--grpcio`
(or where it is not). The `tessera` CLI is timed too (process start,
.npy on /dev/shm, progress bar), for context only (`--no-cli` skips it).
`--cpp-preload=libtcmalloc_minimal.so.4` runs the C++ bench with tcmalloc: with glibc's
malloc, gRPC's receive buffers for 4 MiB messages are returned to the system when freed and
faulted in again, which dominates such a download where page faults are expensive (a VM).

--regions times instead, over the Unix socket: put and get through the client's region
(get with copy=True and copy=False), the same over the gRPC streams on the Unix socket
(regions=False) and over TCP, against a numpy copy of the same array (`a.copy()`, which
allocates its result as get(copy=True) does, and `np.copyto` into an existing array, as put
copies into the region). The region's first use (registration and first touch of its pages)
is reported on its own line.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, Tuple

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import conftest  # noqa: E402  (the test suite's server fixture, reused)
import tessera  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")
CLI = os.environ.get("TESSERA_CLI") or os.path.join(ROOT, "build", "client", "tessera")
CPP_BENCH = os.environ.get("TESSERA_TRANSFER_BENCH") or os.path.join(
    ROOT, "build", "tests", "bench", "tessera_transfer_bench")
MIB = 1 << 20


def median_ms(times: List[float]) -> float:
    return statistics.median(times) * 1e3


def python_reps(client: tessera.Client, a: np.ndarray,
                reps: int) -> Tuple[List[float], List[float]]:
    up, down = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        t = client.put(a)
        t1 = time.perf_counter()
        b = t.numpy()
        t2 = time.perf_counter()
        assert np.array_equal(a, b)
        del b
        t.delete()
        up.append(t1 - t0)
        down.append(t2 - t1)
    return up, down


def cpp_reps(env: Dict[str, str], mib: int, reps: int,
             preload: str = "") -> Tuple[List[float], List[float]]:
    if preload:
        env = dict(env, LD_PRELOAD=preload)
    out = subprocess.run([CPP_BENCH, str(mib), str(reps), "0"], env=env, check=True,
                         capture_output=True, text=True).stdout
    pairs = [tuple(float(x) for x in line.split()) for line in out.splitlines()]
    return [u for u, _ in pairs], [d for _, d in pairs]


def cli_reps(env: Dict[str, str], a: np.ndarray, reps: int) -> Tuple[List[float], List[float]]:
    up, down = [], []
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=shm) as tmp:
        src, dst = os.path.join(tmp, "a.npy"), os.path.join(tmp, "b.npy")
        np.save(src, a)
        for _ in range(reps):
            t0 = time.perf_counter()
            out = subprocess.run([CLI, "tensor", "put", src], env=env, check=True,
                                 capture_output=True, text=True).stdout
            t1 = time.perf_counter()
            handle = next(w for w in out.split() if w.startswith("tn_"))
            subprocess.run([CLI, "tensor", "get", handle, "-o", dst], env=env, check=True,
                           capture_output=True)
            t2 = time.perf_counter()
            assert np.array_equal(a, np.load(dst))
            subprocess.run([CLI, "tensor", "rm", handle], env=env, check=True,
                           capture_output=True)
            up.append(t1 - t0)
            down.append(t2 - t1)
    return up, down


def tcp_bench(args: argparse.Namespace, server: conftest.Server, key: str,
              a: np.ndarray) -> None:
    nbytes = a.nbytes
    env = dict(os.environ, TESSERA_ADDR=server.addr, TESSERA_TOKEN=key)
    py_up: List[float] = []
    py_down: List[float] = []
    cpp_up: List[float] = []
    cpp_down: List[float] = []
    rounds = []
    with tessera.Client(server.addr, token=key, native=False if args.grpcio else None) as client:
        print("Python transfers through "
              + ("tessera._native (the C++ client library)" if client.uses_native else "grpcio"))
        for _ in range(args.rounds):
            pu, pd = python_reps(client, a, args.reps)
            cu, cd = cpp_reps(env, args.mib, args.reps, args.cpp_preload)
            py_up += pu
            py_down += pd
            cpp_up += cu
            cpp_down += cd
            rounds.append((pu, pd, cu, cd))
    cli = cli_reps(env, a, args.reps) if args.cli else None

    def gbs(times: List[float]) -> float:
        return nbytes / statistics.median(times) / 1e9

    def trip(up: List[float], down: List[float]) -> List[float]:
        return [u + d for u, d in zip(up, down)]

    n = args.reps * args.rounds
    print(f"| Client | Upload (median of {n}) | Download | Round trip |")
    print("|---|---|---|---|")
    rows = [("Python (tessera package)", py_up, py_down),
            ("C++ (tessera::Client, in process)", cpp_up, cpp_down)]
    if cli:
        rows.append(("CLI (`tessera tensor put/get`)", cli[0], cli[1]))
    for name, up, down in rows:
        rt = trip(up, down)
        print(f"| {name} | {median_ms(up):.0f} ms ({gbs(up):.2f} GB/s) | "
              f"{median_ms(down):.0f} ms ({gbs(down):.2f} GB/s) | "
              f"{median_ms(rt):.0f} ms ({gbs(rt) * 2:.2f} GB/s) |")

    def ratio(cpp: List[float], py: List[float]) -> float:
        return statistics.median(cpp) / statistics.median(py)

    print()
    for i, (pu, pd, cu, cd) in enumerate(rounds):
        print(f"round {i + 1}: Python / C++ throughput: upload {ratio(cu, pu):.2f}x, download "
              f"{ratio(cd, pd):.2f}x, round trip {ratio(trip(cu, cd), trip(pu, pd)):.2f}x")
    print(f"all rounds: Python / C++ throughput: upload {ratio(cpp_up, py_up):.2f}x, "
          f"download {ratio(cpp_down, py_down):.2f}x, round trip "
          f"{ratio(trip(cpp_up, cpp_down), trip(py_up, py_down)):.2f}x")
    # On a loaded machine the fastest of many transfers is the best estimate of each one's
    # own cost; medians include whatever else ran meanwhile.
    print(f"fastest of each: Python / C++ throughput: upload {min(cpp_up) / min(py_up):.2f}x, "
          f"download {min(cpp_down) / min(py_down):.2f}x, round trip "
          f"{min(trip(cpp_up, cpp_down)) / min(trip(py_up, py_down)):.2f}x "
          f"(Python {min(py_up) * 1e3:.0f} / {min(py_down) * 1e3:.0f} ms, C++ "
          f"{min(cpp_up) * 1e3:.0f} / {min(cpp_down) * 1e3:.0f} ms)")


def region_bench(args: argparse.Namespace, server: conftest.Server, key: str,
                 a: np.ndarray) -> None:
    nbytes = a.nbytes
    times: Dict[str, List[float]] = {}

    def timed(name: str, fn: Callable[[], object]) -> object:
        t0 = time.perf_counter()
        out = fn()
        times.setdefault(name, []).append(time.perf_counter() - t0)
        return out

    region = tessera.Client(server.unix_addr, token=key)
    streams = tessera.Client(server.unix_addr, token=key, regions=False)
    tcp = tessera.Client(server.addr, token=key)
    try:
        t0 = time.perf_counter()
        first = region.put(a)
        first_put = time.perf_counter() - t0
        first.delete()
        assert region.uses_regions, "the region could not be registered (see the log)"
        dst = np.empty_like(a)
        np.copyto(dst, a)
        for _ in range(args.reps * args.rounds):
            timed("numpy: a.copy()", a.copy)
            timed("numpy: np.copyto(existing, a)", lambda: np.copyto(dst, a))
            t = timed("region: put", lambda: region.put(a))
            b = timed("region: get (copy=True)", lambda: region.get(t))
            assert np.array_equal(a, b)
            del b
            v = timed("region: get (copy=False)", lambda: region.get(t, copy=False))
            assert np.array_equal(a, v)
            del v
            t.delete()
            for name, c in (("unix socket, streams", streams), ("TCP, streams", tcp)):
                s = timed(f"{name}: put", lambda: c.put(a))
                b = timed(f"{name}: get", lambda: c.get(s))
                assert np.array_equal(a, b)
                del b
                s.delete()
    finally:
        for c in (region, streams, tcp):
            c.close()
    base = statistics.median(times["numpy: a.copy()"])
    print(f"{args.mib} MiB f32 on the Unix socket, {args.reps * args.rounds} of each")
    print()
    fastest = min(times["numpy: a.copy()"])
    print("| Transfer | Time (median) | Throughput | vs a.copy() | Fastest | vs a.copy()'s |")
    print("|---|---|---|---|---|---|")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| {name} | {med * 1e3:.1f} ms | {nbytes / med / 1e9:.2f} GB/s | "
              f"{med / base:.2f}x | {min(ts) * 1e3:.1f} ms | {min(ts) / fastest:.2f}x |")
    print(f"\nfirst put through a new region (BeginRegion, descriptor, FinishRegion, the "
          f"region's pages touched the first time): {first_put * 1e3:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5, help="transfers per round")
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds of Python then C++ transfers")
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--regions", action="store_true",
                        help="time regions over the Unix socket (no C++ or CLI)")
    parser.add_argument("--no-cli", dest="cli", action="store_false")
    parser.add_argument("--grpcio", action="store_true",
                        help="time the package's transfers through grpcio (native=False) "
                             "instead of tessera._native")
    parser.add_argument("--cpp-preload", default="",
                        help="LD_PRELOAD for the C++ bench, e.g. libtcmalloc_minimal.so.4: "
                             "its allocator then keeps freed chunks mapped, as the Python "
                             "client's mallopt does")
    args = parser.parse_args()
    nbytes = args.mib * MIB
    a = np.random.default_rng(0).standard_normal(nbytes // 4).astype(np.float32)
    server = conftest.Server(unix_socket=True)
    try:
        with tessera.Admin(server.addr, token=server.admin_token) as admin:
            _, key = admin.register("bench", memory_bytes=4 * nbytes)
        if args.regions:
            region_bench(args, server, key, a)
        else:
            tcp_bench(args, server, key, a)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
