"""The package's own protobuf wire code for the bulk transfer messages (tessera/client.py
_write_chunk and _read_tensor_response) against protobuf's: the same bytes, the same fields."""
from __future__ import annotations

import pytest

import tessera
from tessera import client as tc
from tessera._proto import compute_pb2 as pb

CASES = [(0, b""), (0, b"x"), (127, b"ab"), (128, bytes(range(256)) * 3),
         ((1 << 40) + 5, b"\x00" * 70000), ((1 << 63) + 1, b"\xff" * 130)]


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
