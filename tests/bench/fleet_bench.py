#!/usr/bin/env python3
"""RegisterTenant to the first kernel's result, p50/p99, on one server and in a fleet of two
nodes on etcd (registered through the node that does not become the home, so the call is
forwarded and the client follows the redirect): docs/benchmarks.md, "Fleet".

    TESSERA_SERVER_BINARY=build-ci/server/tessera-server \\
    PYTHONPATH=client/python:build-ci/client/python/gen \\
      python3 tests/bench/fleet_bench.py [--tenants=N]
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "client", "python",
                                "tests"))
import tessera  # noqa: E402
from conftest import Server, free_port, start_etcd  # noqa: E402

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


def summary(name: str, times: list) -> str:
    a = np.array(times)
    return f"| {name} | {len(a)} | {np.percentile(a, 50):.1f} ms | {np.percentile(a, 99):.1f} ms |"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tenants", type=int, default=40)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
