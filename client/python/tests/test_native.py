"""Bulk transfers through the C++ client library (tessera._native) against a real server: the
same bytes, errors and deadlines as through grpcio. The transport-parametrized tests of
test_client.py run both paths too ("tcp" and "tcp-grpcio")."""
from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

import tessera
from tessera import client as client_module
from conftest import FAKE_CUDA_DIR, Server, run_in_threads

native = client_module._native

# ctest sets TESSERA_EXPECT_NATIVE=1 where the build made the module, so that CI cannot lose it
# silently; elsewhere (a package without the build) these tests are skipped.
if os.environ.get("TESSERA_EXPECT_NATIVE") == "1":
    assert native is not None, "tessera._native was built but does not import"
pytestmark = pytest.mark.skipif(native is None, reason="tessera._native is not built")


def test_on_by_default_and_off_on_request(server, tenant, monkeypatch) -> None:
    with tessera.Client(server.addr, token=tenant[1]) as c:
        assert c.uses_native
    with tessera.Client(server.addr, token=tenant[1], native=False) as c:
        assert not c.uses_native
    monkeypatch.setenv(client_module.ENV_NATIVE, "0")
    with tessera.Client(server.addr, token=tenant[1]) as c:
        assert not c.uses_native
    with tessera.Client(server.addr, token=tenant[1], native=True) as c:
        assert c.uses_native


def test_the_same_bytes_both_ways(server, tenant) -> None:
    rng = np.random.default_rng(7)
    with tessera.Client(server.addr, token=tenant[1]) as fast, \
            tessera.Client(server.addr, token=tenant[1], native=False) as slow:
        for shape, dtype in [(((5 << 20) // 4 + 3,), np.float32), ((700, 3000), np.int64),
                             (((4 << 20) + 1,), np.uint8), ((1024, 2049), np.float16)]:
            a = (rng.standard_normal(shape) * 100).astype(dtype)
            # Native up, grpcio down; grpcio up, native down; small chunks, many messages.
            t = fast.put(a, chunk_bytes=64 << 10)
            np.testing.assert_array_equal(slow.get(t.handle), a)
            u = slow.put(a)
            got = fast.get(u.handle)
            assert got.dtype == a.dtype and got.shape == a.shape and got.flags.writeable
            np.testing.assert_array_equal(got, a)
            np.testing.assert_array_equal(fast.get(t), a)
            t.delete()
            u.delete()
        # A non-contiguous array is made contiguous first; bf16 bits go as they are.
        b = rng.standard_normal((2048, 2048)).astype(np.float32)[:, ::2]
        np.testing.assert_array_equal(fast.put(b).numpy(), b)
        bits = rng.integers(0, 1 << 16, 5 << 20, dtype=np.uint16)
        h = fast.put(bits, dtype="bf16")
        assert h.dtype == "bf16"
        np.testing.assert_array_equal(fast.get(h), bits)


def test_errors_and_deadlines_as_through_grpcio(server, admin, tenant) -> None:
    with tessera.Client(server.addr, token=tenant[1]) as fast, \
            tessera.Client(server.addr, token=tenant[1], native=False) as slow:
        with pytest.raises(tessera.NotFound) as native_error:
            fast.get("t_no_such_tensor")
        with pytest.raises(tessera.NotFound) as grpcio_error:
            slow.get("t_no_such_tensor")
        assert native_error.value.message == grpcio_error.value.message
        # The tenant's 256 MiB memory quota, refused with the server's message.
        with pytest.raises(tessera.QuotaExceeded) as over:
            fast.put(np.zeros(300 << 20, np.uint8))
        assert "quota" in over.value.message
        # A deadline set after the first transfer applies to the next ones.
        t = fast.put(np.ones(6 << 20, np.float32))
        fast.timeout = 1e-6
        with pytest.raises(tessera.DeadlineExceeded):
            t.numpy()
        with pytest.raises(tessera.DeadlineExceeded):
            fast.put(np.ones(6 << 20, np.float32))
        fast.timeout = None
        np.testing.assert_array_equal(t.numpy(), np.ones(6 << 20, np.float32))
    with tessera.Client(server.addr, token="tsk_nobody.bad") as bad:
        with pytest.raises(tessera.Unauthenticated):
            bad.get("t_x")
    # The retry hint of a tenant past its calls per second.
    _, key = admin.register("native-rate", memory_bytes=64 << 20, max_requests_in_flight=1,
                            requests_per_second=2)
    with tessera.Client(server.addr, token=key) as c:
        t = c.put(np.ones(4, np.float32))
        with pytest.raises(tessera.QuotaExceeded) as e:
            for _ in range(4):
                t.numpy()
        assert e.value.retry_after is not None and 0 < e.value.retry_after <= 1.0
    admin.deregister("native-rate")


def test_the_channel_directly(server, tenant) -> None:
    # What the package relies on: `allocate`'s exception is raised and the call cancelled, a
    # buffer too small is refused, the channel goes on working, and close() ends it.
    with tessera.Client(server.addr, token=tenant[1], native=False) as c:
        handle = c.put(np.arange(1 << 20, dtype=np.int32)).handle
    channel = native.Channel(server.addr, tenant[1], False, None, None, None, 30.0, True)

    class Refused(Exception):
        pass

    def refuse(n: int) -> bytearray:
        raise Refused(str(n))

    with pytest.raises(Refused, match=str(4 << 20)):
        channel.download(handle, 1 << 20, refuse)
    with pytest.raises(native.Error) as small:
        channel.download(handle, 1 << 20, lambda n: bytearray(n - 1))
    assert small.value.args[0] == 3  # INVALID_ARGUMENT
    raw, buf = channel.download(handle, 1 << 20, bytearray)
    assert np.array_equal(np.frombuffer(buf, np.int32), np.arange(1 << 20, dtype=np.int32))
    with pytest.raises(TypeError):
        channel.download(handle, 1 << 20, "not callable")
    with pytest.raises(native.Error) as bad_spec:
        channel.upload(b"\xff\xff", b"1234", 4)
    assert bad_spec.value.args[0] == 3
    channel.close()
    with pytest.raises(ValueError, match="closed"):
        channel.download(handle, 1 << 20, bytearray)


def test_downloads_on_several_threads_and_close(server, tenant) -> None:
    arrays = [np.random.default_rng(seed).standard_normal(3 << 20).astype(np.float32)
              for seed in range(3)]
    c = tessera.Client(server.addr, token=tenant[1])
    tensors = [c.put(a) for a in arrays]
    started = time.monotonic()

    def download(i: int) -> None:
        for _ in range(4):
            np.testing.assert_array_equal(tensors[i].numpy(), arrays[i])

    run_in_threads(download, 3)
    assert time.monotonic() - started < 120
    conn = c._conn
    assert conn.native is not None
    c.close()
    assert conn.native is None


def test_closed_clients_and_odd_arguments(server, tenant) -> None:
    c = tessera.Client(server.addr, token=tenant[1])
    t = c.put(np.ones(3 << 20, np.float32))
    c.close()
    with pytest.raises(ValueError):
        c.get(t.handle)
    with pytest.raises(ValueError):
        c.put(np.ones(3 << 20, np.float32))
    channel = native.Channel(server.addr, tenant[1], False, None, None, None, 30.0, True)
    for chunk in (-1, 1 << 32):
        with pytest.raises(native.Error) as e:
            channel.download("t_x", chunk, bytearray)
        assert e.value.args[0] == 3 and "chunk_bytes" in e.value.args[1]
    channel.close()
    # A message the server cut inside a character is still the server's error.
    with tessera.Client(server.addr, token=tenant[1]) as c:
        with pytest.raises(tessera.NotFound):
            c.get("x" + "\u00e9" * 100)


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                    reason="signals reach the main thread only")
def test_ctrl_c_interrupts_a_stalled_transfer(admin) -> None:
    # A server that stops answering (SIGSTOP) under a download with no deadline: Ctrl-C
    # (SIGINT) still ends it with KeyboardInterrupt, as through grpcio, and the client goes
    # on once the server does.
    own = Server()
    try:
        with tessera.Admin(own.addr, token=own.admin_token) as own_admin:
            _, key = own_admin.register("stalled", memory_bytes=64 << 20)
        with tessera.Client(own.addr, token=key) as c:
            t = c.put(np.arange(1 << 20, dtype=np.int32))
            np.testing.assert_array_equal(t.numpy(), np.arange(1 << 20, dtype=np.int32))
            os.kill(own.proc.pid, signal.SIGSTOP)
            timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
            started = time.monotonic()
            try:
                timer.start()
                with pytest.raises(KeyboardInterrupt):
                    t.numpy()
                assert time.monotonic() - started < 10
            finally:
                timer.cancel()
                os.kill(own.proc.pid, signal.SIGCONT)
            np.testing.assert_array_equal(t.numpy(), np.arange(1 << 20, dtype=np.int32))
    finally:
        os.kill(own.proc.pid, signal.SIGCONT)
        own.stop()


@pytest.mark.skipif(not FAKE_CUDA_DIR, reason="the CUDA module and fake driver are not built "
                    "(TESSERA_FAKE_CUDA_DIR unset)")
def test_on_the_cuda_module_over_the_fake_driver() -> None:
    # The same transfers against a server on the CUDA module (its staging and device copies,
    # on the fake driver), both paths.
    own = Server(backend="cuda")
    try:
        with tessera.Admin(own.addr, token=own.admin_token) as own_admin:
            assert own_admin.server_info().backend == "cuda"
            _, key = own_admin.register("on-cuda", memory_bytes=256 << 20)
        a = np.random.default_rng(3).standard_normal((1536, 1025)).astype(np.float32)
        with tessera.Client(own.addr, token=key) as fast, \
                tessera.Client(own.addr, token=key, native=False) as slow:
            t = fast.put(a, chunk_bytes=1 << 20)
            np.testing.assert_array_equal(slow.get(t.handle), a)
            np.testing.assert_array_equal(fast.get(slow.put(a).handle), a)
            np.testing.assert_array_equal(fast.run("add", t, t).numpy(), a + a)
    finally:
        own.stop()
