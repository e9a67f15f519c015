"""The Python client in a fleet (docs/fleet.md): a tenant's key used at another node is
sent to the tenant's home, and the client follows it at connect time; a client that does
not follow has its calls forwarded there by the node; a client follows a tenant that moves
while it is connected (drained with --move, or its node killed)."""
from __future__ import annotations

import shutil
import tempfile
import time
from typing import Iterator, Optional

import numpy as np
import pytest

import tessera

from tessera._proto import tenant_admin_pb2 as apb

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


def _wait_until_moved(tenant_id: str, to: Server, name: str, old: Optional[Server] = None,
                      limit: float = 10.0) -> bool:
    """Waits until ``to`` serves the tenant as its home and ``old`` (if given) forgot it."""
    deadline = time.monotonic() + limit
    with tessera.Admin(to.addr, token=to.admin_token) as admin:
        while time.monotonic() < deadline:
            try:
                moved = admin.get(tenant_id).home_node == name
            except tessera.TesseraError:
                moved = False
            if moved and old is not None:
                with tessera.Admin(old.addr, token=old.admin_token) as old_admin:
                    try:
                        old_admin.get(tenant_id)
                        moved = False
                    except tessera.NotFound:
                        pass
            if moved:
                return True
            time.sleep(0.1)
    return False


def test_a_client_follows_a_tenant_drained_to_another_node(etcd: str) -> None:
    a = _node(etcd, "a")
    b = None
    try:
        with tessera.Admin(a.addr, token=a.admin_token) as admin:
            _, key = admin.register("drifter", memory_bytes=64 << 20)
        b = _node(etcd, "b")
        with tessera.Client(a.addr, token=key) as client:
            assert client.addr == a.addr
            before = client.put(np.ones(8, dtype=np.float32))
            with tessera.Admin(b.addr, token=b.admin_token) as admin:
                admin._call("DrainNode", apb.DrainNodeRequest(name="a", move_tenants=True))
            assert _wait_until_moved("drifter", b, "b", old=a)
            # Streamed in three chunks: refused by a before it ran, sent again to b.
            y = np.arange(3 << 18, dtype=np.float32)
            t = client.put(y, chunk_bytes=1 << 20)
            assert client.addr == b.addr
            np.testing.assert_array_equal(t.numpy(), y)
            assert client.usage().tensors == 1
            with pytest.raises(tessera.NotFound) as gone:
                before.numpy()
            assert "moved to node b" in gone.value.message
    finally:
        a.stop()
        if b is not None:
            b.stop()


def test_a_client_finds_a_tenant_whose_home_was_killed(etcd: str) -> None:
    a = _node(etcd, "a")
    b = None
    try:
        with tessera.Admin(a.addr, token=a.admin_token) as admin:
            _, key = admin.register("survivor", memory_bytes=64 << 20)
        b = _node(etcd, "b")
        with tessera.Client(b.addr, token=key) as client:
            assert client.addr == a.addr
            before = client.put(np.ones(8, dtype=np.float32))
            a.proc.kill()
            a.proc.wait()
            killed = time.monotonic()
            unavailable = 0
            while True:
                try:
                    client.usage()
                    break
                except tessera.Unavailable:
                    unavailable += 1
                    assert time.monotonic() - killed < 2 + 5, "not served again in time"
                    time.sleep(0.1)
            assert unavailable > 0
            assert client.addr == b.addr
            with pytest.raises(tessera.NotFound) as gone:
                before.numpy()
            assert "moved to node b" in gone.value.message
            x = np.arange(6, dtype=np.float32)
            np.testing.assert_array_equal(client.put(x).numpy(), x)
    finally:
        a.stop()
        if b is not None:
            b.stop()
