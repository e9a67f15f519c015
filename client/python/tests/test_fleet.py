"""The Python client in a fleet (docs/fleet.md): a tenant's key used at another node is
sent to the tenant's home, and the client follows it at connect time."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from typing import Iterator

import numpy as np
import pytest

import tessera

from conftest import Server

ETCD = os.environ.get("TESSERA_ETCD", "/usr/bin/etcd")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def etcd() -> Iterator[str]:
    if not os.access(ETCD, os.X_OK):
        pytest.fail(f"etcd not found at {ETCD}: install etcd-server (deploy/install-deps.sh)")
    data = tempfile.mkdtemp(prefix="tessera-py-etcd-")
    client, peer = f"http://127.0.0.1:{_free_port()}", f"http://127.0.0.1:{_free_port()}"
    proc = subprocess.Popen(
        [ETCD, "--name=test", f"--data-dir={data}/etcd", f"--listen-client-urls={client}",
         f"--advertise-client-urls={client}", f"--listen-peer-urls={peer}",
         f"--initial-advertise-peer-urls={peer}", f"--initial-cluster=test={peer}",
         "--log-level=error"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        host, port = client[len("http://"):].split(":")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection((host, int(port)), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        yield client
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(data, ignore_errors=True)


def _node(etcd_url: str, name: str) -> Server:
    port = _free_port()
    return Server(args=[f"--listen=127.0.0.1:{port}", f"--fleet_etcd={etcd_url}",
                        f"--node_name={name}", "--fleet_lease_ttl=2s"])


def test_a_client_at_another_node_follows_the_tenant_home(etcd: str) -> None:
    a, b = _node(etcd, "a"), _node(etcd, "b")
    try:
        with tessera.Admin(a.addr, token=a.admin_token) as admin:
            _, key = admin.register("roamer", memory_bytes=64 << 20)
        with tessera.Client(b.addr, token=key) as client:
            assert client.addr == a.addr
            x = np.arange(12, dtype=np.float32).reshape(3, 4)
            np.testing.assert_array_equal(client.put(x).numpy(), x)
        with tessera.Client(b.addr, token=key, follow_home=False) as stays:
            assert stays.addr == b.addr
            with pytest.raises(tessera.TesseraError) as refused:
                stays.usage()
            assert "lives on node a at " + a.addr in str(refused.value)
    finally:
        a.stop()
        b.stop()
