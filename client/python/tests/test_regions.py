"""Shared-memory regions over the Unix socket (docs/api.md, "Clients on the same node"): the
Client's own use of them (docs/python.md, "The Unix socket and regions"), and the hand-over
implemented by hand from docs/api.md alone, with every refusal it documents."""
from __future__ import annotations

import fcntl
import gc
import logging
import mmap
import os
import socket
import tempfile
import time
from typing import Iterator, List, Sequence, Tuple

import grpc
import numpy as np
import pytest

import tessera
from conftest import Server, connect, run_in_threads
from tessera import _regions
from tessera._proto import compute_pb2 as pb
from tessera._proto import compute_pb2_grpc

MIB = 1 << 20
DTYPES = [np.float32, np.float16, np.float64, np.int32, np.int64, np.uint8, np.bool_]


def region_handles(server: Server, key: str) -> List[str]:
    """The tenant's regions as the server lists them (asked without a region of its own)."""
    with tessera.Client(server.unix_addr, token=key, regions=False) as c:
        return [r.handle for r in c._call(c._stub.ListRegions, pb.ListRegionsRequest()).regions]


@pytest.fixture
def unix_client(server: Server, tenant: Tuple[str, str]) -> Iterator[tessera.Client]:
    with connect(server, tenant[1], "unix-region") as c:
        yield c


# ---- the Client ----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(0,), (3, 0, 2), (), (7,), (300, 5), (3 * MIB // 8 + 3,)])
def test_round_trips_through_the_region(unix_client: tessera.Client, dtype: type,
                                        shape: Tuple[int, ...]) -> None:
    a = (np.arange(int(np.prod(shape))).reshape(shape) % 251).astype(dtype)
    t = unix_client.put(a)
    assert t.shape == shape and t.size_bytes == a.nbytes
    for b in (t.numpy(), unix_client.get(t.handle), unix_client.get(t, copy=False)):
        assert b.dtype == a.dtype and b.shape == a.shape
        np.testing.assert_array_equal(a, b)
    assert unix_client.uses_regions and unix_client._regions.region is not None
    assert unix_client.usage().regions == 1


def test_regions_and_streams_see_the_same_tensors(server: Server, tenant: Tuple[str, str],
                                                  unix_client: tessera.Client) -> None:
    a = np.random.default_rng(0).standard_normal((64, 33)).astype(np.float32)
    with connect(server, tenant[1], "tcp") as tcp:
        np.testing.assert_array_equal(tcp.get(unix_client.put(a).handle), a)
        np.testing.assert_array_equal(unix_client.get(tcp.put(2 * a).handle), 2 * a)
    y = unix_client.run("scale", unix_client.put(a), alpha=3.0)
    np.testing.assert_allclose(unix_client.get(y), 3 * a, rtol=1e-6)


def test_the_region_grows_and_the_old_one_is_unregistered(
        server: Server, tenant: Tuple[str, str], unix_client: tessera.Client) -> None:
    regions = unix_client._regions
    unix_client.put(np.ones(10, np.float32))
    first = regions.region
    assert first is not None and first.size == _regions.MIN_REGION_BYTES
    a = np.arange(3 * MIB // 4, dtype=np.float32)  # 3 MiB: a region of 4 MiB
    t = unix_client.put(a)
    second = regions.region
    assert second is not None and second.size == 4 * MIB and second.handle != first.handle
    assert region_handles(server, tenant[1]) == [second.handle]
    np.testing.assert_array_equal(t.numpy(), a)
    assert regions.region is second  # reused while it is big enough
    # A download grows it too: 20 MiB made on the server, read through a 32 MiB region.
    big = unix_client.run("fill", value=1.5, dtype="f32", shape=[5 * MIB])
    np.testing.assert_array_equal(unix_client.get(big), np.full(5 * MIB, 1.5, np.float32))
    third = regions.region
    assert third is not None and third.size == 32 * MIB
    usage = unix_client.usage()
    assert usage.regions == 1 and usage.region_bytes == 32 * MIB
    assert usage.region_quota_bytes == 256 * MIB  # default: the tenant's device memory
    assert region_handles(server, tenant[1]) == [third.handle]


def test_copy_false_views_the_region_until_the_next_transfer(
        unix_client: tessera.Client) -> None:
    a = np.arange(1000, dtype=np.int32)
    ta, tb = unix_client.put(a), unix_client.put(2 * a)
    view = unix_client.get(ta, copy=False)
    np.testing.assert_array_equal(view, a)
    assert not view.flags.writeable
    region = unix_client._regions.region
    assert region is not None and np.shares_memory(view, region.array(region.size))
    kept = unix_client.get(ta)  # copy=True: the caller's own array
    assert kept.flags.writeable and not np.shares_memory(kept, region.array(region.size))
    # The documented rule: the next transfer through the client reuses the region.
    unix_client.get(tb, copy=False)
    np.testing.assert_array_equal(view, 2 * a)
    np.testing.assert_array_equal(kept, a)
    # A region replaced by a bigger one, and close(), leave views mapped (never freed under
    # them); the old region is no longer written.
    unix_client.put(np.zeros(2 * MIB, np.uint8))
    assert unix_client._regions.region is not region
    unix_client.close()
    np.testing.assert_array_equal(view, 2 * a)


def test_copy_false_over_tcp_is_the_callers_array(client: tessera.Client) -> None:
    a = np.arange(10, dtype=np.float64)
    b = client.get(client.put(a), copy=False)
    np.testing.assert_array_equal(b, a)
    assert b.flags.writeable and not client.uses_regions


def test_regions_off(server: Server, tenant: Tuple[str, str],
                     monkeypatch: pytest.MonkeyPatch) -> None:
    a = np.arange(5000, dtype=np.float32)

    def round_trip(c: tessera.Client) -> None:
        np.testing.assert_array_equal(c.get(c.put(a)), a)

    with tessera.Client(server.unix_addr, token=tenant[1], regions=False) as c:
        round_trip(c)
        assert not c.uses_regions and c.usage().regions == 0
    monkeypatch.setenv("TESSERA_REGIONS", "0")
    with tessera.Client(server.unix_addr, token=tenant[1]) as c:
        round_trip(c)
        assert not c.uses_regions and c.usage().regions == 0
    with tessera.Client(server.unix_addr, token=tenant[1], regions=True) as c:  # wins over env
        round_trip(c)
        assert c.uses_regions and c.usage().regions == 1
    monkeypatch.delenv("TESSERA_REGIONS")
    with tessera.Client(server.addr, token=tenant[1], regions=True) as c:  # TCP: never
        round_trip(c)
        assert not c.uses_regions and c.usage().regions == 0
    assert region_handles(server, tenant[1]) == []


def test_close_and_garbage_collection_unregister_the_region(server: Server,
                                                            tenant: Tuple[str, str]) -> None:
    with connect(server, tenant[1], "unix-region") as c:
        c.put(np.ones(8, np.float32))
        assert c.usage().regions == 1
    assert region_handles(server, tenant[1]) == []
    c = connect(server, tenant[1], "unix-region")
    c.put(np.ones(8, np.float32))
    assert len(region_handles(server, tenant[1])) == 1
    del c  # never closed: the finalizer unregisters it
    gc.collect()
    assert region_handles(server, tenant[1]) == []


def test_a_region_the_server_forgot_is_replaced(server: Server, tenant: Tuple[str, str],
                                                unix_client: tessera.Client) -> None:
    unix_client.put(np.ones(8, np.float32))
    old = unix_client._regions.region
    assert old is not None
    with tessera.Client(server.unix_addr, token=tenant[1], regions=False) as other:
        other._call(other._stub.UnregisterRegion, pb.UnregisterRegionRequest(handle=old.handle))
    a = np.arange(100, dtype=np.int64)
    np.testing.assert_array_equal(unix_client.put(a).numpy(), a)
    new = unix_client._regions.region
    assert new is not None and new.handle != old.handle
    assert region_handles(server, tenant[1]) == [new.handle]
    # A tensor that is not there is the caller's NotFound, not a lost region.
    gone = unix_client.put(a)
    gone.delete()
    with pytest.raises(tessera.NotFound):
        gone.numpy()
    assert unix_client._regions.region is new


def test_a_region_past_the_quota_sends_that_transfer_to_the_streams(
        server: Server, admin: tessera.Admin, caplog: pytest.LogCaptureFixture) -> None:
    tenant, key = admin.register("regions-small", memory_bytes=64 * MIB, max_region_bytes=MIB)
    try:
        assert tenant.quota.max_region_bytes == MIB
        with connect(server, key, "unix-region") as c:
            small = np.arange(100, dtype=np.float32)
            np.testing.assert_array_equal(c.put(small).numpy(), small)
            assert c.usage().region_quota_bytes == MIB
            big = np.arange(2 * MIB // 4, dtype=np.float32)  # 2 MiB: no region fits
            with caplog.at_level(logging.WARNING, logger="tessera"):
                t = c.put(big)
                np.testing.assert_array_equal(t.numpy(), big)
            assert "no region of" in caplog.text and "max_region_bytes" in caplog.text
            assert c.uses_regions  # only transfers that large use the streams
            np.testing.assert_array_equal(c.put(small).numpy(), small)
            assert c.usage().regions == 1
    finally:
        admin.deregister("regions-small")


def test_a_descriptor_socket_it_cannot_reach_turns_regions_off(
        server: Server, tenant: Tuple[str, str], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(_regions, "_descriptor_socket",
                        lambda ours, theirs: os.path.join(server.state_dir, "nothing.regions"))
    with caplog.at_level(logging.WARNING, logger="tessera"):
        with connect(server, tenant[1], "unix-region") as c:
            a = np.arange(64, dtype=np.uint8)
            np.testing.assert_array_equal(c.put(a).numpy(), a)
            assert not c.uses_regions
            np.testing.assert_array_equal(c.get(c.put(a), copy=False), a)
    assert "regions are off for this client" in caplog.text
    assert region_handles(server, tenant[1]) == []


def test_a_server_without_a_descriptor_socket_turns_regions_off(
        caplog: pytest.LogCaptureFixture) -> None:
    # Regions need a unix: address, whose server always has a descriptor socket; this drives
    # the Client's region logic against a server without one, over TCP.
    plain = Server()
    try:
        with tessera.Admin(plain.addr, token=plain.admin_token) as admin:
            _, key = admin.register("no-socket", memory_bytes=16 * MIB)
        with tessera.Client(plain.addr, token=key) as c:
            regions = _regions.Regions(c._call, c._stub, "/nonexistent.sock")
            with caplog.at_level(logging.WARNING, logger="tessera"):
                assert regions.run(100, lambda region: region) is None
            assert not regions.enabled
            assert "FailedPrecondition" in caplog.text and "unix_socket" in caplog.text
            regions.close()
    finally:
        plain.stop()


def test_threads_share_one_client(unix_client: tessera.Client) -> None:
    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(15):
            a = rng.standard_normal(int(rng.integers(0, 300_000))).astype(np.float32)
            np.testing.assert_array_equal(unix_client.get(unix_client.put(a)), a)

    run_in_threads(work, 4)
    assert unix_client.usage().regions == 1


# ---- the hand-over by hand, as docs/api.md describes it ----------------------------------

class Raw:
    """The generated stub on the Unix socket with the tenant's key: nothing of the package."""

    def __init__(self, server: Server, key: str) -> None:
        self.channel = grpc.insecure_channel(server.unix_addr)
        self.stub = compute_pb2_grpc.ComputeStub(self.channel)
        self.metadata = (("authorization", f"Bearer {key}"),)
        self.descriptor_socket = server.unix_path + ".regions"

    def __getattr__(self, rpc: str):  # type: ignore[no-untyped-def]
        method = getattr(self.stub, rpc)
        return lambda request: method(request, metadata=self.metadata, timeout=30)

    def send(self, line: bytes, fds: Sequence[int]) -> str:
        """Sends ``line`` with ``fds`` (SCM_RIGHTS) on the descriptor socket; the answer line
        without its newline."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(30)
            s.connect(self.descriptor_socket)
            socket.send_fds(s, [line], list(fds))
            reply = b""
            while True:  # the server answers one line and closes the connection
                data = s.recv(4096)
                if not data:
                    break
                reply += data
        assert reply.endswith(b"\n") and reply.count(b"\n") == 1, reply
        return reply[:-1].decode()


@pytest.fixture
def raw(server: Server, tenant: Tuple[str, str]) -> Iterator[Raw]:
    r = Raw(server, tenant[1])
    yield r
    r.channel.close()


def sealed_memfd(size: int, seals: int = fcntl.F_SEAL_SHRINK) -> int:
    fd = os.memfd_create("tessera-doc-test", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


def test_the_hand_over_by_hand(raw: Raw, server: Server) -> None:
    size = 2 * MIB
    # 1. The memory, sealed against shrinking, mapped.
    fd = os.memfd_create("tessera-doc-test", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    memory = mmap.mmap(fd, size)
    # 2. A ticket.
    ticket = raw.BeginRegion(pb.BeginRegionRequest(size_bytes=size))
    assert ticket.ticket.startswith("rt_") and len(ticket.ticket) == 3 + 43
    assert ticket.socket_path == raw.descriptor_socket and ticket.size_bytes == size
    assert 50 <= ticket.expire_time.seconds - time.time() <= 61
    # 3. The descriptor, with the ticket and a newline, in one message.
    assert raw.send(ticket.ticket.encode() + b"\n", [fd]) == "OK"
    os.close(fd)  # the mapping is enough from here on
    # 4. The region.
    region = raw.FinishRegion(pb.FinishRegionRequest(ticket=ticket.ticket))
    assert region.handle.startswith("rg_") and region.size_bytes == size
    # Tensors through it: an upload from offset 4096, a range of it back at offset 100.
    a = np.arange(1000, dtype=np.float32)
    memory[4096:4096 + a.nbytes] = a.tobytes()
    info = raw.WriteTensorFromRegion(pb.WriteTensorFromRegionRequest(
        create=pb.TensorSpec(dtype=pb.DTYPE_F32, shape=[1000]), region=region.handle,
        offset=4096))
    assert info.size_bytes == a.nbytes
    read = raw.ReadTensorIntoRegion(pb.ReadTensorIntoRegionRequest(
        handle=info.handle, offset=8, length=16, region=region.handle, region_offset=100))
    assert read.bytes == 16 and read.info.handle == info.handle
    np.testing.assert_array_equal(np.frombuffer(memory, np.float32, 4, 100), a[2:6])
    # Replaced whole from another range of the region.
    memory[0:a.nbytes] = (-a).tobytes()
    raw.WriteTensorFromRegion(pb.WriteTensorFromRegionRequest(
        handle=info.handle, region=region.handle, length=a.nbytes))
    raw.ReadTensorIntoRegion(pb.ReadTensorIntoRegionRequest(
        handle=info.handle, region=region.handle, region_offset=MIB))
    np.testing.assert_array_equal(np.frombuffer(memory, np.float32, 1000, MIB), -a)
    listed = raw.ListRegions(pb.ListRegionsRequest()).regions
    assert [(r.handle, r.size_bytes, r.transfers) for r in listed] == [(region.handle, size, 0)]
    usage = raw.GetUsage(pb.GetUsageRequest())
    assert usage.regions == 1 and usage.region_bytes == size
    assert raw.UnregisterRegion(
        pb.UnregisterRegionRequest(handle=region.handle)).released_bytes == size
    with pytest.raises(grpc.RpcError) as e:
        raw.UnregisterRegion(pb.UnregisterRegionRequest(handle=region.handle))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert raw.GetUsage(pb.GetUsageRequest()).regions == 0
    memory.close()


def bad_descriptors(state_dir: str) -> Iterator[Tuple[str, int, str]]:
    """(what, descriptor, a word the refusal's message names it by) for each kind the server
    refuses with INVALID_ARGUMENT."""
    r, w = os.pipe()
    os.close(w)
    yield "a pipe", r, "pipe"
    with tempfile.NamedTemporaryFile(dir=state_dir) as f:
        f.truncate(MIB)
        yield "a regular file", os.open(f.name, os.O_RDWR), "not a memfd"
    yield "an unsealed memfd", sealed_memfd(MIB, seals=0), "not sealed against shrinking"
    yield ("a memfd sealed against writes",
           sealed_memfd(MIB, seals=fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_WRITE),
           "sealed against writes")
    yield "a memfd smaller than the ticket", sealed_memfd(MIB // 2), "524288"
    memfd = sealed_memfd(MIB)
    yield ("a read-only memfd", os.open(f"/proc/self/fd/{memfd}", os.O_RDONLY),
           "reading and writing")
    os.close(memfd)


def test_every_bad_descriptor_is_refused(raw: Raw, server: Server) -> None:
    for what, fd, reason in bad_descriptors(server.state_dir):
        ticket = raw.BeginRegion(pb.BeginRegionRequest(size_bytes=MIB)).ticket
        try:
            reply = raw.send(ticket.encode() + b"\n", [fd])
        finally:
            os.close(fd)
        assert reply.startswith("ERR INVALID_ARGUMENT the descriptor "), (what, reply)
        assert reason in reply, (what, reply)
        message = reply.split(" ", 2)[2]
        # FinishRegion returns the same refusal, once.
        with pytest.raises(grpc.RpcError) as e:
            raw.FinishRegion(pb.FinishRegionRequest(ticket=ticket))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, what
        assert e.value.details() == message, what
        with pytest.raises(grpc.RpcError) as e:
            raw.FinishRegion(pb.FinishRegionRequest(ticket=ticket))
        assert e.value.code() == grpc.StatusCode.NOT_FOUND, what
        # The package maps the same line to its error class.
        error = _regions.parse_reply(reply.encode() + b"\n")
        assert isinstance(error, tessera.InvalidArgument) and error.message == message, what
    assert len(raw.ListRegions(pb.ListRegionsRequest()).regions) == 0


def test_tickets_are_used_once_and_only_by_their_tenant(raw: Raw, server: Server,
                                                        admin: tessera.Admin) -> None:
    fd = sealed_memfd(MIB)
    try:
        # A ticket nobody issued.
        reply = raw.send(b"rt_" + b"A" * 43 + b"\n", [fd])
        assert reply.startswith("ERR UNAUTHENTICATED "), reply
        assert isinstance(_regions.parse_reply(reply.encode()), tessera.Unauthenticated)
        ticket = raw.BeginRegion(pb.BeginRegionRequest(size_bytes=MIB)).ticket
        # Finished before a descriptor arrived.
        with pytest.raises(grpc.RpcError) as e:
            raw.FinishRegion(pb.FinishRegionRequest(ticket=ticket))
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        # No descriptor, or two.
        none = raw.send(ticket.encode() + b"\n", [])
        assert none.startswith("ERR INVALID_ARGUMENT ") and "one descriptor" in none, none
        ticket = raw.BeginRegion(pb.BeginRegionRequest(size_bytes=MIB)).ticket
        two = raw.send(ticket.encode() + b"\n", [fd, fd])
        assert two.startswith("ERR INVALID_ARGUMENT ") and "one descriptor" in two, two
        # Used twice.
        ticket = raw.BeginRegion(pb.BeginRegionRequest(size_bytes=MIB)).ticket
        assert raw.send(ticket.encode() + b"\n", [fd]) == "OK"
        again = raw.send(ticket.encode() + b"\n", [fd])
        assert again.startswith("ERR FAILED_PRECONDITION ") and "already used" in again
        error = _regions.parse_reply(again.encode() + b"\n")
        assert isinstance(error, tessera.FailedPrecondition) and "already used" in error.message
        # Another tenant cannot claim it; its own tenant can, once.
        _, other_key = admin.register("regions-thief", memory_bytes=16 * MIB)
        thief = Raw(server, other_key)
        try:
            with pytest.raises(grpc.RpcError) as e:
                thief.FinishRegion(pb.FinishRegionRequest(ticket=ticket))
            assert e.value.code() == grpc.StatusCode.NOT_FOUND
        finally:
            thief.channel.close()
            admin.deregister("regions-thief")
        region = raw.FinishRegion(pb.FinishRegionRequest(ticket=ticket))
        with pytest.raises(grpc.RpcError) as e:
            raw.FinishRegion(pb.FinishRegionRequest(ticket=ticket))
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        raw.UnregisterRegion(pb.UnregisterRegionRequest(handle=region.handle))
    finally:
        os.close(fd)
    # Sizes: zero, and past the tenant's quota (its 256 MiB of device memory by default).
    for size, code in ((0, grpc.StatusCode.INVALID_ARGUMENT),
                       (257 * MIB, grpc.StatusCode.RESOURCE_EXHAUSTED)):
        with pytest.raises(grpc.RpcError) as e:
            raw.BeginRegion(pb.BeginRegionRequest(size_bytes=size))
        assert e.value.code() == code, size


def test_the_package_maps_refusals_to_its_errors(raw: Raw) -> None:
    r, w = os.pipe()
    try:
        ticket = raw.BeginRegion(pb.BeginRegionRequest(size_bytes=MIB)).ticket
        with pytest.raises(tessera.InvalidArgument) as e:
            _regions.send_descriptor(raw.descriptor_socket, ticket, r)
        assert "pipe" in e.value.message
    finally:
        os.close(r)
        os.close(w)
    assert _regions.parse_reply(b"OK\n") is None
    assert isinstance(_regions.parse_reply(b"ERR RESOURCE_EXHAUSTED full\n"),
                      tessera.QuotaExceeded)
    odd = _regions.parse_reply(b"ERR NO_SUCH_CODE what\n")
    assert type(odd) is tessera.TesseraError and odd.message == "what"
    assert isinstance(_regions.parse_reply(b""), tessera.Unavailable)
    with pytest.raises(FileNotFoundError):
        _regions.send_descriptor(raw.descriptor_socket + ".missing", "rt_x", r)
