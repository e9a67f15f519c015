#!/usr/bin/env python3
"""RegisterTenant to the first kernel's result, p50/p99, on one server and in a fleet of two
nodes on etcd (registered through the node that does not become the home, so the call is
forwarded and the client follows the redirect): docs/benchmarks.md, "Fleet".

Then the cost of a forwarded call (docs/api.md, "Forwarding and redirects"): GetUsage and a
small Launch with wait (add of two 1024-element f32 tensors into an existing output), p50/p99
over --calls calls from a plain gRPC stub, sent to the tenant's home (the baseline) and to
the other node, which forwards them.

    TESSERA_SERVER_BINARY=build-ci/server/tessera-server \\
    PYTHONPATH=client/python:build-ci/client/python/gen \\
      python3 tests/bench/fleet_bench.py [--tenants=N] [--calls=N]
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import grpc
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "client", "python",
                                "tests"))
import tessera  # noqa: E402
from conftest import Server, free_port, start_etcd  # noqa: E402
from tessera._proto import compute_pb2 as pb  # noqa: E402
from tessera._proto import compute_pb2_grpc  # noqa: E402

TOKEN = "fleet-bench-admin-token-shared-by-every-node"


def register_to_first_kernel(admin_addr: str, tenants: int, prefix: str) -> list:
    x = np.ones(1024, dtype=np.float32)
    times = []
    with tessera.Admin(admin_addr, token=TOKEN) as admin:
        for i in range(tenants):
            start = time.perf_counter()
            _, key = admin.register(f"{prefix}-{i}", memory_bytes=16 << 20)
            with tessera.Client(admin_addr, token=key) as client:
                t = client.put(x)
                client.run("add", t, t).numpy()
            times.append((time.perf_counter() - start) * 1e3)
    return times


def call_latencies(addr: str, key: str, handles: tuple, calls: int) -> dict:
    """GetUsage and a waiting Launch from a plain stub at `addr` (no follow metadata), in ms."""
    x, out = handles
    metadata = (("authorization", f"Bearer {key}"),)
    launch = pb.LaunchRequest(kernel="add", inputs=[x, x], outputs=[pb.Output(handle=out)],
                              wait=True)
    channel = grpc.insecure_channel(addr)
    stub = compute_pb2_grpc.ComputeStub(channel)
    times: dict = {"GetUsage": [], "Launch wait=true": []}
    try:
        for _ in range(calls // 10):  # warm up: connections, caches
            stub.GetUsage(pb.GetUsageRequest(), metadata=metadata, timeout=10)
            stub.Launch(launch, metadata=metadata, timeout=10)
        for _ in range(calls):
            start = time.perf_counter()
            stub.GetUsage(pb.GetUsageRequest(), metadata=metadata, timeout=10)
            times["GetUsage"].append((time.perf_counter() - start) * 1e3)
            start = time.perf_counter()
            job = stub.Launch(launch, metadata=metadata, timeout=10)
            times["Launch wait=true"].append((time.perf_counter() - start) * 1e3)
            assert job.state == pb.JOB_STATE_SUCCEEDED, job
    finally:
        channel.close()
    return times


def forwarding_rows(nodes: list, calls: int) -> list:
    """The per-call cost of forwarding: the same calls sent to the home and to the other node."""
    with tessera.Admin(nodes[0].addr, token=TOKEN) as admin:
        _, key = admin.register("forwarded", memory_bytes=16 << 20)
    with tessera.Client(nodes[0].addr, token=key) as client:
        home = client.addr  # followed to the home
        x = client.put(np.ones(1024, dtype=np.float32))
        out = client.put(np.zeros(1024, dtype=np.float32))
        handles = (x.handle, out.handle)
    other = next(n.addr for n in nodes if n.addr != home)
    direct = call_latencies(home, key, handles, calls)
    through = call_latencies(other, key, handles, calls)
    rows = []
    for rpc in direct:
        d, f = np.array(direct[rpc]), np.array(through[rpc])
        rows.append(f"| {rpc} | {calls} | {np.percentile(d, 50):.3f} ms | "
                    f"{np.percentile(d, 99):.3f} ms | {np.percentile(f, 50):.3f} ms | "
                    f"{np.percentile(f, 99):.3f} ms | "
                    f"+{np.percentile(f, 50) - np.percentile(d, 50):.3f} ms |")
    return rows


def summary(name: str, times: list) -> str:
    a = np.array(times)
    return f"| {name} | {len(a)} | {np.percentile(a, 50):.1f} ms | {np.percentile(a, 99):.1f} ms |"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tenants", type=int, default=40)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    env = {"TESSERA_ADMIN_TOKEN": TOKEN}
    rows = []
    single = Server(env=env)
    try:
        register_to_first_kernel(single.addr, 3, "warm")
        rows.append(summary("one server", register_to_first_kernel(single.addr, args.tenants, "s")))
    finally:
        single.stop()
    data = tempfile.mkdtemp(prefix="tessera-fleet-bench-")
    etcd, url = start_etcd(data)
    nodes = []
    forwarded = []
    try:
        for name in ("a", "b"):
            nodes.append(Server(env=env, args=[f"--listen=127.0.0.1:{free_port()}",
                                               f"--fleet_etcd={url}", f"--node_name={name}",
                                               "--fleet_placement=spread"]))
        register_to_first_kernel(nodes[0].addr, 3, "warm")
        # Every other tenant is placed on b (spread), its registration forwarded and its
        # client redirected: the rows mix direct and forwarded ones as spread does.
        rows.append(summary("fleet of 2 on etcd, through node a (spread: half forwarded)",
                            register_to_first_kernel(nodes[0].addr, args.tenants, "f")))
        forwarded = forwarding_rows(nodes, args.calls)
    finally:
        for n in nodes:
            n.stop()
        etcd.kill()
        etcd.wait()
        shutil.rmtree(data, ignore_errors=True)
    print("| setup | tenants | RegisterTenant to first kernel p50 | p99 |")
    print("|---|---|---|---|")
    for r in rows:
        print(r)
    print()
    print("| call (plain stub) | calls | to the home p50 | p99 | through the other node p50 | "
          "p99 | forwarding p50 |")
    print("|---|---|---|---|---|---|---|")
    for r in forwarded:
        print(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
