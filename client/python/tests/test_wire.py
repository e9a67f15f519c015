"""The package's own protobuf wire code for the bulk transfer messages (tessera/client.py
_write_chunk, _write_requests and _read_tensor_response) against protobuf's: the same bytes,
the same fields; and the thread that writes WriteTensor's chunks ahead."""
from __future__ import annotations

import threading
import time

import pytest

import tessera
from tessera import client as tc
from tessera._proto import compute_pb2 as pb

CASES = [(0, b""), (0, b"x"), (127, b"ab"), (128, bytes(range(256)) * 3),
         ((1 << 40) + 5, b"\x00" * 70000), ((1 << 63) + 1, b"\xff" * 130),
         (2 << 20, b"\x5a" * ((2 << 20) + 1))]


@pytest.mark.parametrize("offset,data", CASES)
def test_a_chunk_is_encoded_as_protobuf_encodes_it(offset: int, data: bytes) -> None:
    want = pb.WriteTensorRequest(chunk=pb.Chunk(offset=offset, data=data)).SerializeToString()
    assert tc._write_chunk(offset, memoryview(data)) == want


@pytest.mark.parametrize("offset,data", CASES)
def test_a_read_response_is_decoded_as_protobuf_decodes_it(offset: int, data: bytes) -> None:
    info = pb.TensorInfo(handle="tn_x", dtype=pb.DTYPE_F32, shape=[2, 3], size_bytes=24)
    for message in (pb.ReadTensorResponse(info=info, chunk=pb.Chunk(offset=offset, data=data)),
                    pb.ReadTensorResponse(chunk=pb.Chunk(offset=offset, data=data))):
        got_info, got_offset, got_data = tc._read_tensor_response(message.SerializeToString())
        assert got_info == (message.info if message.HasField("info") else None)
        assert got_offset == offset
        assert bytes(got_data) == data


def test_unknown_fields_are_skipped_and_truncation_is_data_loss() -> None:
    raw = pb.ReadTensorResponse(chunk=pb.Chunk(offset=9, data=b"abc")).SerializeToString()
    # Unknown fields of every wire type before the known ones: varint, 64-bit, bytes, 32-bit.
    unknown = b"\x18\x96\x01" + b"\x21" + b"\x00" * 8 + b"\x2a\x02hi" + b"\x35" + b"\x00" * 4
    info, offset, data = tc._read_tensor_response(unknown + raw)
    assert info is None and offset == 9 and bytes(data) == b"abc"
    for cut in range(1, len(raw)):
        with pytest.raises(tessera.DataLoss):
            tc._read_tensor_response(raw[:cut])


def _parsed(messages: list) -> "tuple[pb.WriteTensorRequest, list[pb.Chunk]]":
    parsed = [pb.WriteTensorRequest.FromString(m) for m in messages]
    assert parsed[0].WhichOneof("kind") == "header"
    assert all(p.WhichOneof("kind") == "chunk" for p in parsed[1:])
    return parsed[0], [p.chunk for p in parsed[1:]]


@pytest.mark.parametrize("size,chunk", [(0, 4), (1, 4), (4, 4), (9, 4), (70001, 4096),
                                        ((3 << 20) + 7, 1 << 20)])
def test_write_requests_are_the_header_then_the_data_in_order(size: int, chunk: int) -> None:
    header = pb.WriteTensorRequest(header=pb.WriteHeader(
        create=pb.TensorSpec(dtype=pb.DTYPE_U8, shape=[size]))).SerializeToString()
    data = bytes(i % 251 for i in range(size))
    seen = []
    messages = list(tc._write_requests(header, memoryview(data), chunk,
                                       lambda done, total: seen.append((done, total))))
    first, chunks = _parsed(messages)
    assert first.header.create.shape == [size]
    assert [c.offset for c in chunks] == list(range(0, size, chunk))
    assert b"".join(c.data for c in chunks) == data
    assert all(len(c.data) == chunk for c in chunks[:-1])
    assert seen == [(min(o + chunk, size), size) for o in range(0, size, chunk)]


def _writers() -> int:
    return sum(t.name == "tessera-write-ahead" for t in threading.enumerate())


def _wait_for_no_writers() -> None:
    deadline = time.monotonic() + 10
    while _writers() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _writers() == 0


def test_write_requests_stop_their_writer_when_the_call_ends_early() -> None:
    # As when gRPC stops asking (an error, a redirect): the generator is closed mid-way.
    data = memoryview(bytes(1 << 20))
    requests = tc._write_requests(b"header", data, 1024, None)
    assert next(requests) == b"header"
    assert pb.WriteTensorRequest.FromString(next(requests)).chunk.offset == 0
    time.sleep(0.05)  # the writer is ahead, blocked on the full queue
    requests.close()
    _wait_for_no_writers()


def test_a_failure_in_the_writer_ends_the_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    real = tc._write_chunk

    def failing(offset: int, data: memoryview) -> bytes:
        if offset >= 8:
            raise MemoryError("no room")
        return real(offset, data)

    monkeypatch.setattr(tc, "_write_chunk", failing)
    requests = tc._write_requests(b"header", memoryview(bytes(32)), 4, None)
    assert [next(requests) for _ in range(3)][0] == b"header"
    with pytest.raises(MemoryError):
        next(requests)
    _wait_for_no_writers()
