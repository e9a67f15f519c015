"""The Python client in a fleet (docs/fleet.md): a tenant's key used at another node is
sent to the tenant's home, and the client follows it at connect time; a client that does
not follow has its calls forwarded there by the node."""
from __future__ import annotations

import shutil
import tempfile
from typing import Iterator

import numpy as np
import pytest

import tessera

from conftest import Server, free_port, start_etcd


@pytest.fixture
def etcd() -> Iterator[str]:
    data = tempfile.mkdtemp(prefix="tessera-py-etcd-")
    proc, client = start_etcd(data)
    try:
        yield client
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(data, ignore_errors=True)


def _node(etcd_url: str, name: str) -> Server:
    return Server(args=[f"--listen=127.0.0.1:{free_port()}", f"--fleet_etcd={etcd_url}",
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
        # A client that does not follow the redirect stays at b, which forwards its calls to
        # the home: uploads and downloads streamed in several chunks included.
        with tessera.Client(b.addr, token=key, follow_home=False) as stays:
            assert stays.addr == b.addr
            y = np.arange(3 << 18, dtype=np.float32)  # 3 MiB: three 1 MiB chunks
            t = stays.put(y, chunk_bytes=1 << 20)
            np.testing.assert_array_equal(t.numpy(), y)
            assert stays.usage() is not None
        # With --fleet_forward=false the node answers the redirect instead.
        c = Server(args=[f"--listen=127.0.0.1:{free_port()}", f"--fleet_etcd={etcd}",
                         "--node_name=c", "--fleet_lease_ttl=2s", "--fleet_forward=false"])
        try:
            with tessera.Client(c.addr, token=key, follow_home=False) as stays:
                with pytest.raises(tessera.TesseraError) as refused:
                    stays.usage()
                assert "lives on node a at " + a.addr in str(refused.value)
        finally:
            c.stop()
    finally:
        a.stop()
        b.stop()
